"""Small Triton helpers the Triton attention backend needs around the paged KV pool.

* `create_kv_indices_triton`: flattens `req_to_token[req_pool_idx, start:start+len]` of every
  request of a batch into one `kv_indices` array addressed by `kv_indptr` (what upstream calls
  `create_flashinfer_kv_indices_triton`), so kernels read a request's KV slots contiguously.
* `store_kv_cache`: scatters the new tokens' K/V rows into the pool at `out_cache_loc`.

Each has a plain-torch twin (`*_torch`) that defines the expected result.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops import use_interpreter_without_gpu

use_interpreter_without_gpu()


@triton.jit
def create_kv_indices_triton(
    req_to_token_ptr,  # [max_batch, max_context_len]
    req_pool_indices_ptr,
    page_kernel_lens_ptr,
    kv_indptr,
    kv_start_idx,
    kv_indices_ptr,
    req_to_token_ptr_stride: tl.constexpr,
    HAS_START: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(axis=0)
    req_pool_index = tl.load(req_pool_indices_ptr + pid).to(tl.int64)
    kv_indices_offset = tl.load(kv_indptr + pid).to(tl.int64)
    kv_start = 0
    if HAS_START:
        kv_start = tl.load(kv_start_idx + pid).to(tl.int64)
    kv_end = kv_start + tl.load(page_kernel_lens_ptr + pid).to(tl.int64)
    num_loop = tl.cdiv(kv_end - kv_start, BLOCK_SIZE)
    row = req_to_token_ptr + req_pool_index * req_to_token_ptr_stride
    for i in range(num_loop):
        offset = tl.arange(0, BLOCK_SIZE).to(tl.int64) + i * BLOCK_SIZE
        mask = offset < kv_end - kv_start
        data = tl.load(row + kv_start + offset, mask=mask)
        tl.store(kv_indices_ptr + kv_indices_offset + offset, data, mask=mask)


def build_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    kv_lens: torch.Tensor,
    kv_start: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Returns (kv_indptr [B+1] int32, kv_indices [sum(kv_lens)] int64) for the batch's KV slots."""
    bs = int(req_pool_indices.shape[0])
    device = req_to_token.device
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=device)
    kv_indptr[1:] = torch.cumsum(kv_lens, dim=0)
    total = int(kv_indptr[-1].item()) if bs else 0
    kv_indices = torch.empty(max(total, 1), dtype=req_to_token.dtype, device=device)
    if bs and total:
        create_kv_indices_triton[(bs,)](
            req_to_token,
            req_pool_indices,
            kv_lens,
            kv_indptr,
            kv_start if kv_start is not None else kv_indptr,
            kv_indices,
            req_to_token.stride(0),
            HAS_START=kv_start is not None,
            BLOCK_SIZE=512,
        )
    return kv_indptr, kv_indices[:total]


def build_kv_indices_torch(req_to_token, req_pool_indices, kv_lens, kv_start=None):
    """Plain-torch definition of `build_kv_indices`."""
    pieces = []
    for i in range(int(req_pool_indices.shape[0])):
        s = int(kv_start[i]) if kv_start is not None else 0
        pieces.append(req_to_token[int(req_pool_indices[i]), s : s + int(kv_lens[i])])
    kv_indptr = torch.zeros(len(pieces) + 1, dtype=torch.int32, device=req_to_token.device)
    kv_indptr[1:] = torch.cumsum(kv_lens, dim=0)
    kv_indices = torch.cat(pieces) if pieces else req_to_token.new_empty(0)
    return kv_indptr, kv_indices


@triton.jit
def _store_kv_kernel(
    K, V, K_Buffer, V_Buffer, Loc,
    stride_k, stride_v, stride_kb, stride_vb,
    NK: tl.constexpr, NV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    tok = tl.program_id(0)
    loc = tl.load(Loc + tok).to(tl.int64)
    ok = tl.arange(0, BLOCK_K)
    ov = tl.arange(0, BLOCK_V)
    k = tl.load(K + tok.to(tl.int64) * stride_k + ok, mask=ok < NK)
    v = tl.load(V + tok.to(tl.int64) * stride_v + ov, mask=ov < NV)
    tl.store(K_Buffer + loc * stride_kb + ok, k.to(K_Buffer.dtype.element_ty), mask=ok < NK)
    tl.store(V_Buffer + loc * stride_vb + ov, v.to(V_Buffer.dtype.element_ty), mask=ov < NV)


def store_kv_cache(k_buffer: torch.Tensor, v_buffer: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """k_buffer[loc[i]] = k[i] (and v): k is [T, kv_heads, head_dim] or [T, kv_heads*head_dim]."""
    n = int(loc.shape[0])
    if n == 0:
        return
    k = k.reshape(n, -1)
    v = v.reshape(n, -1)
    nk, nv = k.shape[1], v.shape[1]
    assert k_buffer[0].numel() == nk and v_buffer[0].numel() == nv
    assert k.stride(1) == 1 and v.stride(1) == 1
    assert k_buffer.is_contiguous() and v_buffer.is_contiguous()
    _store_kv_kernel[(n,)](
        k, v, k_buffer, v_buffer, loc,
        k.stride(0), v.stride(0), k_buffer.stride(0), v_buffer.stride(0),
        NK=nk, NV=nv, BLOCK_K=triton.next_power_of_2(nk), BLOCK_V=triton.next_power_of_2(nv),
    )


def store_kv_cache_torch(k_buffer, v_buffer, loc, k, v) -> None:
    k_buffer[loc] = k.reshape(k_buffer[loc].shape).to(k_buffer.dtype)
    v_buffer[loc] = v.reshape(v_buffer[loc].shape).to(v_buffer.dtype)
