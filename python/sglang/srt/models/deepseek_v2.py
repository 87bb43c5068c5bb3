"""DeepSeek-V2 / V2-Lite / V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`): pre-norm
RMSNorm layers of multi-head latent attention (`layers/mla_attention.py`; the KV pool keeps one
latent per token) and an MLP that is dense for the first `first_k_dense_replace` layers and a
mixture of experts after:

    moe(x) = sum_k w_k * expert_k(x) + shared_experts(x)

with DeepSeek's router (`layers/deepseek_routing.py`: softmax and group-limited greedy for V2,
sigmoid scores with the correction bias and group top-k for V3, `routed_scaling_factor`,
`norm_topk_prob`), the routed experts stacked and run by `layers/moe.py`, and
`n_shared_experts` always-on experts in one gated MLP of `moe_intermediate_size * n_shared_experts`.

Checkpoints: HF names (`model.layers.{i}.self_attn.kv_a_proj_with_mqa`, `mlp.gate.weight`,
`mlp.experts.{e}.gate_proj.weight`, `mlp.shared_experts.*`); V3's multi-token-prediction layers
(`model.layers.{i}` with i >= num_hidden_layers) are not loaded.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, List, Optional, Tuple

import torch
from torch import nn

from sglang.srt.layers.deepseek_routing import DeepseekRouter, check_router_config, num_routed_experts
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import default_weight_loader
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.mla_attention import MLAAttention
from sglang.srt.layers.moe import EXPERT_WEIGHT, StackedExperts
from sglang.srt.layers.rotary_embedding import check_rope_config
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_loader.weight_loading import expected_weight_keys, load_weights_into
from sglang.srt.models.decoder import GatedMLP


def _cfg(config: Any, key: str, default=None):
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


def check_deepseek_config(config: Any, version: int) -> None:
    """Refuses, with one line naming the field, a config this model cannot compute as HF does
    (`config`: the HF config or config.json's dict; start-up calls it before spawning anything)."""
    check_rope_config(config)
    quant = _cfg(config, "quantization_config")
    if quant:  # e.g. DeepSeek-V3's released FP8 blocks: loading them as plain weights is garbage
        method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", "?")
        raise ValueError(f"config.json quantization_config (quant_method={method}) is not supported for "
                         "DeepSeek checkpoints; convert the weights to bf16 first")
    heads = int(_cfg(config, "num_attention_heads"))
    if int(_cfg(config, "num_key_value_heads", None) or heads) != heads:
        raise ValueError("config.json num_key_value_heads must equal num_attention_heads for MLA models")
    if num_routed_experts(config) > 0:
        check_router_config(config, version)


class DeepseekMoE(nn.Module):
    def __init__(self, config: Any, version: int):
        super().__init__()
        self.gate = DeepseekRouter(config, version)
        self.experts = StackedExperts(num_routed_experts(config), config.hidden_size, config.moe_intermediate_size)
        shared = int(_cfg(config, "n_shared_experts", 0) or 0)
        self.shared_experts = (GatedMLP(config.hidden_size, config.moe_intermediate_size * shared)
                               if shared > 0 else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        out = self.experts(x, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, version: int, model_config=None):
        super().__init__()
        interleaved = True if version == 2 else bool(_cfg(config, "rope_interleave", True))
        self.self_attn = MLAAttention(config, layer_id, model_config, rope_interleaved=interleaved,
                                      rope_in_fp32=version == 2)
        if num_routed_experts(config) > 0 and layer_id >= int(_cfg(config, "first_k_dense_replace", 0) or 0):
            self.mlp = DeepseekMoE(config, version)
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions, h, residual, forward_batch):
        if residual is None:
            residual, h = h, self.input_layernorm(h)
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.self_attn(positions, h, forward_batch)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class DeepseekModel(nn.Module):
    def __init__(self, config: Any, version: int, model_config=None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DeepseekDecoderLayer(config, i, version, model_config)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids, positions, forward_batch, input_embeds=None) -> torch.Tensor:
        h = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        residual = None
        for layer in self.layers:
            h, residual = layer(positions, h, residual, forward_batch)
        h, _ = self.norm(h, residual)
        return h


_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


class DeepseekV2ForCausalLM(nn.Module):
    version = 2
    stacked_params_mapping: List[Tuple[str, str, Any]] = [
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    ]

    def __init__(self, config: Any, model_config=None):
        super().__init__()
        check_deepseek_config(config, self.version)
        self.config = config
        self.model_config = model_config
        self.model = DeepseekModel(config, self.version, model_config)
        self.tie_word_embeddings = bool(_cfg(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if self.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config)

    def forward(self, input_ids, positions, forward_batch, input_embeds=None) -> LogitsProcessorOutput:
        h = self.model(input_ids, positions, forward_batch, input_embeds)
        return self.logits_processor(input_ids, h, self.lm_head, forward_batch)

    def _canonical(self, name: str) -> Optional[str]:
        m = _LAYER_INDEX.match(name)
        if m is not None and int(m.group(1)) >= self.config.num_hidden_layers:
            return None  # V3's multi-token-prediction layer
        return name

    def _load_experts(self, params: dict, name: str, tensor: torch.Tensor) -> Optional[List[str]]:
        """Routed experts: one expert's projection, or HF's in-memory stacked [E, ...] tensors."""
        expert = EXPERT_WEIGHT.match(name)
        if expert is not None:
            module = self.get_submodule(expert.group(1))
            return [f"{expert.group(1)}:{module.load_expert_weight(int(expert.group(2)), expert.group(3), tensor)}"]
        if name.endswith(".experts.gate_up_proj") or name.endswith(".experts.down_proj"):
            default_weight_loader(params[name], tensor)
            module = self.get_submodule(name.rsplit(".", 1)[0])
            which = ("gate_proj", "up_proj") if name.endswith("gate_up_proj") else ("down_proj",)
            return [f"{name.rsplit('.', 1)[0]}:{w}:{e}" for w in which for e in range(module.num_experts)]
        return None

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> set:
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded = load_weights_into(self, weights, self.stacked_params_mapping, canonical=self._canonical,
                                   special=lambda name, tensor: self._load_experts(params, name, tensor),
                                   skip_merged=lambda name: ".experts." in name)
        for layer in self.model.layers:
            layer.self_attn.post_load_weights()
        return loaded

    def expected_weight_keys(self) -> set:
        out = expected_weight_keys(self, skip=lambda name: ".experts." in name)
        for name, module in self.named_modules():
            if isinstance(module, StackedExperts):
                out.update(f"{name}:{k}" for k in module.expected_keys())
        return out


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    version = 3


EntryClass = [DeepseekV2ForCausalLM, DeepseekV3ForCausalLM]
