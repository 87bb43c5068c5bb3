"""MemoryManager.reserve, the one reservation routine: random prefills, chunk extends and decode
steps over page sizes 1, 4 and 16, checked against what the attention kernels rely on: every
token of every request has its own slot, tokens of one page are consecutive slots, a request's
req_to_token row holds exactly the slots it was handed, and releasing everything gives the pool
back whole."""

import random
import types

import pytest
import torch

from sglang.srt.configs.runtime_config import MemoryConfig
from sglang.srt.mem_cache.memory_manager import MemoryManager


class _Req:  # the fields reserve() reads and writes (core/req.py declares them on Req)
    def __init__(self):
        self.req_pool_idx = None
        self.mamba_pool_idx = None
        self.prefix_indices = torch.empty(0, dtype=torch.int64)
        self.kv_len = 0

    @property
    def kv(self):
        """The request's KV record (`Req.kv`): this fake keeps its fields itself."""
        return self


def _manager(page_size: int) -> MemoryManager:
    cfg = types.SimpleNamespace(attention_layer_ids=[0, 1], num_key_value_heads=2, head_dim=8, context_len=512,
                                is_hybrid_swa=False, full_attention_layer_ids=None)
    return MemoryManager(cfg, MemoryConfig(page_size=page_size, max_total_tokens=8192, max_running_requests=64),
                         kv_dtype=torch.float32, model_dtype=torch.float32)


def _check(mm: MemoryManager, reqs, handed):
    ps = mm.page_size
    seen = set()
    for r in reqs:
        row = mm.req_to_token_pool.req_to_token[r.req_pool_idx, : r.kv_len].tolist()
        assert row == handed[id(r)], "the row differs from the slots reserve() returned"
        for i, slot in enumerate(row):
            assert slot >= ps, "page 0 is the padding page"
            if i % ps:
                assert slot == row[i - 1] + 1, f"token {i} left its page (page size {ps})"
            else:
                assert slot % ps == 0, f"token {i} does not start a page"
        seen.update(row)
    assert len(seen) == sum(r.kv_len for r in reqs), "two tokens share a slot"


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_reserve_extend_decode_and_release(page_size):
    rnd = random.Random(page_size)
    mm = _manager(page_size)
    free0 = mm.allocator.available_size()
    reqs, handed = [], {}
    for _ in range(40):
        op = rnd.choice(["prefill", "extend", "decode", "decode"]) if reqs else "prefill"
        if op == "prefill":
            batch = [_Req() for _ in range(rnd.randint(1, 4))]
            prefix, seq = [0] * len(batch), [rnd.randint(0, 37) for _ in batch]  # 0: an empty extend
        elif op == "extend":
            batch = rnd.sample(reqs, rnd.randint(1, len(reqs)))
            prefix = [r.kv_len for r in batch]
            seq = [p + rnd.randint(0, 20) for p in prefix]
        else:
            batch = list(reqs)
            prefix, seq = [r.kv_len for r in batch], [r.kv_len + 1 for r in batch]
        if sum(seq) + 4 * len(reqs) > 400:
            continue
        out = mm.reserve_decode(batch) if op == "decode" else mm.reserve(batch, prefix, seq)
        assert out is not None and out.dtype == torch.int64
        offset = 0
        for r, p, s in zip(batch, prefix, seq):
            handed.setdefault(id(r), []).extend(out[offset : offset + s - p].tolist())
            offset += s - p
            assert r.kv_len == s
        assert offset == len(out)
        reqs.extend(r for r in batch if r not in reqs)
        _check(mm, reqs, handed)
        used_pages = sum(-(-r.kv_len // page_size) for r in reqs)
        assert mm.allocator.available_size() == free0 - used_pages * page_size
    for r in reqs:
        mm.allocator.free(mm.req_to_token_pool.req_to_token[r.req_pool_idx, : r.kv_len])
        mm.req_to_token_pool.free(r.req_pool_idx)
    assert mm.allocator.available_size() == free0


def test_reserve_of_nothing_takes_nothing():
    mm = _manager(4)
    free0 = mm.allocator.available_size()
    assert mm.reserve([], [], []).numel() == 0
    assert mm.allocator.available_size() == free0
