"""Block arithmetic of one chunk: runs, per-layer addresses, metadata row, Mamba slot, mismatch errors."""

import types

import numpy as np
import pytest

from sglang.srt.disaggregation.base import KVArgs
from sglang.srt.disaggregation.mooncake.blocks import build_chunk_blocks, contiguous_runs
from sglang.srt.disaggregation.mooncake.conn import TransferKVChunk
from sglang.srt.disaggregation.utils import StateType, group_concurrent_contiguous


def test_contiguous_runs_agree_with_group_concurrent_contiguous():
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(1, 40))
        src = np.cumsum(rng.integers(1, 3, size=n))
        dst = rng.permutation(200)[:n] if rng.random() < 0.3 else np.cumsum(rng.integers(1, 3, size=n))
        s0, d0, ln = contiguous_runs(src, dst)
        gs, gd = group_concurrent_contiguous(src, dst)
        assert s0.tolist() == [g[0] for g in gs] and d0.tolist() == [g[0] for g in gd] and ln.tolist() == [len(g) for g in gs]


def _args(item_lens=(100, 60), aux=(64, 128), states=None):
    a = KVArgs()
    a.kv_data_ptrs = [10_000, 20_000]
    a.kv_item_lens = list(item_lens)
    a.aux_data_ptrs = [1_000, 2_000][: len(aux)]
    a.aux_item_lens = list(aux)
    if states:
        a.state_types = [StateType.MAMBA]
        a.state_data_ptrs = [[50_000, 60_000]]
        a.state_item_lens = [list(states)]
    return a


def _reg(item_lens=(100, 60), states=None):
    return types.SimpleNamespace(
        dst_kv_ptrs=[110_000, 120_000],
        dst_kv_item_lens=list(item_lens),
        dst_aux_ptrs=[3_000, 4_000],
        dst_state_data_ptrs=[[70_000, 80_000]] if states else [],
        dst_state_item_lens=[list(states)] if states else [],
    )


def _info(dst_pages, aux=None, state=None, decode_prefix_len=0):
    return types.SimpleNamespace(dst_kv_indices=np.array(dst_pages, np.int32), dst_aux_index=aux,
                                 dst_state_indices=state or [], decode_prefix_len=decode_prefix_len)


def test_pages_the_decode_radix_cache_holds_are_not_sent():
    """Page size 4, decode holds 8 tokens (2 pages) and gave pages for the other 3 of 5: the first
    chunk (pages 0-2) sends only page 2, the second (pages 3-4) both, to decode pages [1], [2, 3]."""
    a = _args()
    a.page_size = 4
    info = _info([1, 2, 3], decode_prefix_len=8)
    first = TransferKVChunk(1, np.array([10, 11, 12], np.int32), slice(0, 3), False, None, None)
    srcs, dsts, lens = build_chunk_blocks(a, _reg(), info, first)
    assert srcs == [10_000 + 1200, 20_000 + 720] and dsts == [110_000 + 100, 120_000 + 60] and lens == [100, 60]
    second = TransferKVChunk(1, np.array([13, 14], np.int32), slice(3, 5), False, None, None)
    srcs, dsts, lens = build_chunk_blocks(a, _reg(), info, second)
    assert srcs == [10_000 + 1300, 20_000 + 780] and dsts == [110_000 + 200, 120_000 + 120] and lens == [200, 120]
    inside = TransferKVChunk(1, np.array([10], np.int32), slice(0, 1), False, None, None)
    assert build_chunk_blocks(a, _reg(), info, inside) == ([], [], [])
    with pytest.raises(RuntimeError, match="decode provided 1"):  # decode gave too few pages
        build_chunk_blocks(a, _reg(), _info([1, 2], decode_prefix_len=8), second)


def test_kv_blocks_non_last_chunk():
    chunk = TransferKVChunk(1, np.array([2, 3, 8], np.int32), slice(0, 3), False, None, None)
    srcs, dsts, lens = build_chunk_blocks(_args(), _reg(), _info([5, 6, 7, 9]), chunk)
    # runs: (2,5)x2, (8,7)x1; per buffer
    assert srcs == [10_000 + 200, 10_000 + 800, 20_000 + 120, 20_000 + 480]
    assert dsts == [110_000 + 500, 110_000 + 700, 120_000 + 300, 120_000 + 420]
    assert lens == [200, 100, 120, 60]


def test_last_chunk_adds_metadata_row_and_mamba_slot():
    chunk = TransferKVChunk(1, np.array([4], np.int32), slice(3, 4), True, 2, [[3]])
    srcs, dsts, lens = build_chunk_blocks(_args(states=(24, 40)), _reg(states=(24, 40)), _info([5, 6, 7, 9], aux=1, state=[[6]]), chunk)
    assert list(zip(srcs, dsts, lens))[2:] == [
        (1_000 + 2 * 64, 3_000 + 64, 64),
        (2_000 + 2 * 128, 4_000 + 128, 128),
        (50_000 + 3 * 24, 70_000 + 6 * 24, 24),
        (60_000 + 3 * 40, 80_000 + 6 * 40, 40),
    ]
    assert srcs[:2] == [10_000 + 400, 20_000 + 240] and dsts[:2] == [110_000 + 900, 120_000 + 540]


def test_mismatches_raise_clear_errors():
    chunk = TransferKVChunk(1, np.array([1, 2], np.int32), slice(0, 2), True, None, [[0]])
    with pytest.raises(RuntimeError, match="decode provided 1"):
        build_chunk_blocks(_args(), _reg(), _info([1]), chunk)
    with pytest.raises(RuntimeError, match=r"KV item length mismatch for buffer 1 \(src=60, dst=61\)"):
        build_chunk_blocks(_args(), _reg(item_lens=(100, 61)), _info([1, 2]), chunk)
    with pytest.raises(RuntimeError) as e:
        build_chunk_blocks(_args(states=(24, 40)), _reg(states=(24, 48)), _info([1, 2], state=[[1]]), chunk)
    assert str(e.value) == (
        "Prefill/Decode Mamba slot size mismatch (src=40, dst=48). Configure matching persistent state layouts on both peers."
    )
    two = TransferKVChunk(1, np.array([1, 2], np.int32), slice(0, 2), True, None, [[0, 1]])
    with pytest.raises(AssertionError, match="Mamba should have single state index"):
        build_chunk_blocks(_args(states=(24, 40)), _reg(states=(24, 40)), _info([1, 2], state=[[1]]), two)


def test_state_indices_on_one_side_only_is_an_error():
    chunk = TransferKVChunk(3, np.array([1], np.int32), slice(0, 1), True, None, [[2]])
    with pytest.raises(RuntimeError, match="mamba state indices given by prefill only"):
        build_chunk_blocks(_args(states=(24, 40)), _reg(states=(24, 40)), _info([1]), chunk)
    no_src = TransferKVChunk(3, np.array([1], np.int32), slice(0, 1), True, None, None)
    with pytest.raises(RuntimeError, match="given by decode only"):
        build_chunk_blocks(_args(states=(24, 40)), _reg(states=(24, 40)), _info([1], state=[[4]]), no_src)
    # neither side: a request without state (nothing to send) is fine
    assert len(build_chunk_blocks(_args(states=(24, 40)), _reg(states=(24, 40)), _info([1]), no_src)[0]) == 2
