"""Qwen3-MoE: Qwen3's decoder (per-head q/k RMSNorm) whose sparse layers (`mlp_only_layers`,
`decoder_sparse_step`) hold experts with softmax top-k routing (`norm_topk_prob`), no shared
expert; `sliding_window` (with `use_sliding_window`) on every layer."""

from sglang.srt.layers.moe import MoeSpec
from sglang.srt.models.decoder import DecoderForCausalLM
from sglang.srt.models.qwen3 import QWEN3_SPEC


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    spec = QWEN3_SPEC.replace(window_all_layers=True, moe=MoeSpec(sparse_step=True))


EntryClass = Qwen3MoeForCausalLM
