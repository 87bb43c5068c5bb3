"""Turn one request chunk into (src, dst, len) transfer blocks (reference 5.8).

Pulled out of conn.py so the address arithmetic can be read (and tested) on its own:
* KV: (prefill page, decode page) pairs are split into runs contiguous on both sides; each run is
  one block per layer buffer (every layer's K buffers, then V buffers), `len = item_len * run`.
  Pages the decode already holds (`decode_prefix_len`, its radix-cache hit) are skipped.
* Metadata row (last chunk only): row `aux_index` of every aux buffer -> row `dst_aux_index`.
* State (last chunk only): Mamba: one slot per request, one block per state tensor; other state
  types (SWA, ...): page runs like KV with that tensor's item_len.
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

from sglang.srt.disaggregation.utils import StateType


def contiguous_runs(src: np.ndarray, dst: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (src_starts, dst_starts, run_lengths) of the runs `group_concurrent_contiguous` would produce."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if src.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    brk = np.flatnonzero((np.diff(src) != 1) | (np.diff(dst) != 1)) + 1
    starts = np.concatenate(([0], brk))
    ends = np.concatenate((brk, [src.size]))
    return src[starts], dst[starts], ends - starts


def _page_blocks(src_ptrs, dst_ptrs, item_lens, dst_item_lens, src_pages, dst_pages, what: str):
    if len(src_ptrs) != len(dst_ptrs):
        raise RuntimeError(f"Prefill/Decode {what} buffer count mismatch (src={len(src_ptrs)}, dst={len(dst_ptrs)})")
    s0, d0, n = contiguous_runs(src_pages, dst_pages)
    srcs: List[int] = []
    dsts: List[int] = []
    lens: List[int] = []
    for i, (sp, dp, il) in enumerate(zip(src_ptrs, dst_ptrs, item_lens)):
        if dst_item_lens and dst_item_lens[i] != il:
            raise RuntimeError(f"Prefill/Decode {what} item length mismatch for buffer {i} (src={il}, dst={dst_item_lens[i]})")
        srcs.extend((sp + s0 * il).tolist())
        dsts.extend((dp + d0 * il).tolist())
        lens.extend((n * il).tolist())
    return srcs, dsts, lens


def mamba_state_layout_mismatch(kv_args, reg):
    """The error a decode registration's Mamba state layout must be rejected with (None: it
    matches): checked when the peer registers, so no request is prefilled for a peer whose
    state slots differ from ours (a different --mamba-ssm-dtype, model or TP layout)."""
    for t, state_type in enumerate(kv_args.state_types):
        if state_type != StateType.MAMBA:
            continue
        item_lens = kv_args.state_item_lens[t]
        dst_item_lens = reg.dst_state_item_lens[t] if t < len(reg.dst_state_item_lens) else []
        if len(item_lens) != len(dst_item_lens):
            return f"Prefill/Decode Mamba state tensor count mismatch (src={len(item_lens)}, dst={len(dst_item_lens)})"
        for il, dil in zip(item_lens, dst_item_lens):
            if il != dil:
                return (f"Prefill/Decode Mamba slot size mismatch (src={il}, dst={dil}). "
                        "Configure matching persistent state layouts on both peers.")
    return None


def chunk_pages(info, chunk, page_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """-> (prefill pages, decode pages) of one chunk. A decode server with a radix cache already
    holds the first `decode_prefix_len` tokens (whole pages) and gave pages for the rest only: the
    chunk's pages before that point are not sent."""
    src_pages = np.asarray(chunk.prefill_kv_indices, dtype=np.int64)
    skip = (info.decode_prefix_len or 0) // page_size
    start = chunk.index_slice.start
    lo = max(start, skip)
    src_pages = src_pages[lo - start:]
    dst_pages = np.asarray(info.dst_kv_indices, dtype=np.int64)[lo - skip: lo - skip + len(src_pages)]
    return src_pages, dst_pages


def build_chunk_blocks(kv_args, reg, info, chunk) -> Tuple[List[int], List[int], List[int]]:
    src_pages, dst_pages = chunk_pages(info, chunk, kv_args.page_size)
    if len(src_pages) != len(dst_pages):
        raise RuntimeError(
            f"Request {chunk.room}: prefill sends {len(src_pages)} pages for slice "
            f"[{chunk.index_slice.start}, {chunk.index_slice.stop}) but decode provided {len(dst_pages)}"
        )
    srcs, dsts, lens = _page_blocks(
        kv_args.kv_data_ptrs, reg.dst_kv_ptrs, kv_args.kv_item_lens, reg.dst_kv_item_lens, src_pages, dst_pages, "KV"
    )
    if not chunk.is_last:
        return srcs, dsts, lens

    if chunk.prefill_aux_index is not None and info.dst_aux_index is not None:
        if len(kv_args.aux_data_ptrs) != len(reg.dst_aux_ptrs):
            raise RuntimeError(
                f"Prefill/Decode metadata buffer count mismatch (src={len(kv_args.aux_data_ptrs)}, dst={len(reg.dst_aux_ptrs)})"
            )
        for sp, dp, il in zip(kv_args.aux_data_ptrs, reg.dst_aux_ptrs, kv_args.aux_item_lens):
            srcs.append(sp + chunk.prefill_aux_index * il)
            dsts.append(dp + info.dst_aux_index * il)
            lens.append(il)

    state_indices = chunk.state_indices or []
    for t, state_type in enumerate(kv_args.state_types):
        has_src = t < len(state_indices) and len(state_indices[t]) > 0
        has_dst = t < len(info.dst_state_indices) and len(info.dst_state_indices[t]) > 0
        if not has_src and not has_dst:
            continue
        if has_src != has_dst:  # silently dropping recurrent state would corrupt decode's outputs
            raise RuntimeError(
                f"Request {chunk.room}: {state_type.value} state indices given by "
                f"{'prefill' if has_src else 'decode'} only; both peers must pass state_indices"
            )
        src_idx, dst_idx = list(state_indices[t]), list(info.dst_state_indices[t])
        src_ptrs, item_lens = kv_args.state_data_ptrs[t], kv_args.state_item_lens[t]
        dst_ptrs = reg.dst_state_data_ptrs[t] if t < len(reg.dst_state_data_ptrs) else []
        dst_item_lens = reg.dst_state_item_lens[t] if t < len(reg.dst_state_item_lens) else []
        if state_type == StateType.MAMBA:
            assert len(src_idx) == 1, "Mamba should have single state index"
            assert len(dst_idx) == 1, "Mamba should have single state index"
            if len(src_ptrs) != len(dst_ptrs):
                raise RuntimeError(f"Prefill/Decode Mamba state tensor count mismatch (src={len(src_ptrs)}, dst={len(dst_ptrs)})")
            for k, (sp, dp, il) in enumerate(zip(src_ptrs, dst_ptrs, item_lens)):
                dil = dst_item_lens[k] if k < len(dst_item_lens) else il
                if dil != il:
                    raise RuntimeError(
                        f"Prefill/Decode Mamba slot size mismatch (src={il}, dst={dil}). "
                        "Configure matching persistent state layouts on both peers."
                    )
                srcs.append(sp + il * src_idx[0])
                dsts.append(dp + il * dst_idx[0])
                lens.append(il)
        else:
            n = min(len(src_idx), len(dst_idx))
            s, d, ln = _page_blocks(src_ptrs, dst_ptrs, item_lens, dst_item_lens, src_idx[-n:] if n else [], dst_idx[-n:] if n else [], state_type.value)
            srcs += s
            dsts += d
            lens += ln
    return srcs, dsts, lens
