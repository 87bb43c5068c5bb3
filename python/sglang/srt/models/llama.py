"""Llama: the plain decoder of models/decoder.py (pre-norm RMSNorm, SiLU-gated MLP, rotary on
the whole head), and its sequence-classification head. Qwen2, Qwen3, Mistral and the other
dense families are declarations over the same blocks (models/families.py).

Weights follow HF names; the shared loader (model_loader/weight_loading.py) merges q/k/v into
`qkv_proj` and gate/up into `gate_up_proj`. Sliding-window layers come from
`ModelConfig.swa_layer_ids` and are handed to `RadixAttention(sliding_window_size=...)`; the
attention backend applies the window.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from sglang.srt.configs.model_config import num_labels_of
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
from sglang.srt.models.decoder import (LLAMA_SPEC, DecoderAttention, DecoderForCausalLM, DecoderModel,
                                       DecoderSpec, check_decoder_config)


class LlamaAttention(DecoderAttention):
    """Llama's attention (the decoder's with its defaults); Falcon-H1 builds on it."""

    def __init__(self, config: Any, layer_id: int, model_config=None, spec: DecoderSpec = LLAMA_SPEC):
        super().__init__(config, layer_id, model_config, spec)


class LlamaForCausalLM(DecoderForCausalLM):
    spec = LLAMA_SPEC
    supports_tensor_parallel = True  # and Qwen2, Qwen3, Mistral (the subclasses that keep it)


EntryClass = LlamaForCausalLM


class LlamaForSequenceClassification(LlamaForCausalLM):
    """HF's `*ForSequenceClassification` (rerankers, reward models): the same decoder with a
    `score` head [num_labels, hidden] instead of the LM head; the logits of the last token are
    the output (served with --is-embedding: /v1/rerank, /v1/score, /encode)."""

    supports_tensor_parallel = False

    def __init__(self, config: Any, model_config=None):
        nn.Module.__init__(self)
        check_decoder_config(config)
        self.config = config
        self.model_config = model_config
        self.model = DecoderModel(config, model_config, self.spec)
        self.tie_word_embeddings = False
        self.score = ParallelLMHead(num_labels_of(config), config.hidden_size)
        self.logits_processor = LogitsProcessor(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                input_embeds: Optional[torch.Tensor] = None) -> LogitsProcessorOutput:
        hidden_states = self.model(input_ids, positions, forward_batch, input_embeds)
        return self.logits_processor(input_ids, hidden_states, self.score, forward_batch)
