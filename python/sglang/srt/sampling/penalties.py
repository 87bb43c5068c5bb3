"""Vectorized builders for the logit penalties of a batch (upstream `sampling/penaltylib`).

Upstream keeps running [B, V] accumulators that are updated after every decode step. Here the
same tensors are rebuilt from the requests' token lists whenever a `SamplingBatchInfo` is built:
one scatter over all the batch's tokens, no Python loop over tokens or vocabulary, so rebuilding
every step stays cheap and can never drift from the requests' real state (retraction, chunked
prefill, and filtering the batch need no bookkeeping).

Semantics (upstream):
- frequency: logits -= frequency_penalty * count(token in output)
- presence:  logits -= presence_penalty * [token in output]
- repetition (scaling): for each token seen, logit > 0 -> logit / p, else logit * p
- min_new_tokens: EOS and stop_token_ids get -inf until min_new_tokens tokens were generated
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch


def flatten_token_lists(
    token_lists: Sequence[Sequence[int]], vocab_size: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, token id) pairs of every token of every row, out-of-vocab ids dropped."""
    lengths = [len(t) for t in token_lists]
    flat: List[int] = []
    for t in token_lists:
        flat.extend(t)
    tokens = torch.tensor(flat, dtype=torch.int64, device=device)
    rows = torch.repeat_interleave(
        torch.arange(len(token_lists), device=device),
        torch.tensor(lengths, dtype=torch.int64, device=device),
    )
    keep = (tokens >= 0) & (tokens < vocab_size)
    if not bool(keep.all()):
        tokens, rows = tokens[keep], rows[keep]
    return rows, tokens


def token_counts(
    token_lists: Sequence[Sequence[int]], vocab_size: int, device
) -> torch.Tensor:
    """[B, V] float32: how many times each token occurs in each row's list."""
    counts = torch.zeros(len(token_lists), vocab_size, dtype=torch.float32, device=device)
    rows, tokens = flatten_token_lists(token_lists, vocab_size, device)
    if tokens.numel():
        counts.index_put_((rows, tokens), torch.ones_like(tokens, dtype=torch.float32),
                          accumulate=True)
    return counts


def linear_penalties(
    output_counts: torch.Tensor,
    frequency_penalties: torch.Tensor,
    presence_penalties: torch.Tensor,
) -> torch.Tensor:
    """[B, V] additive term of the frequency and presence penalties ([B] each)."""
    presence = (output_counts > 0).to(output_counts.dtype)
    return -(frequency_penalties.view(-1, 1) * output_counts
             + presence_penalties.view(-1, 1) * presence)


def repetition_scaling(
    seen_token_lists: Sequence[Sequence[int]],
    repetition_penalties: torch.Tensor,
    vocab_size: int,
    device,
) -> torch.Tensor:
    """[B, V] per-token scale: the row's repetition penalty where the token was seen, else 1."""
    scaling = torch.ones(len(seen_token_lists), vocab_size, dtype=torch.float32, device=device)
    rows, tokens = flatten_token_lists(seen_token_lists, vocab_size, device)
    if tokens.numel():
        scaling[rows, tokens] = repetition_penalties.to(torch.float32)[rows]
    return scaling


def apply_scaling_penalties(logits: torch.Tensor, scaling: torch.Tensor) -> None:
    """In place, as upstream/HF: positive logits are divided by the penalty, others multiplied."""
    logits.copy_(torch.where(logits > 0, logits / scaling, logits * scaling))


def min_new_tokens_mask(
    banned_token_lists: Sequence[Optional[Sequence[int]]],
    still_banned: Sequence[bool],
    vocab_size: int,
    device,
) -> Optional[torch.Tensor]:
    """[B, V] bool: True where a stop token must not be sampled yet (None if nothing is banned)."""
    lists = [list(b) if (ban and b) else [] for b, ban in zip(banned_token_lists, still_banned)]
    if not any(lists):
        return None
    mask = torch.zeros(len(lists), vocab_size, dtype=torch.bool, device=device)
    rows, tokens = flatten_token_lists(lists, vocab_size, device)
    mask[rows, tokens] = True
    return mask
