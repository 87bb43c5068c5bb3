"""Triton versions of the gated delta rule ops in `sglang.srt.layers.gdn.torch_ops` (same signatures).

Importing turns Triton's interpreter on when no CUDA device exists (see triton_ops/__init__).
"""

from sglang.srt.layers.attention.triton_ops import use_interpreter_without_gpu

use_interpreter_without_gpu()
