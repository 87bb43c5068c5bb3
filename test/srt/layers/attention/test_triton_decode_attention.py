"""decode_attention_fwd (split-KV flash decoding) vs the plain-torch reference, under the interpreter."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from paged_kv_fixtures import fresh_generator, random_pool, tolerance
from sglang.srt.layers.attention.triton_ops import decode_attention as decode_module
from sglang.srt.layers.attention.triton_ops.decode_attention import decode_attention_fwd, get_num_kv_splits
from sglang.srt.layers.attention.triton_ops.kv_utils import build_kv_indices
from sglang.srt.layers.attention.triton_ops.torch_reference import decode_attention_ref


def _run(seq_lens, page_size, heads, kv_heads, head_dim, dtype, logit_cap=0.0, window=-1, max_kv_splits=4,
         min_tokens_per_split=16, v_head_dim=None, kv_dtype=None):
    gen = fresh_generator()
    v_head_dim = v_head_dim or head_dim
    req_to_token, rpi, kb, vb, _ = random_pool(seq_lens, page_size, kv_heads, head_dim, kv_dtype or dtype, gen, v_head_dim)
    lens = torch.tensor(seq_lens)
    kv_indptr, kv_indices = build_kv_indices(req_to_token, rpi, lens)
    bs = len(seq_lens)
    q = torch.randn((bs, heads, head_dim), generator=gen).to(dtype)
    o = torch.full((bs, heads, v_head_dim), float("nan"), dtype=dtype)
    logits = torch.full((bs, heads, max_kv_splits, v_head_dim), float("nan"), dtype=torch.float32)
    lse = torch.full((bs, heads, max_kv_splits), float("nan"), dtype=torch.float32)
    splits = get_num_kv_splits(lens, max_kv_splits, window, min_tokens_per_split)
    scale = head_dim ** -0.5
    decode_attention_fwd(q, kb, vb, o, kv_indptr, kv_indices, logits, lse, splits, max_kv_splits, scale,
                         logit_cap=logit_cap, sliding_window_size=window)
    ref = decode_attention_ref(q, kb, vb, kv_indptr, kv_indices, scale, logit_cap, window)
    assert not torch.isnan(o).any()
    torch.testing.assert_close(o.float(), ref.float(), **tolerance(dtype))
    return splits


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("page_size", [1, 16])
def test_ragged_batch_gqa(dtype, page_size):
    splits = _run([1, 37, 70, 5], page_size, heads=4, kv_heads=2, head_dim=32, dtype=dtype)
    assert splits.max() > 1  # the split-merge path is exercised


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mha_kernel_with_window_and_logit_cap(dtype):
    _run([9, 50, 70], 16, heads=2, kv_heads=2, head_dim=24, dtype=dtype)
    _run([9, 50, 70], 1, heads=2, kv_heads=2, head_dim=16, dtype=dtype, window=20, logit_cap=3.0, v_head_dim=8)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_several_blocks_per_split(kv_heads):
    # 2 splits over 150 tokens: 96 + 54, i.e. several BLOCK_N blocks inside one split (online rescale).
    _run([150, 7], 1, heads=2, kv_heads=kv_heads, head_dim=16, dtype=torch.float32, max_kv_splits=2)


def test_mqa_and_odd_head_dim():
    _run([33, 3], 16, heads=4, kv_heads=1, head_dim=16, dtype=torch.float32, v_head_dim=8)


def test_more_query_heads_per_group_than_a_block():
    _run([20, 41], 16, heads=32, kv_heads=1, head_dim=16, dtype=torch.float16)


def test_logit_cap():
    _run([45, 12], 1, heads=4, kv_heads=2, head_dim=16, dtype=torch.float32, logit_cap=1.5)


@pytest.mark.parametrize("window", [1, 8, 40])
def test_sliding_window(window):
    _run([3, 30, 75], 16, heads=4, kv_heads=2, head_dim=16, dtype=torch.float32, window=window)


def test_bf16_upcasts_dot_under_interpreter():
    # bf16 tl.dot is wrong in the interpreter; the kernels upcast there (dot_needs_fp32).
    _run([30, 7], 16, heads=4, kv_heads=2, head_dim=16, dtype=torch.bfloat16)


@pytest.mark.parametrize("kv_heads", [1, 4])
def test_fp32_queries_over_bf16_pool(kv_heads):
    # --kv-cache-dtype bf16 under an fp32 model: the bf16 side of the dot is upcast as well.
    _run([30, 7], 1, heads=4, kv_heads=kv_heads, head_dim=16, dtype=torch.float32, kv_dtype=torch.bfloat16)


def test_single_split_path():
    splits = _run([64, 17], 1, heads=2, kv_heads=1, head_dim=16, dtype=torch.float16, max_kv_splits=1)
    assert splits.max() == 1


def test_mha_gpu_block_size(monkeypatch):
    # GPUs step 64 tokens at a time inside 32-token-aligned splits: the last step is partial.
    monkeypatch.setattr(decode_module, "mha_block_n", lambda q: 64)
    _run([150, 33, 90], 1, heads=2, kv_heads=2, head_dim=16, dtype=torch.float32, max_kv_splits=3, window=70)
    _run([150, 33, 90], 1, heads=2, kv_heads=2, head_dim=16, dtype=torch.float32, max_kv_splits=3)
