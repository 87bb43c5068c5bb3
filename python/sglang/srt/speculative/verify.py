"""Chain verification: which drafted tokens the target accepts, and the token after them.

Request i's verify forward scored `k_i + 1` positions: its last token followed by its drafts
d_1..d_k. Row j holds the target's next-token distribution after d_1..d_j (penalties, grammar
mask, temperature, top-k/top-p/min-p applied, exactly as the plain sampler would at that
position). Then, for j = 0, 1, ...:
- greedy rows: the target's token is the argmax; d_{j+1} is accepted when it equals it, else
  the argmax is emitted and the chain stops. The output is the plain greedy output.
- sampled rows (speculative sampling with a deterministic draft): d_{j+1} is accepted with
  probability p_j(d_{j+1}); on rejection a token is drawn from p_j with d_{j+1} removed
  (renormalized), and the chain stops. If every draft is accepted, one more token is drawn
  from p_k. Each emitted token is thereby distributed exactly as the target's.
Every request therefore emits between 1 and k_i + 1 tokens.

Uniforms come from the torch RNG, or, for requests with a `sampling_seed`, from a hash of
(seed, position) as in the plain sampler (the acceptance test uses a second, independent hash).
"""

from __future__ import annotations

import dataclasses
from typing import List, Sequence

import torch

from sglang.srt.layers.sampler import argmax, filtered_probs, inverse_cdf_sample, seeded_uniforms

_ACCEPT_SALT = 0x5BD1E995  # separates the acceptance test's seeded uniforms from the draw's


@dataclasses.dataclass
class ChainVerdict:
    tokens: List[List[int]]  # per request: the emitted tokens (accepted drafts, then one more)
    accepted: List[int]  # per request: how many drafts were accepted
    rows: List[List[int]]  # per request: the logits row each emitted token was chosen at


def verify_chains(logits: torch.Tensor, info, drafts: Sequence[Sequence[int]]) -> ChainVerdict:
    """`logits` [R, V] (biased: penalties / grammar already applied), R = sum(k_i + 1), rows of
    request i consecutive; `info` the SamplingBatchInfo of those R rows (each row's own
    position and history)."""
    greedy_rows = info.greedy_mask.tolist()
    arg = argmax(logits).tolist()
    probs = None
    if not all(greedy_rows):
        probs = filtered_probs(torch.log_softmax(logits / info.temperatures, dim=-1), info)
    offsets, o = [], 0
    for d in drafts:
        offsets.append(o)
        o += len(d) + 1

    accept_u = None
    if probs is not None:
        accept_u = _uniforms(info, salt=_ACCEPT_SALT)
    tokens: List[List[int]] = []
    accepted: List[int] = []
    rows: List[List[int]] = []
    final_rows, final_excluded, final_owner = [], [], []
    for i, (d, o) in enumerate(zip(drafts, offsets)):
        out, used, a = [], [], 0
        if greedy_rows[o]:
            for j in range(len(d) + 1):
                t = arg[o + j]
                out.append(t)
                used.append(o + j)
                if j < len(d) and t == d[j]:
                    a += 1
                    continue
                break
        else:
            k = len(d)
            if k:
                p_draft = probs[o:o + k].gather(1, torch.tensor(d, dtype=torch.int64).view(-1, 1)).view(-1)
                ok = (accept_u[o:o + k] < p_draft.to(torch.float64)).tolist()
                while a < k and ok[a]:
                    a += 1
            out.extend(d[:a])
            used.extend(range(o, o + a))
            # one more token from row o + a: the residual after a rejected draft, else the bonus
            final_rows.append(o + a)
            final_excluded.append(d[a] if a < k else -1)
            final_owner.append(i)
            out.append(-1)  # filled below
            used.append(o + a)
        tokens.append(out)
        accepted.append(a)
        rows.append(used)
    if final_rows:
        idx = torch.tensor(final_rows, dtype=torch.int64)
        p = probs.index_select(0, idx).clone()
        excl = torch.tensor(final_excluded, dtype=torch.int64)
        has = excl >= 0
        if bool(has.any()):
            r = has.nonzero().view(-1)
            p[r, excl[has]] = 0.0
            empty = p[r].sum(-1) <= 0  # the draft held all the mass (then it was never rejected)
            if bool(empty.any()):
                p[r[empty], excl[has][empty]] = 1.0
        u = _uniforms(info, salt=0).index_select(0, idx)
        drawn = inverse_cdf_sample(p, u).tolist()
        for owner, t in zip(final_owner, drawn):
            tokens[owner][-1] = int(t)
    return ChainVerdict(tokens, accepted, rows)


def _uniforms(info, salt: int) -> torch.Tensor:
    """[R] float64 uniforms: torch's RNG, or hashed from (seed, position) for seeded rows."""
    n = info.batch_size
    u = torch.rand(n, dtype=torch.float64)
    seeded = info.has_seed
    if bool(seeded.any()):
        r = seeded.nonzero().view(-1)
        u[r] = seeded_uniforms(info.seed_lo[r] ^ salt, info.seed_hi[r], info.positions[r])
    return u
