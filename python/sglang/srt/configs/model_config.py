"""What the engine needs to know about a model, read from its HF `config.json`.

Only reads configuration: no weights, no torch. `check_server_args` uses it for the
model-dependent checks, the model runner for shapes, the cache factory for its choices.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import List, Optional

# Architectures whose layers mix attention with a Mamba2 (or other recurrent) state.
HYBRID_SSM_ARCHITECTURES = {
    "NemotronHForCausalLM",
    "FalconH1ForCausalLM",
    "BambaForCausalLM",
    "Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "GraniteMoeHybridForCausalLM",
    "JambaForCausalLM",
    "Zamba2ForCausalLM",
    "Mamba2ForCausalLM",
    "MambaForCausalLM",
    "FalconMambaForCausalLM",
    "Lfm2ForCausalLM",
    "KimiLinearForCausalLM",
}

# Dense decoder families (models/decoder.py declarations).
DENSE_ARCHITECTURES = {
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Phi3ForCausalLM",
    "PhiForCausalLM",
    "Olmo2ForCausalLM",
    "GraniteForCausalLM",
    "Starcoder2ForCausalLM",
    "StableLmForCausalLM",
    "SmolLM3ForCausalLM",
    "GlmForCausalLM",
    "Glm4ForCausalLM",
    "Exaone4ForCausalLM",
}

# Multi-head latent attention (DeepSeek-V2/V3): the KV pool keeps one compressed latent per token.
MLA_ARCHITECTURES = {
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
}

SUPPORTED_ARCHITECTURES = DENSE_ARCHITECTURES | MLA_ARCHITECTURES | {
    "NemotronHForCausalLM",
    "FalconH1ForCausalLM",
    "LlamaForSequenceClassification",
    "Qwen2ForSequenceClassification",
    "Qwen3ForSequenceClassification",
}


def num_labels_of(config) -> int:
    """HF's label count of a classification head: `id2label` when the config lists labels, else
    `num_labels` (default 2); `config` is a config.json dict or an HF config object."""
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    id2label = get("id2label")
    return len(id2label) if id2label else int(get("num_labels", 2) or 2)


def read_hf_config_dict(model_path: str) -> dict:
    path = os.path.join(model_path, "config.json")
    with open(path) as f:
        return json.load(f)


@dataclass
class ModelConfig:
    """Shapes and layer kinds of one model. Build it with `ModelConfig.from_path`."""

    model_path: str
    architecture: str
    hf_config: dict
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    context_len: int
    # Sliding-window attention: window size in tokens, and which layers use it.
    sliding_window_size: Optional[int] = None
    swa_layer_ids: List[int] = field(default_factory=list)
    full_attention_layer_ids: List[int] = field(default_factory=list)
    # Hybrid recurrent-state models (Mamba2 hybrids and friends).
    is_hybrid_ssm: bool = False
    # Layers that hold attention KV at all (a Mamba2 hybrid has fewer than num_hidden_layers).
    attention_layer_ids: List[int] = field(default_factory=list)
    # MLA (DeepSeek): what one token's latent holds, kv_lora_rank + qk_rope_head_dim values per
    # layer, stored once (not per head). None on other models.
    kv_lora_rank: Optional[int] = None
    qk_rope_head_dim: Optional[int] = None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def is_hybrid_swa(self) -> bool:
        return len(self.swa_layer_ids) > 0

    @property
    def is_pure_swa(self) -> bool:
        """Every attention layer is sliding-window: no layer needs full-history KV."""
        return self.is_hybrid_swa and not self.full_attention_layer_ids

    @property
    def is_supported(self) -> bool:
        return self.architecture in SUPPORTED_ARCHITECTURES

    @classmethod
    def from_path(cls, model_path: str, context_length: Optional[int] = None) -> "ModelConfig":
        return cls.from_dict(read_hf_config_dict(model_path), model_path, context_length)

    @classmethod
    def from_dict(cls, cfg: dict, model_path: str = "", context_length: Optional[int] = None) -> "ModelConfig":
        archs = cfg.get("architectures") or [""]
        arch = archs[0]
        if isinstance(cfg.get("text_config"), dict) and "num_hidden_layers" not in cfg:
            # a vision-language checkpoint (e.g. Qwen3.5): the language model's fields are nested
            cfg = {**cfg, **cfg["text_config"], "architectures": archs}
        num_layers = int(cfg.get("num_hidden_layers", cfg.get("n_layer", 0)) or 0)
        if not num_layers and (cfg.get("layers_block_type") or cfg.get("hybrid_override_pattern")):
            # transformers 5 NemotronHConfig.to_dict() writes only the per-layer list.
            num_layers = len(cfg.get("layers_block_type") or cfg["hybrid_override_pattern"])
        hidden = int(cfg.get("hidden_size", cfg.get("d_model", 0)))
        n_heads = int(cfg.get("num_attention_heads", 0) or 0)
        n_kv = int(cfg.get("num_key_value_heads") or n_heads)
        head_dim = cfg.get("head_dim") or (hidden // n_heads if n_heads else 0)
        derived_ctx = int(cfg.get("max_position_embeddings", 2048))
        ctx = derived_ctx if context_length is None else int(context_length)

        attention_layers = _attention_layer_ids(cfg, arch, num_layers)
        is_ssm = arch in HYBRID_SSM_ARCHITECTURES or _has_ssm_layers(cfg)
        swa_ids, full_ids, window = _sliding_window_layers(_with_default_layer_types(cfg, arch, num_layers),
                                                           attention_layers)
        return cls(
            model_path=model_path,
            architecture=arch,
            hf_config=cfg,
            num_hidden_layers=num_layers,
            hidden_size=hidden,
            vocab_size=int(cfg.get("vocab_size", 0)),
            num_attention_heads=n_heads,
            num_key_value_heads=n_kv,
            head_dim=int(head_dim),
            context_len=ctx,
            sliding_window_size=window,
            swa_layer_ids=swa_ids,
            full_attention_layer_ids=full_ids,
            is_hybrid_ssm=is_ssm,
            attention_layer_ids=attention_layers,
            kv_lora_rank=int(cfg["kv_lora_rank"]) if arch in MLA_ARCHITECTURES else None,
            qk_rope_head_dim=int(cfg["qk_rope_head_dim"]) if arch in MLA_ARCHITECTURES else None,
        )


_SSM_LAYER_TYPES = ("mamba", "mamba2", "linear_attention")
# Layer kinds that hold attention KV ("hybrid": Falcon-H1's attention + Mamba2 in one layer).
_ATTENTION_LAYER_TYPES = ("attention", "full_attention", "sliding_attention", "hybrid")


def _layer_kind_list(cfg: dict):
    """`layer_types`, else `layers_block_type` (transformers 5 NemotronH's saved form)."""
    return cfg.get("layer_types") or cfg.get("layers_block_type") or []


def _has_ssm_layers(cfg: dict) -> bool:
    layer_types = _layer_kind_list(cfg)
    if any(t in _SSM_LAYER_TYPES for t in layer_types):
        return True
    pattern = cfg.get("hybrid_override_pattern") or ""
    return "M" in pattern


def _attention_layer_ids(cfg: dict, arch: str, num_layers: int) -> List[int]:
    pattern = cfg.get("hybrid_override_pattern")
    if arch == "NemotronHForCausalLM" and pattern:
        return [i for i, c in enumerate(pattern) if c == "*"]
    layer_types = _layer_kind_list(cfg)
    if layer_types and any(t in _SSM_LAYER_TYPES for t in layer_types):
        return [i for i, t in enumerate(layer_types) if t in _ATTENTION_LAYER_TYPES]
    return list(range(num_layers))


def _with_default_layer_types(cfg: dict, arch: str, num_layers: int) -> dict:
    """Gemma 2 / Gemma 3 checkpoints saved before `layer_types` existed: HF's defaults (Gemma 2
    alternates sliding and global layers; Gemma 3 has one global layer every
    `sliding_window_pattern`, default 6)."""
    if cfg.get("layer_types") or not cfg.get("sliding_window"):
        return cfg
    if arch == "Gemma2ForCausalLM":
        pattern = 2
    elif arch == "Gemma3ForCausalLM":
        pattern = int(cfg.get("sliding_window_pattern") or 6)
    else:
        return cfg
    kinds = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    return {**cfg, "layer_types": kinds}


def _sliding_window_layers(cfg: dict, attention_layers: List[int]):
    """Returns (swa_layer_ids, full_layer_ids, window) following the HF config conventions.

    Qwen2/Qwen3: `use_sliding_window` + `sliding_window` + `max_window_layers` (layers with
    index >= max_window_layers slide) or an explicit `layer_types` list. Llama-style configs
    without a window are all full attention.
    """
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if layer_types and window:
        swa = [i for i in attention_layers if layer_types[i] == "sliding_attention"]
    elif window and cfg.get("use_sliding_window"):
        max_window_layers = cfg.get("max_window_layers", 0) or 0
        swa = [i for i in attention_layers if i >= max_window_layers]
    else:
        swa = []
    if not swa:
        return [], list(attention_layers), None
    full = [i for i in attention_layers if i not in swa]
    return swa, full, int(window)
