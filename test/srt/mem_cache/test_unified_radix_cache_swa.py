"""UnifiedRadixCache with FULL + SWA components on the real SWA pool: tombstones outside the
window, window-aware matching, the eviction cascade, tombstone recovery, SWA locks."""

import random

import pytest

from mem_cache_test_driver import SWA_LAYER, FULL_LAYER, ReqLike, build, fingerprints
from sglang.srt.mem_cache.radix_key import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import EvictParams, InsertParams, MatchPrefixParams

SWA = ComponentType.SWA


def _insert(sim, tokens):
    slots = sim.alloc.alloc(len(tokens))
    fp = fingerprints(tokens, None).view(-1, 1)
    sim.kv.set_kv_buffer(FULL_LAYER, slots, fp, fp)
    sim.kv.set_kv_buffer(SWA_LAYER, slots, fp, fp)
    res = sim.cache.insert(InsertParams(RadixKey(tokens), slots))
    sim.alloc.free(slots[: res.prefix_len])
    return res


def _match_len(sim, tokens):
    m = sim.cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens)))
    sim.verify_prefix(tokens, None, m.device_indices)
    return m.device_prefix_len


def _two_branches(ps):
    """Tree: N0 = A[:6u] (internal), N1 = A[6u:12u] (leaf), N2 = B's 6u-token branch (leaf);
    N1 touched last so the LRU order is N2 < N0 < N1. Window = 4u."""
    u = ps
    sim = build(ps, 64 * u, window=4 * u, swa_ratio=1.0)
    a = [1 + i % 7 for i in range(12 * u)]
    b = a[: 6 * u] + [50 + i % 5 for i in range(6 * u)]
    _insert(sim, a)
    _insert(sim, b)
    assert _match_len(sim, a + [0]) == 12 * u
    (n0,) = sim.cache.root_node.children.values()
    return sim, u, a, b, n0


@pytest.mark.parametrize("ps", [1, 16])
def test_swa_eviction_tombstones_internal_nodes_and_match_needs_a_window(ps):
    sim, u, a, b, n0 = _two_branches(ps)
    swa0, full0 = sim.alloc.swa_available_size(), sim.alloc.full_available_size()
    # Oldest first: the B leaf is deleted (both pools), then N0 is tombstoned (SWA pool only).
    res = sim.cache.evict(EvictParams(swa_num_tokens=1))
    assert (res.swa_num_tokens_evicted, res.num_tokens_evicted) == (6 * u, 6 * u)
    res = sim.cache.evict(EvictParams(swa_num_tokens=1))
    assert (res.swa_num_tokens_evicted, res.num_tokens_evicted) == (6 * u, 0)
    assert n0.data(SWA).value is None and n0.full_value is not None and not n0.deleted
    assert sim.alloc.swa_available_size() == swa0 + 12 * u and sim.alloc.full_available_size() == full0 + 6 * u
    sim.check()
    # Matching through the tombstone needs >= window tokens of SWA data after it.
    assert _match_len(sim, a + [0]) == 12 * u
    assert _match_len(sim, a[: 6 * u] + [0]) == 0
    assert _match_len(sim, a[: 9 * u] + [0]) == 0  # 3u < window after the tombstone
    assert _match_len(sim, a[: 10 * u] + [0]) == 10 * u  # exactly the window: splits N1
    sim.check()
    sim.drain()


@pytest.mark.parametrize("ps", [1, 16])
def test_cascade_leaf_deletion_takes_data_less_parents(ps):
    sim, u, a, b, n0 = _two_branches(ps)
    sim.cache.evict(EvictParams(swa_num_tokens=12 * u))  # B leaf deleted, N0 tombstoned
    assert n0.data(SWA).value is None
    # Evicting the last leaf leaves N0 a leaf without SWA data: it goes too, FULL included.
    res = sim.cache.evict(EvictParams(num_tokens=1))
    assert res.num_tokens_evicted == 12 * u and res.swa_num_tokens_evicted == 6 * u
    assert n0.deleted and sim.cache.total_size() == 0
    sim.drain()


@pytest.mark.parametrize("ps", [1, 16])
def test_insert_over_a_tombstone_recovers_it_from_the_request(ps):
    sim, u, a, b, n0 = _two_branches(ps)
    sim.cache.evict(EvictParams(swa_num_tokens=12 * u))
    assert n0.data(SWA).value is None
    req = ReqLike(origin_input_ids=a[: 6 * u] + [90 + i % 3 for i in range(2 * u + 1)])
    assert sim.admit(req) == 0  # the tombstone cannot serve the prefix
    sim.prefill(req, chunk=1000, first_token=1)
    sim.check()
    assert n0.data(SWA).value is not None  # revived with the request's SWA slots
    assert _match_len(sim, a[: 6 * u] + [0]) == 6 * u
    sim.finish(req)
    sim.check()
    sim.drain()


