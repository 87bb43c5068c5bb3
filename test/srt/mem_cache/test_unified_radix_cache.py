"""UnifiedRadixCache over the FULL component: match/split/insert/evict/locks, page sizes 1 and
16, extra_key namespaces, the disabled mode and the request lifecycle, on the real allocator."""

import random

import pytest
import torch

from mem_cache_test_driver import ReqLike, build, fingerprints
from sglang.srt.mem_cache.radix_key import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import EvictParams, InsertParams, MatchPrefixParams


def _insert(sim, tokens, extra_key=None):
    """Insert like a finished request would: fresh slots with the prefix's KV; free duplicates."""
    n = len(tokens)
    slots = sim.alloc.alloc(n)
    fp = fingerprints(tokens, extra_key).view(-1, 1)
    sim.kv.set_kv_buffer(0, slots, fp, fp)
    res = sim.cache.insert(InsertParams(RadixKey(tokens, extra_key), slots))
    sim.alloc.free(slots[: res.prefix_len])
    return res


def _match(sim, tokens, extra_key=None):
    m = sim.cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens, extra_key)))
    sim.verify_prefix(tokens, extra_key, m.device_indices)
    return m


@pytest.mark.parametrize("ps", [1, 16])
def test_insert_match_split_and_duplicates(ps):
    sim = build(ps, 64 * ps)
    a = list(range(1, 6 * ps + 1))
    assert _insert(sim, a).prefix_len == 0
    b = a[: 3 * ps] + [999] * (2 * ps)
    res = _insert(sim, b)
    assert res.prefix_len == 3 * ps
    assert sim.cache.total_size() == 8 * ps
    # The shared 3 pages now form one node with two children.
    (shared,) = sim.cache.root_node.children.values()
    assert len(shared) == 3 * ps and len(shared.children) == 2
    # A partial match ending inside a node splits it, page-aligned.
    q = 4 * ps + ps // 2 + 1
    m = _match(sim, a[:q] + [7777])
    assert m.device_prefix_len == q // ps * ps
    assert len(m.last_device_node) == q // ps * ps - 3 * ps and len(m.last_device_node.children) == 1
    assert _match(sim, [5555] + a).device_prefix_len == 0
    sim.check()
    sim.drain()


def test_match_returns_best_prefix_and_pretty_print():
    sim = build(1, 128)
    _insert(sim, [1, 2, 3, 4, 5])
    _insert(sim, [1, 2, 9])
    assert _match(sim, [1, 2, 3, 4, 5, 6]).device_prefix_len == 5
    assert _match(sim, [1, 2, 9, 9]).device_prefix_len == 3
    text = sim.cache.pretty_print()
    assert "[1, 2]" in text and "#tokens: 6" in text
    sim.drain()


@pytest.mark.parametrize("ps", [1, 16])
def test_lock_protects_and_sizes_move(ps):
    sim = build(ps, 64 * ps)
    a = list(range(100, 100 + 4 * ps))
    _insert(sim, a)
    _insert(sim, a[:2 * ps] + list(range(500, 500 + 2 * ps)))
    m = _match(sim, a)
    receipt = sim.cache.inc_lock_ref(m.last_device_node)
    assert sim.cache.protected_size() == 4 * ps and sim.cache.evictable_size() == 2 * ps
    res = sim.cache.evict(EvictParams(num_tokens=1 << 20))
    assert res.num_tokens_evicted == 2 * ps  # only the unlocked branch goes
    assert sim.cache.total_size() == 4 * ps
    sim.check()
    sim.cache.dec_lock_ref(m.last_device_node, receipt)
    assert sim.cache.protected_size() == 0 and sim.cache.evictable_size() == 4 * ps
    sim.drain()


def test_lock_receipt_survives_later_splits():
    sim = build(1, 256)
    a = list(range(1, 41))
    _insert(sim, a)
    m = _match(sim, a)
    receipt = sim.cache.inc_lock_ref(m.last_device_node)
    # Split the locked path twice: by a diverging insert and by a shorter match.
    _insert(sim, a[:10] + [77, 78])
    _match(sim, a[:25] + [1000])
    sim.check()
    assert sim.cache.protected_size() == 40
    sim.cache.dec_lock_ref(m.last_device_node, receipt)
    sim.check()
    assert sim.cache.protected_size() == 0
    other = _match(sim, a[:10])
    with pytest.raises(AssertionError):
        sim.cache.dec_lock_ref(other.last_device_node, receipt)
    sim.drain()


def test_lru_order_parent_after_children():
    sim = build(1, 256)
    for base in (10, 20, 30):
        _insert(sim, [1, 2, base, base + 1])
    _match(sim, [1, 2, 10, 11])  # touch the first branch
    res = sim.cache.evict(EvictParams(num_tokens=1))
    assert res.num_tokens_evicted == 2
    assert _match(sim, [1, 2, 20, 21]).device_prefix_len == 2  # least recent went first
    assert _match(sim, [1, 2, 30, 31]).device_prefix_len == 4
    assert _match(sim, [1, 2, 10, 11]).device_prefix_len == 4
    # Leaves go before their parent; the parent becomes an evictable leaf once they are gone.
    assert sim.cache.evict(EvictParams(num_tokens=4)).num_tokens_evicted == 4
    assert sim.cache.total_size() == 2
    assert sim.cache.evict(EvictParams(num_tokens=1)).num_tokens_evicted == 2
    assert sim.cache.total_size() == 0
    sim.drain()


