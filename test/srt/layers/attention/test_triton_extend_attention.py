"""extend_attention_fwd (new tokens over a pool prefix + themselves) vs the torch reference."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from paged_kv_fixtures import fresh_generator, random_pool, tolerance
from sglang.srt.layers.attention.triton_ops import extend_attention as extend_module
from sglang.srt.layers.attention.triton_ops.extend_attention import extend_attention_fwd
from sglang.srt.layers.attention.triton_ops.kv_utils import build_kv_indices
from sglang.srt.layers.attention.triton_ops.torch_reference import extend_attention_ref


def _run(prefix_lens, extend_lens, page_size, heads, kv_heads, head_dim, dtype, logit_cap=0.0, window=-1,
         v_head_dim=None, kv_dtype=None):
    gen = fresh_generator()
    v_head_dim = v_head_dim or head_dim
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    req_to_token, rpi, kb, vb, _ = random_pool(seq_lens, page_size, kv_heads, head_dim, kv_dtype or dtype, gen, v_head_dim)
    kv_indptr, kv_indices = build_kv_indices(req_to_token, rpi, torch.tensor(prefix_lens))
    qo_indptr = torch.zeros(len(extend_lens) + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.cumsum(torch.tensor(extend_lens), 0)
    t = sum(extend_lens)
    q = torch.randn((t, heads, head_dim), generator=gen).to(dtype)
    k = torch.randn((t, kv_heads, head_dim), generator=gen).to(dtype)
    v = torch.randn((t, kv_heads, v_head_dim), generator=gen).to(dtype)
    o = torch.full((t, heads, v_head_dim), float("nan"), dtype=dtype)
    scale = head_dim ** -0.5
    extend_attention_fwd(q, k, v, o, kb, vb, qo_indptr, kv_indptr, kv_indices, max(extend_lens), scale,
                         logit_cap=logit_cap, sliding_window_size=window)
    ref = extend_attention_ref(q, k, v, kb, vb, qo_indptr, kv_indptr, kv_indices, scale, logit_cap, window)
    assert not torch.isnan(o).any()
    torch.testing.assert_close(o.float(), ref.float(), **tolerance(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("page_size", [1, 16])
def test_ragged_prefixes_gqa(dtype, page_size):
    _run([0, 21, 40], [7, 45, 3], page_size, heads=4, kv_heads=2, head_dim=32, dtype=dtype)


def test_no_prefix_mha_odd_head_dim():
    _run([0, 0], [50, 2], 1, heads=2, kv_heads=2, head_dim=24, dtype=torch.float32)


def test_mqa_different_v_dim():
    _run([5, 17], [33, 1], 16, heads=4, kv_heads=1, head_dim=16, dtype=torch.float16, v_head_dim=8)


def test_logit_cap():
    _run([10, 0], [20, 9], 1, heads=2, kv_heads=1, head_dim=16, dtype=torch.float32, logit_cap=2.0)


@pytest.mark.parametrize("window", [1, 5, 40])
def test_sliding_window(window):
    _run([0, 37, 70], [40, 6, 33], 16, heads=2, kv_heads=1, head_dim=16, dtype=torch.float32, window=window)


def test_bf16_upcasts_dot_under_interpreter():
    _run([6, 0], [20, 5], 16, heads=4, kv_heads=2, head_dim=16, dtype=torch.bfloat16)


def test_fp32_queries_over_bf16_pool():
    _run([6, 19], [20, 5], 1, heads=4, kv_heads=2, head_dim=16, dtype=torch.float32, kv_dtype=torch.bfloat16)


@pytest.mark.parametrize("tiles", [(64, 64), (64, 32), (16, 32)])
def test_gpu_and_uneven_tile_sizes(monkeypatch, tiles):
    # The tiles a GPU uses (BLOCK_M >= BLOCK_N), and BLOCK_M < BLOCK_N, on windows and prefixes.
    monkeypatch.setattr(extend_module, "extend_tile_sizes", lambda q: tiles)
    _run([0, 37, 70], [80, 6, 33], 16, heads=2, kv_heads=1, head_dim=16, dtype=torch.float32, window=21)
    _run([0, 37], [70, 40], 1, heads=2, kv_heads=1, head_dim=16, dtype=torch.float16)