@pytest.mark.parametrize("ps", [1, 16])
def test_request_kv_that_slid_out_of_the_window_is_cached_as_a_tombstone(ps):
    u = ps
    sim = build(ps, 64 * u, window=2 * u, swa_ratio=1.0)
    prompt = [3 + i % 5 for i in range(3 * u)]
    req = ReqLike(origin_input_ids=prompt)
    sim.admit(req)
    sim.prefill(req, chunk=1000, first_token=1)
    for t in range(4 * u):
        sim.decode(req, 1 + t % 4)
    sim.check()
    seq = req.origin_input_ids + req.output_ids
    sim.finish(req)
    sim.check()
    # The prompt (tree-owned since cache_unfinished_req, never freed by the request) keeps its
    # SWA data; decode positions the request released became a tombstone; the tail has data.
    (head,) = sim.cache.root_node.children.values()
    (tomb,) = head.children.values()
    (tail,) = tomb.children.values()
    assert len(head) == 3 * u and head.data(SWA).value is not None
    assert tomb.data(SWA).value is None and tail.data(SWA).value is not None
    assert len(tail) >= 2 * u and not tail.children
    committed = (len(seq) - 1) // ps * ps
    assert _match_len(sim, seq) == committed
    assert _match_len(sim, seq[: 3 * u + len(tomb)] + [0]) == 3 * u
    sim.drain()


@pytest.mark.parametrize("ps", [1, 16])
def test_swa_lock_covers_the_window_only(ps):
    u = ps
    sim = build(ps, 64 * u, window=4 * u, swa_ratio=1.0)
    a = [1 + i % 6 for i in range(20 * u)]
    _insert(sim, a)
    _insert(sim, a[: 10 * u] + [99] * u)
    m = sim.cache.match_prefix(MatchPrefixParams(RadixKey(a + [0])))
    receipt = sim.cache.inc_lock_ref(m.last_device_node)
    assert sim.cache.swa_protected_size() == 10 * u  # the leaf alone covers the window
    assert sim.cache.protected_size() == 20 * u
    sim.cache.evict(EvictParams(swa_num_tokens=1 << 20))
    n1 = m.last_device_node
    assert n1.data(SWA).value is not None and n1.parent.data(SWA).value is None
    assert _match_len(sim, a + [0]) == 20 * u
    sim.check()
    sim.cache.dec_lock_ref(n1, receipt)
    assert sim.cache.swa_protected_size() == 0 and sim.cache.protected_size() == 0
    sim.check()
    sim.drain()


@pytest.mark.parametrize("ps,seed", [(1, 0), (1, 1), (16, 2), (16, 3)])
def test_random_workload_with_swa_keeps_kv_correct_and_leaks_nothing(ps, seed):
    rng = random.Random(seed)
    window = 8 if ps == 1 else ps
    sim = build(ps, 256 if ps == 1 else 320, window=window, swa_ratio=1.0 if ps == 1 else 0.8, max_ctx=256)
    systems = [[rng.randint(1, 4) for _ in range(rng.randint(ps, 48))] for _ in range(4)]
    hits = 0
    for step in range(300):
        action = rng.random()
        if action < 0.3 and len(sim.active) < 3:
            prompt = rng.choice(systems) + [rng.randint(1, 4) for _ in range(rng.randint(1, 24))]
            req = ReqLike(origin_input_ids=prompt, extra_key=rng.choice([None, None, "ns"]))
            hits += sim.admit(req) > 0
            sim.prefill(req, chunk=rng.choice([ps, 2 * ps, 1000]), first_token=rng.randint(1, 4))
        elif action < 0.97 and sim.active:
            req = rng.choice(sim.active)
            if len(req.output_ids) > rng.randint(1, 2 * window):
                sim.finish(req, is_insert=rng.random() < 0.9)
            else:
                sim.decode(req, rng.randint(1, 4))
        else:
            sim.cache.evict(EvictParams(swa_num_tokens=rng.randint(1, 4 * ps)))
        sim.check()
    assert hits > 3 and sim.evictions_under_pressure > 0, (hits, sim.evictions_under_pressure)
    sim.drain()
