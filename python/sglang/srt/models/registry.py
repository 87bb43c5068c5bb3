"""Architecture name (HF `config.json` "architectures"[0]) -> model class.

Model modules are imported lazily, on lookup, so importing the registry stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Dict, List, Type

# architecture -> (module, class name)
_MODELS: Dict[str, tuple] = {
    "LlamaForCausalLM": ("sglang.srt.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("sglang.srt.models.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("sglang.srt.models.qwen3", "Qwen3ForCausalLM"),
    "MistralForCausalLM": ("sglang.srt.models.mistral", "MistralForCausalLM"),
    "GemmaForCausalLM": ("sglang.srt.models.gemma", "GemmaForCausalLM"),
    "Gemma2ForCausalLM": ("sglang.srt.models.gemma2", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("sglang.srt.models.gemma3", "Gemma3ForCausalLM"),
    "Phi3ForCausalLM": ("sglang.srt.models.phi3", "Phi3ForCausalLM"),
    "PhiForCausalLM": ("sglang.srt.models.phi", "PhiForCausalLM"),
    "Olmo2ForCausalLM": ("sglang.srt.models.olmo2", "Olmo2ForCausalLM"),
    "GraniteForCausalLM": ("sglang.srt.models.granite", "GraniteForCausalLM"),
    "Starcoder2ForCausalLM": ("sglang.srt.models.starcoder2", "Starcoder2ForCausalLM"),
    "StableLmForCausalLM": ("sglang.srt.models.stablelm", "StableLmForCausalLM"),
    "SmolLM3ForCausalLM": ("sglang.srt.models.smollm3", "SmolLM3ForCausalLM"),
    "GlmForCausalLM": ("sglang.srt.models.glm", "GlmForCausalLM"),
    "Glm4ForCausalLM": ("sglang.srt.models.glm4", "Glm4ForCausalLM"),
    "Exaone4ForCausalLM": ("sglang.srt.models.exaone4", "Exaone4ForCausalLM"),
    "DeepseekV2ForCausalLM": ("sglang.srt.models.deepseek_v2", "DeepseekV2ForCausalLM"),
    "DeepseekV3ForCausalLM": ("sglang.srt.models.deepseek_v2", "DeepseekV3ForCausalLM"),
    # Sequence classification (rerankers, reward models; served with --is-embedding)
    "LlamaForSequenceClassification": ("sglang.srt.models.llama", "LlamaForSequenceClassification"),
    "Qwen2ForSequenceClassification": ("sglang.srt.models.qwen2", "Qwen2ForSequenceClassification"),
    "Qwen3ForSequenceClassification": ("sglang.srt.models.qwen3", "Qwen3ForSequenceClassification"),
    "NemotronHForCausalLM": ("sglang.srt.models.nemotron_h", "NemotronHForCausalLM"),
    "FalconH1ForCausalLM": ("sglang.srt.models.falcon_h1", "FalconH1ForCausalLM"),
    "Qwen3NextForCausalLM": ("sglang.srt.models.qwen3_next", "Qwen3NextForCausalLM"),
    "Qwen3_5ForCausalLM": ("sglang.srt.models.qwen3_next", "Qwen3_5ForCausalLM"),
    "Qwen3_5MoeForCausalLM": ("sglang.srt.models.qwen3_next", "Qwen3_5MoeForCausalLM"),
    "Qwen3_5ForConditionalGeneration": ("sglang.srt.models.qwen3_next", "Qwen3_5ForConditionalGeneration"),
    "Qwen3_5MoeForConditionalGeneration": ("sglang.srt.models.qwen3_next", "Qwen3_5MoeForConditionalGeneration"),
}


class ModelRegistry:
    @staticmethod
    def get_supported_archs() -> List[str]:
        return sorted(_MODELS)

    @staticmethod
    def register(arch: str, module: str, class_name: str) -> None:
        _MODELS[arch] = (module, class_name)

    @staticmethod
    def resolve_model_cls(architectures) -> Type:
        if isinstance(architectures, str):
            architectures = [architectures]
        for arch in architectures or []:
            if arch in _MODELS:
                module, cls = _MODELS[arch]
                return getattr(importlib.import_module(module), cls)
        raise ValueError(
            f"Model architectures {list(architectures or [])} are not supported for now. "
            f"Supported architectures: {ModelRegistry.get_supported_archs()}"
        )


def get_model_class(architectures) -> Type:
    return ModelRegistry.resolve_model_cls(architectures)
