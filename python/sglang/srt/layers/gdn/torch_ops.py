"""Plain-torch gated delta rule (Qwen3-Next / Qwen3.5 linear attention); the CPU path runs these.

Per value head h and token t, with the state S [Dk, Dv] (keys x values):

    S <- exp(g_t) * S                     (decay; g_t <= 0, in log space)
    S <- S + k_t (beta_t * (v_t - S^T k_t))^T   (delta rule: write only what S does not predict)
    o_t = S^T q_t

q and k are L2-normalised per head (`use_qk_l2norm`, eps 1e-6, as the FLA kernels and HF) and
q is scaled by Dk^-1/2. Grouped value heads: key head j serves value heads
[j * Hv / Hk, (j + 1) * Hv / Hk).

Layouts (flat token axis, as the serving engine runs them):
* q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv]; `cu_seqlens` [B + 1] splits T into sequences.
* states: [B, Hv, Dk, Dv] (prefill: `initial_states`, returned final states) or a state pool
  [S, Hv, Dk, Dv] indexed by `state_indices` [B] (decode: updated in place).
All math is fp32; outputs are cast to v's dtype, states to the pool's dtype.

`chunk_gated_delta_rule` (prefill / extend) evaluates the same recurrence a chunk of tokens at a
time (the WY / UT form: one triangular solve per chunk instead of a loop over its tokens);
`fused_recurrent_gated_delta_rule_update` (decode) takes one token per sequence. They agree with
each other and with the token loop `recurrent_gated_delta_rule` to float32 rounding.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

PAD_SLOT_ID = -1
DEFAULT_CHUNK_SIZE = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare_qk(q: torch.Tensor, k: torch.Tensor, num_v_heads: int, use_qk_l2norm: bool):
    """fp32 q, k with one head per value head, normalised and q scaled: [T, Hv, Dk]."""
    rep = num_v_heads // q.shape[-2]
    q, k = q.float(), k.float()
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    if rep > 1:
        q = q.repeat_interleave(rep, dim=-2)
        k = k.repeat_interleave(rep, dim=-2)
    return q * (q.shape[-1] ** -0.5), k


def _check(q, k, v, g, beta):
    T, Hk, Dk = q.shape
    if k.shape != q.shape:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must have the same shape")
    if v.shape[0] != T or g.shape != (T, v.shape[1]) or beta.shape != (T, v.shape[1]):
        raise ValueError(f"v {tuple(v.shape)}, g {tuple(g.shape)}, beta {tuple(beta.shape)} do not match q {tuple(q.shape)}")
    if v.shape[1] % Hk:
        raise ValueError(f"value heads ({v.shape[1]}) must be a multiple of key heads ({Hk})")


def _chunk_one(q, k, v, g, beta, state, chunk_size: int):
    """One sequence, heads first: q, k [H, L, Dk], v [H, L, Dv], g, beta [H, L], state [H, Dk, Dv]
    (all fp32) -> (o [H, L, Dv], final state)."""
    H, L, _ = q.shape
    pad = (-L) % chunk_size
    if pad:
        q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (torch.nn.functional.pad(x, (0, pad)) for x in (g, beta))  # g = 0, beta = 0: no-op tokens
    n = (L + pad) // chunk_size
    q, k, v = (x.reshape(H, n, chunk_size, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(H, n, chunk_size), beta.reshape(H, n, chunk_size)
    G = g.cumsum(-1)  # log of the decay from the chunk start through token i
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    # decay[i, j] = exp(G_i - G_j) for j <= i
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    kb, vb = k * beta[..., None], v * beta[..., None]
    # (I + strictly-lower(beta k k^T decay)) W = ... : the UT transform of the chunk's updates
    A = ((kb @ k.transpose(-1, -2)) * decay).tril(-1) + torch.eye(chunk_size, dtype=q.dtype, device=q.device)
    u = torch.linalg.solve_triangular(A, vb, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(A, kb * G.exp()[..., None], upper=False, unitriangular=True)
    qk = (q @ k.transpose(-1, -2)) * decay
    q_dec = q * G.exp()[..., None]
    k_dec = k * (G[..., -1:] - G).exp()[..., None]
    out = torch.empty_like(v)
    for c in range(n):
        v_new = u[:, c] - w[:, c] @ state  # what the chunk writes beyond the carried-in state
        out[:, c] = q_dec[:, c] @ state + qk[:, c] @ v_new
        state = state * G[:, c, -1].exp()[:, None, None] + k_dec[:, c].transpose(-1, -2) @ v_new
    return out.reshape(H, n * chunk_size, -1)[:, :L], state


def _recurrent_one(q, k, v, g, beta, state, chunk_size: int = 0):
    """One sequence, heads first (as `_chunk_one`), token by token: the definition."""
    out = torch.empty_like(v)
    for t in range(q.shape[1]):
        state = state * g[:, t].exp()[:, None, None]
        pred = torch.einsum("hk,hkv->hv", k[:, t], state)
        delta = (v[:, t] - pred) * beta[:, t][:, None]
        state = state + k[:, t][:, :, None] * delta[:, None, :]
        out[:, t] = torch.einsum("hk,hkv->hv", q[:, t], state)
    return out, state


def _over_sequences(one_sequence, q, k, v, g, beta, initial_states, cu_seqlens, use_qk_l2norm, state_dtype,
                    chunk_size: int = DEFAULT_CHUNK_SIZE):
    """Runs `one_sequence` (heads-first fp32 tensors of one sequence, its initial state) over
    the ragged batch; -> (o [T, Hv, Dv] in v's dtype, final states [B, Hv, Dk, Dv])."""
    _check(q, k, v, g, beta)
    T, Hv, Dv = v.shape
    Dk = q.shape[-1]
    if cu_seqlens is None:
        cu_seqlens = torch.tensor([0, T], dtype=torch.int64)
    bounds = [int(x) for x in cu_seqlens.tolist()]
    B = len(bounds) - 1
    qf, kf = _prepare_qk(q, k, Hv, use_qk_l2norm)
    vf, gf, bf = v.float(), g.float(), beta.float()
    out = torch.empty((T, Hv, Dv), dtype=torch.float32, device=v.device)
    finals = torch.empty((B, Hv, Dk, Dv), dtype=torch.float32, device=v.device)
    for i in range(B):
        s, e = bounds[i], bounds[i + 1]
        state = (torch.zeros((Hv, Dk, Dv), dtype=torch.float32, device=v.device) if initial_states is None
                 else initial_states[i].float())
        if e == s:
            finals[i] = state
            continue
        o, final = one_sequence(qf[s:e].transpose(0, 1), kf[s:e].transpose(0, 1), vf[s:e].transpose(0, 1),
                                gf[s:e].t(), bf[s:e].t(), state, chunk_size)
        out[s:e] = o.transpose(0, 1)
        finals[i] = final
    return out.to(v.dtype), finals.to(state_dtype or torch.float32)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_states: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    use_qk_l2norm: bool = True,
    state_dtype: Optional[torch.dtype] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Prefill / extend over ragged sequences. initial_states [B, Hv, Dk, Dv] (None: zeros).
    Returns (o [T, Hv, Dv] in v's dtype, final states [B, Hv, Dk, Dv] in `state_dtype`, fp32 by default)."""
    return _over_sequences(_chunk_one, q, k, v, g, beta, initial_states, cu_seqlens, use_qk_l2norm, state_dtype,
                           chunk_size)


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_states: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    use_qk_l2norm: bool = True,
    state_dtype: Optional[torch.dtype] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The token-by-token recurrence (the definition), same arguments and results as the chunked
    form; the reference the kernels are checked against."""
    return _over_sequences(_recurrent_one, q, k, v, g, beta, initial_states, cu_seqlens, use_qk_l2norm, state_dtype)


def fused_recurrent_gated_delta_rule_update(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    use_qk_l2norm: bool = True,
    pad_slot_id: int = PAD_SLOT_ID,
) -> torch.Tensor:
    """Decode: one token per sequence. q, k [B, Hk, Dk]; v [B, Hv, Dv]; g, beta [B, Hv];
    state_pool [S, Hv, Dk, Dv], rows `state_indices` [B] advanced in place (a `pad_slot_id` row
    is neither read nor written; its output is zeros). Returns o [B, Hv, Dv] in v's dtype."""
    _check(q, k, v, g, beta)
    qf, kf = _prepare_qk(q, k, v.shape[1], use_qk_l2norm)
    idx = state_indices.to(torch.int64).reshape(-1)
    valid = idx != pad_slot_id
    safe = torch.where(valid, idx, torch.zeros_like(idx))
    state = state_pool[safe].float() * g.float().exp()[:, :, None, None]
    pred = torch.einsum("bhk,bhkv->bhv", kf, state)
    delta = (v.float() - pred) * beta.float()[:, :, None]
    state = state + kf[:, :, :, None] * delta[:, :, None, :]
    out = torch.einsum("bhk,bhkv->bhv", qf, state)
    if bool(valid.all()):
        state_pool[idx] = state.to(state_pool.dtype)
    else:
        state_pool[idx[valid]] = state[valid].to(state_pool.dtype)
        out = out * valid[:, None, None]
    return out.to(v.dtype)
