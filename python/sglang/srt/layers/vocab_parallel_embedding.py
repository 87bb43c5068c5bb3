"""Token embedding and LM head (single device; upstream's names kept).

The LM head is a separate parameter unless the config ties it to the embedding, in which case
the model points `lm_head.weight` at `embed_tokens.weight` and the checkpoint may omit it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.gguf_linear import gguf_embedding


class VocabParallelEmbedding(nn.Module):
    gguf_weight = None  # GGUF blocks (layers/gguf_linear.py), from a GGUF file; `weight` is then a placeholder

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.gguf_weight is not None:
            return gguf_embedding(input_ids, self.gguf_weight, self.weight.dtype)
        return F.embedding(input_ids, self.weight)


class ParallelLMHead(VocabParallelEmbedding):
    """Holds the [vocab, hidden] output projection; `LogitsProcessor` applies it."""

    packed_weight = None  # set by linear.pack_linear_weights (CPU)
    int8_weight = None  # (q, scale) under --quantization w8a16_int8 (layers/quantization.py)
    onednn_weight = None  # beside panels, for many rows (linear.pack_linear_weights)

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False):
        super().__init__(num_embeddings, embedding_dim)
        self.bias = nn.Parameter(torch.empty(num_embeddings), requires_grad=False) if bias else None

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> "ParallelLMHead":
        self.weight = embed_tokens.weight
        return self

    def forward(self, input_ids):  # pragma: no cover - use LogitsProcessor
        raise RuntimeError("ParallelLMHead is applied by LogitsProcessor, not called directly")
