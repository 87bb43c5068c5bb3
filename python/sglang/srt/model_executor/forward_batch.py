"""The tensors one model forward needs: what the scheduler hands the model runner.

Token-level tensors are flat over the batch ([num_tokens]); request-level ones are [batch_size].
In EXTEND mode request i contributes tokens [prefix_len_i, seq_len_i) (its prefix KV is already
in the pool); in DECODE mode every request contributes exactly one token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, List, Optional

import torch


class ForwardMode(IntEnum):
    EXTEND = 1
    DECODE = 2
    IDLE = 3

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    req_pool_indices: torch.Tensor  # [B] int64: rows of req_to_token
    seq_lens: torch.Tensor  # [B] int64: KV length after this forward (prefix + new tokens)
    out_cache_loc: torch.Tensor  # [num_tokens] int64: KV slots the new tokens are written to
    seq_lens_cpu: List[int]
    # EXTEND only (in DECODE these are prefix = seq_len - 1, extend = 1).
    extend_prefix_lens_cpu: List[int] = field(default_factory=list)
    extend_seq_lens_cpu: List[int] = field(default_factory=list)
    # Logits of every new token (not only the last of each request) are returned when set:
    # prompt logprobs and logits-parity tests use it.
    return_full_logits: bool = False
    return_all_hidden: bool = False  # every new token's final hidden state (embedding pooling)
    # DECODE: the scheduler samples every request as the argmax of its raw logits (all greedy; no
    # logprobs, penalties, bias, grammar or logit processors), so the LM head may return the
    # token ids instead of the logits (LogitsProcessorOutput.next_token_ids).
    argmax_only: bool = False
    # Filled by the model runner.
    req_to_token_pool: Any = None
    token_to_kv_pool: Any = None
    attn_backend: Any = None
    # Hybrid recurrent-state models: the request's slot in the Mamba state pool, and the pool.
    mamba_pool_indices: Optional[torch.Tensor] = None
    mamba_pool: Any = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def extend_start_loc_cpu(self) -> List[int]:
        out, acc = [], 0
        for n in self.extend_seq_lens_cpu:
            out.append(acc)
            acc += n
        return out

    @classmethod
    def for_extend(cls, input_ids: List[List[int]], prefix_lens: List[int], req_pool_indices: List[int],
                   out_cache_loc: torch.Tensor, device: str = "cpu", return_full_logits: bool = False) -> "ForwardBatch":
        """Builds an EXTEND batch: input_ids[i] are the new tokens of request i after prefix_lens[i]."""
        ext = [len(x) for x in input_ids]
        seq = [p + n for p, n in zip(prefix_lens, ext)]
        flat = [t for x in input_ids for t in x]
        pos = [p + j for p, n in zip(prefix_lens, ext) for j in range(n)]
        return cls(
            forward_mode=ForwardMode.EXTEND,
            batch_size=len(input_ids),
            input_ids=torch.tensor(flat, dtype=torch.int64, device=device),
            positions=torch.tensor(pos, dtype=torch.int64, device=device),
            req_pool_indices=torch.tensor(req_pool_indices, dtype=torch.int64, device=device),
            seq_lens=torch.tensor(seq, dtype=torch.int64, device=device),
            out_cache_loc=out_cache_loc,
            seq_lens_cpu=seq,
            extend_prefix_lens_cpu=list(prefix_lens),
            extend_seq_lens_cpu=ext,
            return_full_logits=return_full_logits,
        )

    @classmethod
    def for_decode(cls, input_ids: List[int], seq_lens: List[int], req_pool_indices: List[int],
                   out_cache_loc: torch.Tensor, device: str = "cpu") -> "ForwardBatch":
        """Builds a DECODE batch: one new token per request; seq_lens include it."""
        return cls(
            forward_mode=ForwardMode.DECODE,
            batch_size=len(input_ids),
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
            positions=torch.tensor([s - 1 for s in seq_lens], dtype=torch.int64, device=device),
            req_pool_indices=torch.tensor(req_pool_indices, dtype=torch.int64, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
            out_cache_loc=out_cache_loc,
            seq_lens_cpu=list(seq_lens),
            extend_prefix_lens_cpu=[s - 1 for s in seq_lens],
            extend_seq_lens_cpu=[1] * len(seq_lens),
        )
