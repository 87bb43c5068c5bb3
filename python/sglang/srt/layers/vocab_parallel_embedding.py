"""Token embedding and LM head (upstream's names), split by vocabulary rows across TP ranks.

The LM head is a separate parameter unless the config ties it to the embedding, in which case
the model points `lm_head.weight` at `embed_tokens.weight` and the checkpoint may omit it.

Tensor parallelism (distributed/parallel_state.py; a group of one changes nothing): the
vocabulary is padded to a multiple of the TP size and rank r holds rows
[r * V/tp, (r+1) * V/tp). The embedding looks up the ids in its rows, zeroes the others and sums
over the ranks (all-reduce); the LM head gives this rank's columns of the logits, which
`LogitsProcessor` gathers on every rank (`gather_vocab_logits`), so every rank holds the same
full logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.distributed.parallel_state import (
    get_tp_rank,
    get_tp_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from sglang.srt.layers.gguf_linear import gguf_embedding


class VocabParallelEmbedding(nn.Module):
    gguf_weight = None  # GGUF blocks (layers/gguf_linear.py), from a GGUF file; `weight` is then a placeholder

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.rows_per_rank = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.tp_rank * self.rows_per_rank
        self.vocab_end = min(self.vocab_start + self.rows_per_rank, num_embeddings)
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, embedding_dim), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.gguf_weight is not None:
            return gguf_embedding(input_ids, self.gguf_weight, self.weight.dtype)
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        out = F.embedding(torch.where(mine, input_ids - self.vocab_start, 0), self.weight)
        out = out * mine.unsqueeze(-1).to(out.dtype)
        return tensor_model_parallel_all_reduce(out)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        """This rank's vocabulary rows of a [V, H] weight (or [V] bias); padding rows are zero."""
        if self.tp_size == 1 or loaded.shape[0] != self.num_embeddings:
            if tuple(param.shape) != tuple(loaded.shape):
                raise ValueError(f"Weight shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded.shape)}")
            param.data.copy_(loaded.to(param.dtype))
            return
        n = self.vocab_end - self.vocab_start
        param.data.zero_()
        param.data[:n].copy_(loaded[self.vocab_start:self.vocab_end].to(param.dtype))


class ParallelLMHead(VocabParallelEmbedding):
    """Holds the [vocab, hidden] output projection; `LogitsProcessor` applies it."""

    packed_weight = None  # set by linear.pack_linear_weights (CPU)
    int8_weight = None  # (q, scale) under --quantization w8a16_int8 (layers/quantization.py)
    onednn_weight = None  # beside panels, for many rows (linear.pack_linear_weights)

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False):
        super().__init__(num_embeddings, embedding_dim)
        self.bias = nn.Parameter(torch.empty(self.rows_per_rank), requires_grad=False) if bias else None

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> "ParallelLMHead":
        self.weight = embed_tokens.weight
        return self

    def forward(self, input_ids):  # pragma: no cover - use LogitsProcessor
        raise RuntimeError("ParallelLMHead is applied by LogitsProcessor, not called directly")


def gather_vocab_logits(lm_head, logits: torch.Tensor) -> torch.Tensor:
    """Every rank's columns of the logits, in vocabulary order, without the padding (the
    identity without TP)."""
    if getattr(lm_head, "tp_size", 1) == 1:
        return logits
    return tensor_model_parallel_all_gather(logits, dim=-1)[..., : lm_head.num_embeddings]