def test_lfu_evicts_least_hit_first():
    sim = build(1, 256, eviction_policy="lfu")
    _insert(sim, [1, 2, 3])
    _insert(sim, [5, 6, 7])
    for _ in range(3):
        _match(sim, [1, 2, 3])
    _match(sim, [5, 6, 7])  # most recent, but hit fewer times
    sim.cache.evict(EvictParams(num_tokens=1))
    assert _match(sim, [5, 6, 7]).device_prefix_len == 0
    assert _match(sim, [1, 2, 3]).device_prefix_len == 3
    sim.drain()


@pytest.mark.parametrize("ps", [1, 16])
def test_extra_key_namespaces_never_share(ps):
    sim = build(ps, 64 * ps)
    toks = list(range(3, 3 + 3 * ps))
    assert _insert(sim, toks, "lora-a").prefix_len == 0
    assert _insert(sim, toks, "lora-b").prefix_len == 0
    assert _insert(sim, toks).prefix_len == 0
    assert len(sim.cache.root_node.children) == 3 and sim.cache.total_size() == 9 * ps
    for ns in ("lora-a", "lora-b", None):
        assert _match(sim, toks + [0], ns).device_prefix_len == 3 * ps
    assert _match(sim, toks, "lora-c").device_prefix_len == 0
    sim.drain()


@pytest.mark.parametrize("ps", [1, 16])
def test_disabled_cache_caches_nothing_and_frees_everything(ps):
    sim = build(ps, 32 * ps, disable=True)
    req = ReqLike(origin_input_ids=list(range(1, 3 * ps + 4)))
    assert sim.admit(req) == 0
    sim.prefill(req, chunk=ps, first_token=5)
    assert len(req.prefix_indices) == len(req.origin_input_ids)  # all computed tokens
    for t in range(ps + 2):
        sim.decode(req, t)
    sim.check()
    sim.finish(req)
    assert sim.cache.total_size() == 0 and sim.full_available() == sim.full_free0
    assert sim.cache.match_prefix(MatchPrefixParams(RadixKey(req.origin_input_ids))).device_prefix_len == 0
    assert sim.cache.insert(InsertParams(RadixKey([1, 2]), torch.tensor([5, 6]))).prefix_len == 0
    sim.drain()


@pytest.mark.parametrize("ps", [1, 16])
def test_request_lifecycle_second_request_hits_the_prefix(ps):
    sim = build(ps, 64 * ps)
    prompt = list(range(40, 40 + 5 * ps + 3))
    r1 = ReqLike(origin_input_ids=prompt)
    sim.admit(r1)
    sim.prefill(r1, chunk=2 * ps, first_token=1)
    assert r1.cache_protected_len == len(prompt) // ps * ps
    assert len(r1.prefix_indices) == len(prompt)
    for t in range(3):
        sim.decode(r1, t)
    sim.check()
    sim.finish(r1)
    sim.check()
    committed = len(prompt) + 3
    assert sim.cache.total_size() == committed // ps * ps
    r2 = ReqLike(origin_input_ids=prompt + [1, 0, 1, 2, 3])
    assert sim.admit(r2) == committed // ps * ps
    sim.prefill(r2, chunk=1000, first_token=9)
    sim.finish(r2, is_insert=False)
    sim.check()
    sim.drain()


def test_reset_forgets_the_tree():
    sim = build(1, 64)
    _insert(sim, [1, 2, 3])
    sim.cache.reset()
    assert sim.cache.total_size() == 0 and not sim.cache.root_node.children
    assert sim.cache.match_prefix(MatchPrefixParams(RadixKey([1, 2, 3]))).device_prefix_len == 0


@pytest.mark.parametrize("ps,seed", [(1, 0), (1, 1), (16, 2), (16, 3)])
def test_random_workload_keeps_kv_correct_and_leaks_nothing(ps, seed):
    """Shared system prompts, namespaces, chunked prefill, decode, aborts and a pool small
    enough that allocations must evict: every handed-out prefix must hold its own KV and
    every slot stays accounted for."""
    rng = random.Random(seed)
    sim = build(ps, 256 if ps == 1 else 320, max_ctx=256)
    systems = [[rng.randint(1, 4) for _ in range(rng.randint(0, 48))] for _ in range(4)]
    hits = 0
    for step in range(300):
        action = rng.random()
        if action < 0.3 and len(sim.active) < 3:
            prompt = rng.choice(systems) + [rng.randint(1, 4) for _ in range(rng.randint(1, 24))]
            req = ReqLike(origin_input_ids=prompt, extra_key=rng.choice([None, None, "ns"]))
            hits += sim.admit(req) > 0
            sim.prefill(req, chunk=rng.choice([ps, 2 * ps, 1000]), first_token=rng.randint(1, 4))
        elif action < 0.95 and sim.active:
            req = rng.choice(sim.active)
            if len(req.output_ids) > rng.randint(1, 8):
                sim.finish(req, is_insert=rng.random() < 0.9)
            else:
                sim.decode(req, rng.randint(1, 4))
        else:
            sim.cache.evict(EvictParams(num_tokens=rng.randint(1, 4 * ps)))
        sim.check()
    assert hits > 3 and sim.evictions_under_pressure > 0, (hits, sim.evictions_under_pressure)
    sim.drain()
