"""Weight-only int8 (`--quantization w8a16_int8`, CPU): per-output-channel symmetric int8.

At load time every linear weight (and the LM head) gets `int8_weight = (q, scale)`: `scale[n] =
max|w[n, :]| / 127` and `q = round(w / scale)` in [-127, 127], computed from the checkpoint's own
weights (no calibration data). `sgl_kernel.linear` reads `q` and dequantizes in registers
(`q * scale`, fp32 accumulation), so decode streams a quarter of fp32's bytes (half of bf16's).
The float weights stay for batches beyond `cpu_ops.linear_max_rows(torch.int8)` rows (prefill),
which oneDNN multiplies faster than the small-M kernel; so the quantization error applies to decode.
Error: |w - q * scale| <= scale / 2 per weight (test/srt/layers/test_quantization.py).
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

METHOD = "w8a16_int8"


def quantize_per_channel_int8(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scale fp32 [N]) with weight ~= q * scale[:, None]."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def quantize_stack_int8(stack: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [E, N, K], scale fp32 [E, N]): each expert's weight as `quantize_per_channel_int8`."""
    E, N, K = stack.shape
    q, scale = quantize_per_channel_int8(stack.reshape(E * N, K))
    return q.reshape(E, N, K), scale.reshape(E, N)


def quantize_linear_weights_int8(model: nn.Module) -> int:
    """Gives each module with an `int8_weight` slot its quantized weight, and each MoE expert stack
    (`int8_experts` slot: layers/moe/experts.py) its quantized gate_up and down; returns how many."""
    count = 0
    for module in model.modules():
        if hasattr(module, "int8_weight") and isinstance(getattr(module, "weight", None), torch.Tensor) \
                and module.weight.dim() == 2:
            module.int8_weight = quantize_per_channel_int8(module.weight)
            count += 1
        elif hasattr(module, "int8_experts"):
            module.int8_experts = (*quantize_stack_int8(module.gate_up_proj), *quantize_stack_int8(module.down_proj))
            count += 1
    return count
