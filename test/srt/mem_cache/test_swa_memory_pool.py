"""SWAKVPool + SWATokenToKVPoolAllocator: two pools behind one FULL index space."""

import pytest
import torch

from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool, SWATokenToKVPoolAllocator, swa_pool_size

FULL_L, SWA_L = 0, 1


def _make(ps, size=64, size_swa=32, heads=2, dim=4):
    pool = SWAKVPool(size, size_swa, ps, torch.float32, heads, dim, swa_layer_ids=[SWA_L, 3], full_layer_ids=[FULL_L, 2])
    return pool, SWATokenToKVPoolAllocator(size, size_swa, ps, pool)


def test_pool_sizes_from_ratio_and_range_error():
    assert swa_pool_size(1000, 0.8, 1) == 800
    assert swa_pool_size(1000, 0.5, 16) == 496
    assert swa_pool_size(10, 0.01, 16) == 16
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"^--swa-full-tokens-ratio should be in range \(0, 1.0\]\.$"):
            swa_pool_size(1000, bad, 1)


@pytest.mark.parametrize("ps", [1, 16])
def test_alloc_maps_pages_to_pages_and_free_returns_both(ps):
    pool, alloc = _make(ps, size=8 * ps, size_swa=4 * ps)
    full = alloc.alloc_extend([0], [3 * ps - 1], [0])
    assert full.numel() == 3 * ps - 1
    swa = alloc.translate_loc_from_full_to_swa(full)
    assert bool((swa > 0).all()) and len(set(swa.tolist())) == len(swa)
    assert torch.equal(swa % ps, full % ps)  # offsets inside a page are kept
    used = -(-(3 * ps - 1) // ps) * ps
    assert alloc.full_available_size() == 8 * ps - used and alloc.swa_available_size() == 4 * ps - used
    assert alloc.available_size() == 4 * ps - used
    # Continue the partly filled last page: same SWA page for ps > 1.
    more = alloc.alloc_extend([3 * ps - 1], [3 * ps + 1], [int(full[-1])])
    if ps > 1:
        assert int(more[0]) == int(full[-1]) + 1
        assert int(alloc.translate_loc_from_full_to_swa(more[:1])) == int(swa[-1]) + 1
    row = torch.cat([full, more])
    alloc.free(row)
    assert alloc.full_available_size() == 8 * ps and alloc.swa_available_size() == 4 * ps
    assert int(alloc.full_to_swa_index_mapping.count_nonzero()) == 0


@pytest.mark.parametrize("ps", [1, 16])
def test_swa_exhaustion_rolls_back_the_full_allocation(ps):
    pool, alloc = _make(ps, size=8 * ps, size_swa=2 * ps)
    a = alloc.alloc_extend([0], [ps + 1], [0])  # 2 pages of each
    assert alloc.swa_available_size() == 0
    full_before = alloc.full_available_size()
    assert alloc.alloc_extend([0], [ps], [0]) is None
    assert alloc.alloc(ps) is None
    assert alloc.full_available_size() == full_before
    if ps > 1:  # growing inside the request's own last page needs no new SWA page
        grow = alloc.alloc_extend([ps + 1], [ps + 2], [int(a[-1])])
        assert grow is not None and int(grow[0]) == int(a[-1]) + 1
    # free_swa releases only the SWA side.
    alloc.free_swa(a[:ps])
    assert alloc.swa_available_size() == ps and alloc.full_available_size() == full_before
    assert int(alloc.translate_loc_from_full_to_swa(a[:ps]).count_nonzero()) == 0
    assert alloc.alloc_extend([0], [ps], [0]) is not None


def test_transfer_swa_slots_moves_ownership():
    pool, alloc = _make(1, size=16, size_swa=8)
    a = alloc.alloc(3)
    b = alloc.alloc(3)
    alloc.free_swa(a)
    sb = alloc.translate_loc_from_full_to_swa(b).clone()
    alloc.transfer_swa_slots(b, a)
    assert torch.equal(alloc.translate_loc_from_full_to_swa(a), sb)
    assert int(alloc.translate_loc_from_full_to_swa(b).count_nonzero()) == 0
    alloc.free(b)
    alloc.free(a)
    assert alloc.full_available_size() == 16 and alloc.swa_available_size() == 8


def test_kv_buffers_route_by_layer_and_translate_full_locs():
    pool, alloc = _make(1, size=16, size_swa=8)
    loc = alloc.alloc(5)
    gen = torch.Generator().manual_seed(0)
    for layer in (FULL_L, SWA_L, 2, 3):
        k = torch.randn(5, 8, generator=gen)
        v = torch.randn(5, 8, generator=gen)
        pool.set_kv_buffer(layer, loc, k, v)  # FULL locs for every layer
        buf_loc = pool.translate_loc_from_full_to_swa(loc) if pool.is_swa_layer(layer) else loc
        assert pool.get_key_buffer(layer).shape[0] == (9 if pool.is_swa_layer(layer) else 17)
        assert torch.equal(pool.get_key_buffer(layer)[buf_loc].view(5, 8), k)
        assert torch.equal(pool.get_value_buffer(layer)[buf_loc].view(5, 8), v)
        gk, gv = pool.get_kv_at(layer, loc)
        assert torch.equal(gk.view(5, 8), k) and torch.equal(gv.view(5, 8), v)
    # A CPU copy of a request's KV restores into fresh slots of both pools.
    copy = pool.get_cpu_copy(loc)
    ref = {layer: pool.get_kv_at(layer, loc) for layer in (FULL_L, SWA_L, 2, 3)}
    alloc.free(loc)
    new = alloc.alloc(5)
    pool.load_cpu_copy(copy, new)
    for layer, (k, v) in ref.items():
        nk, nv = pool.get_kv_at(layer, new)
        assert torch.equal(nk, k) and torch.equal(nv, v)
    assert pool.get_kv_size_bytes() == (17 * 2 + 9 * 2) * 2 * 2 * 4 * 4
