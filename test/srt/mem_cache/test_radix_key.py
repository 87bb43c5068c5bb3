"""RadixKey: slicing keeps the namespace, page-aligned matching, namespaced child keys."""

import random

from sglang.srt.mem_cache.radix_key import RadixKey


def _reference_common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_len_iter_and_slicing_keep_extra_key():
    k = RadixKey([5, 6, 7, 8], extra_key="lora-a")
    assert len(k) == 4 and list(k) == [5, 6, 7, 8] and k[1] == 6
    s = k[1:3]
    assert isinstance(s, RadixKey) and s.token_ids == [6, 7] and s.extra_key == "lora-a"
    assert k.page_aligned(3).token_ids == [5, 6, 7] and k.page_aligned(3).extra_key == "lora-a"
    assert k.page_aligned(1) is k


def test_match_against_reference_and_page_rounding():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(0, 80)
        a = [rng.randint(0, 3) for _ in range(n)]
        b = list(a[: rng.randint(0, n)]) + [rng.randint(0, 3) for _ in range(rng.randint(0, 40))]
        ref = _reference_common_prefix(a, b)
        for ps in (1, 4, 16):
            assert RadixKey(a).match(RadixKey(b), ps) == ref // ps * ps


def test_different_namespaces_never_match_or_share_child_keys():
    toks = list(range(32))
    a, b, plain = RadixKey(toks, "x"), RadixKey(toks, "y"), RadixKey(toks)
    assert a.match(b) == 0 and a.match(plain) == 0 and a.match(RadixKey(toks, "x")) == 32
    for ps in (1, 16):
        keys = {a.child_key(ps), b.child_key(ps), plain.child_key(ps)}
        assert len(keys) == 3
    assert plain.child_key(1) == 0 and plain.child_key(4) == (0, 1, 2, 3)
    assert a.child_key(1) == ("x", 0)
