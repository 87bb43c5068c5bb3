"""Turns a batch's next-token logits into token ids (and logprobs), upstream `layers/sampler.py`.

Order of operations, as upstream's pytorch sampling backend:
1. penalties / grammar mask / logit_bias (`SamplingBatchInfo.apply_logits_bias`), on an fp32 copy when any apply;
2. all-greedy batch: the argmax of those logits (`argmax`: torch.argmax's indices, so greedy output equals HF's greedy);
3. otherwise: divide by temperature, softmax, drop tokens outside top-k, then outside top-p
   (cumulative mass of the *unfiltered* sorted probabilities, as upstream), then below
   `min_p * max_prob`, and sample. Greedy rows (top_k == 1) of a mixed batch take the argmax
   directly. Rows with a `sampling_seed` sample by inverse CDF with a uniform hashed from
   (seed, position), so their tokens do not depend on the rest of the batch or on the global
   RNG; the other rows draw their uniform from the global torch RNG. Filtering avoids a full
   vocabulary sort when a row's filters provably keep only its top `MAX_CANDIDATES` tokens.

Logprobs (upstream default, i.e. without SGLANG_RETURN_ORIGINAL_LOGPROB): log-softmax of the
logits after penalties and temperature scaling, before top-k/top-p/min-p filtering; clamped to
the float32 minimum instead of -inf so they stay JSON-serializable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from sglang.srt.layers import cpu_ops
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

_MASK32 = 0xFFFFFFFF
_LOGPROB_MIN = torch.finfo(torch.float32).min
# Filtered rows first look at this many most likely tokens (see sample_from_logprobs).
MAX_CANDIDATES = 1024

TopLogprobs = Tuple[List[float], List[int]]  # (values, token ids) of one position


@dataclass
class SamplerOutput:
    next_token_ids: torch.Tensor  # [B] int64
    next_token_logprobs: Optional[torch.Tensor] = None  # [B] float32, when return_logprob
    top_logprobs: Optional[List[TopLogprobs]] = None  # per request, when return_logprob
    token_ids_logprobs: Optional[List[Optional[TopLogprobs]]] = None  # per request, if asked


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """torch.argmax(logits, dim=-1) (the same indices), in sgl_kernel on CPU: torch's takes ~0.1 ms
    a row of a 49k vocabulary there, 6.6 ms of a batch-64 decode step."""
    if cpu_ops.enabled(logits) and logits.dim() == 2 and logits.stride(-1) == 1 and logits.shape[-1] > 0:
        return torch.ops.sgl_kernel.argmax(logits)
    return torch.argmax(logits, dim=-1)


class Sampler(nn.Module):
    """Stateless sampler; an nn.Module like upstream so model runners can hold it as a layer."""

    def forward(
        self,
        logits: torch.Tensor,
        sampling_info: SamplingBatchInfo,
        return_logprob: bool = False,
        top_logprobs_nums: Optional[Sequence[int]] = None,
        token_ids_logprobs: Optional[Sequence[Optional[Sequence[int]]]] = None,
    ) -> SamplerOutput:
        # The caller's logits stay as they are: copied when a bias will be written into them.
        logits = logits.to(torch.float32, copy=sampling_info.modifies_logits)
        sampling_info.apply_logits_bias(logits)

        logprobs = None
        if sampling_info.is_all_greedy:
            next_ids = argmax(logits)
            if return_logprob:
                logprobs = torch.log_softmax(logits, dim=-1)
        else:
            logprobs = torch.log_softmax(logits / sampling_info.temperatures, dim=-1)
            next_ids = sample_from_logprobs(logprobs, sampling_info)
            greedy = sampling_info.greedy_mask
            if bool(greedy.any()):  # exact argmax, as in an all-greedy batch
                next_ids = torch.where(greedy, argmax(logits), next_ids)

        out = SamplerOutput(next_token_ids=next_ids.to(torch.int64))
        if return_logprob:
            logprobs = logprobs.clamp(min=_LOGPROB_MIN)
            out.next_token_logprobs = logprobs.gather(1, out.next_token_ids.view(-1, 1)).view(-1)
            if top_logprobs_nums is not None:
                out.top_logprobs = get_top_logprobs(logprobs, top_logprobs_nums)
            if token_ids_logprobs is not None:
                out.token_ids_logprobs = get_token_ids_logprobs(logprobs, token_ids_logprobs)
        return out


def sample_from_logprobs(
    logprobs: torch.Tensor, info: SamplingBatchInfo, max_candidates: int = MAX_CANDIDATES
) -> torch.Tensor:
    """[B] ids sampled from temperature-scaled logprobs after top-k/top-p/min-p filtering.

    Greedy rows (top_k == 1) are left at 0: the caller takes their argmax from the logits.
    Rows without any filter sample from the full distribution. Filtered rows first look at the
    `max_candidates` most likely tokens (a cheap `topk`); a row whose filters provably drop
    every token beyond them (its top_k fits, or their mass already exceeds top_p, or the last
    candidate is below min_p * max_prob) is filtered there, the rest get a full sort. Each
    row's path depends only on that row, so seeded rows stay batch-independent.
    """
    probs = logprobs.exp()
    batch, vocab = probs.shape
    picked = torch.zeros(batch, dtype=torch.int64, device=probs.device)
    active = ~info.greedy_mask
    needs_filter = (info.top_ks < vocab) | (info.top_ps < 1.0) | (info.min_ps > 0)

    rows = (active & ~needs_filter).nonzero().view(-1)
    if rows.numel():
        picked[rows] = _draw(probs[rows], info, rows)

    rows = (active & needs_filter).nonzero().view(-1)
    if not rows.numel():
        return picked
    row_probs = probs[rows]
    fits = torch.zeros(rows.numel(), dtype=torch.bool, device=probs.device)
    k0 = min(vocab, max_candidates)
    if k0 < vocab:
        cand, cand_ids = row_probs.topk(k0, dim=-1)
        fits = ((info.top_ks[rows] <= k0)
                | (cand.sum(-1) > info.top_ps[rows])
                | (cand[:, -1] < info.min_ps[rows] * cand[:, 0]))
        if bool(fits.any()):
            sub = rows[fits]
            sorted_p, ids = cand[fits], cand_ids[fits]
            _filter_sorted_(sorted_p, info.top_ks[sub], info.top_ps[sub], info.min_ps[sub])
            picked[sub] = ids.gather(1, _draw(sorted_p, info, sub).view(-1, 1)).view(-1)
    if not bool(fits.all()):
        sub = rows[~fits]
        sorted_p, ids = top_k_top_p_min_p_filter(
            row_probs[~fits], info.top_ks[sub], info.top_ps[sub], info.min_ps[sub])
        picked[sub] = ids.gather(1, _draw(sorted_p, info, sub).view(-1, 1)).view(-1)
    return picked


def filtered_probs(logprobs: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """[B, V] the distribution `sample_from_logprobs` draws from, dense and normalized: the
    temperature-scaled probabilities after top-k / top-p / min-p (speculative verification
    needs the probability of a given token, not only a draw). Greedy rows: one-hot argmax."""
    probs = logprobs.exp()
    batch, vocab = probs.shape
    needs_filter = (info.top_ks < vocab) | (info.top_ps < 1.0) | (info.min_ps > 0)
    rows = (needs_filter & ~info.greedy_mask).nonzero().view(-1)
    if rows.numel():
        sorted_p, ids = top_k_top_p_min_p_filter(probs[rows], info.top_ks[rows], info.top_ps[rows],
                                                 info.min_ps[rows])
        probs[rows] = torch.zeros_like(sorted_p).scatter_(1, ids, sorted_p)
    greedy = info.greedy_mask.nonzero().view(-1)
    if greedy.numel():
        top = argmax(logprobs[greedy])
        probs[greedy] = 0.0
        probs[greedy, top] = 1.0
    return probs / probs.sum(dim=-1, keepdim=True).clamp(min=1e-30)


def _draw(probs: torch.Tensor, info: SamplingBatchInfo, rows: torch.Tensor) -> torch.Tensor:
    """Column index drawn from each row of (unnormalized) `probs`; `rows` are batch rows.

    One uniform per row: from the global torch RNG, or hashed from (seed, position) for rows
    with a sampling_seed. Inverse-CDF sampling costs one cumsum (cheaper than multinomial).
    """
    u = torch.rand(rows.numel(), dtype=torch.float64, device=probs.device)
    seeded = info.has_seed[rows]
    if bool(seeded.any()):
        r = rows[seeded]
        u[seeded] = seeded_uniforms(info.seed_lo[r], info.seed_hi[r], info.positions[r])
    return inverse_cdf_sample(probs, u)


def inverse_cdf_sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Column whose cumulative-mass interval holds u * total mass (u in [0, 1), one per row).

    Zero-probability columns have empty intervals and are never picked.
    """
    cdf = probs.to(torch.float64).cumsum(dim=-1)
    target = (u.to(torch.float64) * cdf[:, -1]).view(-1, 1)
    idx = torch.searchsorted(cdf, target, right=True).view(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


def _filter_sorted_(
    probs_sort: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: Optional[torch.Tensor],
) -> None:
    """In place on descending-sorted probabilities: zero what top-k, top-p, min-p drop."""
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    ranks = torch.arange(probs_sort.shape[-1], device=probs_sort.device).view(1, -1)
    probs_sort[ranks >= top_ks.view(-1, 1)] = 0.0
    probs_sort[(probs_sum - probs_sort) > top_ps.view(-1, 1)] = 0.0
    if min_ps is not None:
        thresholds = probs_sort[:, 0] * min_ps
        probs_sort[probs_sort < thresholds.view(-1, 1)] = 0.0


def top_k_top_p_min_p_filter(
    probs: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    need_min_p: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sorted, filtered probabilities [B, V] (zeros where dropped) and their token ids [B, V].

    Upstream's torch fallback: top-k by rank, top-p on the cumulative mass of the sorted
    unfiltered probabilities (a token is dropped when the mass before it already exceeds
    top_p), then min-p relative to the most likely token. The stable sort keeps ties in id
    order, so a top-k=1 / tiny-top-p row keeps exactly `argmax`'s token.
    """
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True, stable=True)
    _filter_sorted_(probs_sort, top_ks, top_ps, min_ps if need_min_p else None)
    return probs_sort, probs_idx


def _mulmod32(x: torch.Tensor, m: int) -> torch.Tensor:
    """(x * m) mod 2**32 for x in [0, 2**32) without int64 overflow (16-bit halves)."""
    lo = x & 0xFFFF
    hi = x >> 16
    return (lo * m + (((hi * m) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32 finalizer) on int64 tensors holding values < 2**32."""
    x = x ^ (x >> 16)
    x = _mulmod32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mulmod32(x, 0x846CA68B)
    return x ^ (x >> 16)


def seeded_uniforms(
    seed_lo: torch.Tensor, seed_hi: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """[R] float64 uniforms in (0, 1) that depend only on (seed, position) of each row."""
    key = _mix32(seed_lo ^ _mix32(seed_hi ^ 0x9E3779B9))
    bits = _mix32(key ^ _mix32((positions & _MASK32) ^ 0x85EBCA6B))
    # 53 random bits: a second hash supplies the low 21.
    low = _mix32(bits ^ 0xC2B2AE35) >> 11
    return ((bits << 21 | low).to(torch.float64) + 0.5) / float(1 << 53)


def get_top_logprobs(logprobs: torch.Tensor, top_logprobs_nums: Sequence[int]) -> List[TopLogprobs]:
    """Per row, the `k` largest logprobs and their token ids (k = 0 gives empty lists)."""
    max_k = max(top_logprobs_nums, default=0)
    if max_k <= 0:
        return [([], []) for _ in top_logprobs_nums]
    values, indices = logprobs.topk(min(max_k, logprobs.shape[-1]), dim=-1)
    values, indices = values.tolist(), indices.tolist()
    return [(values[i][:k], indices[i][:k]) for i, k in enumerate(top_logprobs_nums)]


def get_token_ids_logprobs(
    logprobs: torch.Tensor, token_ids: Sequence[Optional[Sequence[int]]]
) -> List[Optional[TopLogprobs]]:
    """Per row, the logprobs of the requested token ids (None where nothing was requested)."""
    out: List[Optional[TopLogprobs]] = []
    for i, ids in enumerate(token_ids):
        if ids is None:
            out.append(None)
            continue
        ids = list(ids)
        idx = torch.tensor(ids, dtype=torch.int64, device=logprobs.device)
        out.append((logprobs[i, idx].tolist(), ids))
    return out


@dataclass
class PromptLogprobs:
    token_logprobs: torch.Tensor  # [n] float32: logprob of next_ids[i] given positions <= i
    top_logprobs: Optional[List[TopLogprobs]] = None  # per position, when top_k > 0
    token_ids_logprobs: Optional[List[TopLogprobs]] = None  # per position, when token_ids given


def compute_prompt_logprobs(
    full_logits: torch.Tensor,
    next_ids: torch.Tensor,
    top_k: int = 0,
    token_ids: Optional[Sequence[int]] = None,
) -> PromptLogprobs:
    """Input-token logprobs of one request: row i of `full_logits` predicts `next_ids[i]`.

    As upstream's logits processor (default settings), these are plain log-softmax of the
    model's logits: no penalties, no temperature. The caller aligns rows with prompt tokens
    (the first prompt token has no logprob; upstream reports None for it).
    """
    logprobs = torch.log_softmax(full_logits.to(torch.float32), dim=-1).clamp(min=_LOGPROB_MIN)
    next_ids = torch.as_tensor(next_ids, dtype=torch.int64, device=logprobs.device)
    out = PromptLogprobs(token_logprobs=logprobs.gather(1, next_ids.view(-1, 1)).view(-1))
    if top_k > 0:
        out.top_logprobs = get_top_logprobs(logprobs, [top_k] * logprobs.shape[0])
    if token_ids is not None:
        out.token_ids_logprobs = get_token_ids_logprobs(logprobs, [token_ids] * logprobs.shape[0])
    return out
