"""Final hidden states -> logits.

`next_token_logits` [B, V] are the logits after the last new token of each request (what the
sampler needs). `full_logits` [num_tokens, V] are the logits of every new token, computed only
when `forward_batch.return_full_logits` is set (prompt logprobs, parity tests); otherwise the
LM head runs on B rows only. Logits are returned in fp32 whatever the model dtype: the LM head's
result in the model dtype, widened (sgl-kernel's panels store it so in one pass), or with
`fp32_lm_head` (--enable-fp32-lm-head, set by the model runner) its fp32 sums, unrounded.

A decode batch marked `forward_batch.argmax_only` gets `next_token_ids` instead (the argmax of
those logits, taken in the LM head's own pass where its weights are in sgl-kernel panels:
`linear.module_linear_argmax`) and no logits; elsewhere it gets the logits as usual. Under TP
the LM head holds a slice of the vocabulary: the logits are gathered on every rank
(`vocab_parallel_embedding.gather_vocab_logits`) and the argmax shortcut is not taken.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from sglang.srt.layers.linear import module_linear, module_linear_argmax
from sglang.srt.layers.vocab_parallel_embedding import gather_vocab_logits
from sglang.srt.utils import log_once

logger = logging.getLogger(__name__)
# logged at a process's first such batch (the server tests look for it)
ARGMAX_MESSAGE = "CPU decode: greedy token ids from the LM head's pass (sgl_kernel.linear_argmax)"


@dataclass
class LogitsProcessorOutput:
    next_token_logits: Optional[torch.Tensor]  # [B, V] fp32 (None when next_token_ids is set)
    full_logits: Optional[torch.Tensor] = None  # [num_tokens, V] fp32, when requested
    # Final-norm hidden states of the last new token of each request [B, H].
    hidden_states: Optional[torch.Tensor] = None
    # Final-norm hidden states of every new token [num_tokens, H], when
    # `forward_batch.return_all_hidden` is set (mean / CLS pooling of embedding servers).
    all_hidden_states: Optional[torch.Tensor] = None
    # [B] int64: argmax of each row's logits, computed instead of them (forward_batch.argmax_only)
    next_token_ids: Optional[torch.Tensor] = None


def last_token_indices(forward_batch) -> torch.Tensor:
    """Index (into the flat token dim) of each request's last new token."""
    if forward_batch.forward_mode.is_decode():
        return torch.arange(forward_batch.batch_size, device=forward_batch.input_ids.device)
    lens = torch.tensor(forward_batch.extend_seq_lens_cpu, dtype=torch.int64, device=forward_batch.input_ids.device)
    return torch.cumsum(lens, 0) - 1


class LogitsProcessor(nn.Module):
    fp32_lm_head: bool = False  # --enable-fp32-lm-head: logits are the LM head's fp32 sums

    def __init__(self, config=None, logit_scale: Optional[float] = None, final_logit_softcapping: Optional[float] = None):
        super().__init__()
        self.logit_scale = logit_scale
        self.final_logit_softcapping = final_logit_softcapping
        if config is not None and final_logit_softcapping is None:
            self.final_logit_softcapping = getattr(config, "final_logit_softcapping", None)

    def _compute(self, hidden: torch.Tensor, lm_head) -> torch.Tensor:
        logits = module_linear(lm_head, hidden, torch.float32, round_to_x=not self.fp32_lm_head)
        logits = gather_vocab_logits(lm_head, logits)  # TP: this rank's vocabulary columns -> all
        if self.logit_scale is not None:
            logits = logits * self.logit_scale
        if self.final_logit_softcapping:
            cap = self.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits

    def forward(self, input_ids: torch.Tensor, hidden_states: torch.Tensor, lm_head, forward_batch) -> LogitsProcessorOutput:
        idx = last_token_indices(forward_batch)
        last_hidden = hidden_states.index_select(0, idx)
        all_hidden = hidden_states if getattr(forward_batch, "return_all_hidden", False) else None
        if getattr(forward_batch, "return_full_logits", False) and not forward_batch.forward_mode.is_decode():
            full = self._compute(hidden_states, lm_head)
            return LogitsProcessorOutput(next_token_logits=full.index_select(0, idx), full_logits=full,
                                         hidden_states=last_hidden, all_hidden_states=all_hidden)
        if getattr(forward_batch, "argmax_only", False) and forward_batch.forward_mode.is_decode() \
                and self.logit_scale is None and not self.final_logit_softcapping \
                and getattr(lm_head, "tp_size", 1) == 1:  # a rank's argmax is over its vocabulary rows only
            ids = module_linear_argmax(lm_head, last_hidden, round_to_x=not self.fp32_lm_head)
            if ids is not None:
                log_once(logger, ARGMAX_MESSAGE)
                return LogitsProcessorOutput(next_token_logits=None, hidden_states=last_hidden, next_token_ids=ids)
        logits = self._compute(last_hidden, lm_head)
        full = logits if getattr(forward_batch, "return_full_logits", False) else None
        return LogitsProcessorOutput(next_token_logits=logits, full_logits=full, hidden_states=last_hidden,
                                     all_hidden_states=all_hidden)
