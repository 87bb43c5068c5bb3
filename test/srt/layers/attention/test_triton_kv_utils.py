"""kv_utils kernels vs their torch definitions: kv_indices from req_to_token, K/V stores into the pool."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from paged_kv_fixtures import fresh_generator, random_pool
from sglang.srt.layers.attention.triton_ops.kv_utils import (
    build_kv_indices,
    build_kv_indices_torch,
    store_kv_cache,
    store_kv_cache_torch,
)


def _gen():
    return fresh_generator()


@pytest.mark.parametrize("page_size", [1, 16])
def test_build_kv_indices_with_and_without_start(page_size):
    gen = _gen()
    seq_lens = [0, 1, 600, 33]  # 600 > one 512-token block of the kernel loop
    req_to_token, rpi, _, _, slots = random_pool(seq_lens, page_size, 1, 4, torch.float32, gen)
    lens = torch.tensor(seq_lens)
    indptr, indices = build_kv_indices(req_to_token, rpi, lens)
    ref_indptr, ref_indices = build_kv_indices_torch(req_to_token, rpi, lens)
    assert torch.equal(indptr, ref_indptr) and torch.equal(indices, ref_indices)
    assert torch.equal(indices, torch.cat(slots))
    start = torch.tensor([0, 1, 17, 30])
    sub = torch.clamp(lens - start, min=0)
    indptr, indices = build_kv_indices(req_to_token, rpi, sub, start)
    ref_indptr, ref_indices = build_kv_indices_torch(req_to_token, rpi, sub, start)
    assert torch.equal(indptr, ref_indptr) and torch.equal(indices, ref_indices)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_store_kv_cache_scattered_slots(dtype):
    gen = _gen()
    slots, kvh, d, dv = 40, 2, 24, 8
    kb = torch.randn(slots, kvh, d, generator=gen).to(dtype)
    vb = torch.randn(slots, kvh, dv, generator=gen).to(dtype)
    kb2, vb2 = kb.clone(), vb.clone()
    loc = torch.randperm(slots, generator=gen)[:7]
    k = torch.randn(7, kvh * d, generator=gen)  # fp32 input into a (maybe) fp16 pool
    v = torch.randn(7, kvh, dv, generator=gen)
    store_kv_cache(kb, vb, loc, k, v)
    store_kv_cache_torch(kb2, vb2, loc, k, v)
    assert torch.equal(kb, kb2) and torch.equal(vb, vb2)
