"""TorchNativeAttnBackend against a dense float64 reference built from each request's whole
K/V history: ragged extends on top of cached prefixes, batched decode, GQA, sliding windows
(HF convention: key position > query position - window), logit cap, paged pools."""

import contextlib
import math

import pytest
import torch

from sglang.srt.layers.attention.registry import create_attention_backend
from sglang.srt.layers import cpu_ops
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch import ForwardBatch

HQ, HKV, D = 4, 2, 8


class Setup:
    def __init__(self, page_size, num_reqs, layer_window=-1, logit_cap=0.0, hkv=HKV):
        self.hkv = hkv
        self.req_pool = ReqToTokenPool(num_reqs, 512)
        self.kv_pool = MHATokenToKVPool(1024, page_size, torch.float32, hkv, D, layer_ids=[0, 3])
        self.alloc = TokenToKVPoolAllocator(1024, page_size, self.kv_pool)
        self.layer = RadixAttention(HQ, D, D ** -0.5, hkv, layer_id=3, logit_cap=logit_cap,
                                    sliding_window_size=layer_window)
        self.backend = TorchNativeAttnBackend(None)
        self.rows = self.req_pool.alloc(num_reqs)
        self.lens = [0] * num_reqs
        # Full history per request, for the reference.
        self.K = [torch.empty(0, hkv, D) for _ in range(num_reqs)]
        self.V = [torch.empty(0, hkv, D) for _ in range(num_reqs)]
        self.gen = torch.Generator().manual_seed(0)

    def _rand(self, *shape):
        return torch.randn(*shape, generator=self.gen)

    def _last_loc(self, i):
        return int(self.req_pool.req_to_token[self.rows[i], self.lens[i] - 1]) if self.lens[i] else 0

    def step(self, new_lens, decode=False, save_kv_cache=True):
        prefix = list(self.lens)
        seq = [p + n for p, n in zip(prefix, new_lens)]
        loc = self.alloc.alloc_extend(prefix, seq, [self._last_loc(i) for i in range(len(prefix))])
        off = 0
        for i, (p, s) in enumerate(zip(prefix, seq)):
            self.req_pool.write(self.rows[i], p, loc[off : off + s - p])
            off += s - p
        T = sum(new_lens)
        q, k, v = self._rand(T, HQ * D), self._rand(T, self.hkv * D), self._rand(T, self.hkv * D)
        if decode:
            fb = ForwardBatch.for_decode([0] * len(seq), seq, self.rows, loc)
        else:
            fb = ForwardBatch.for_extend([[0] * n for n in new_lens], prefix, self.rows, loc)
        fb.req_to_token_pool, fb.token_to_kv_pool, fb.attn_backend = self.req_pool, self.kv_pool, self.backend
        self.backend.init_forward_metadata(fb)
        out = self.layer(q, k, v, fb, save_kv_cache=save_kv_cache)
        ref = self._reference(q, k, v, prefix, new_lens)
        if save_kv_cache:
            self.lens = seq
        else:  # roll back: these tokens were not kept
            if self.alloc.page_size == 1:
                self.alloc.free(loc)
            for i in range(len(prefix)):
                self.K[i], self.V[i] = self.K[i][: prefix[i]], self.V[i][: prefix[i]]
        return out, ref, loc, k, v

    def _reference(self, q, k, v, prefix, new_lens):
        outs, off = [], 0
        w, cap = self.layer.sliding_window_size, self.layer.logit_cap
        for i, (p, n) in enumerate(zip(prefix, new_lens)):
            self.K[i] = torch.cat([self.K[i], k[off : off + n].view(n, self.hkv, D)])
            self.V[i] = torch.cat([self.V[i], v[off : off + n].view(n, self.hkv, D)])
            Kf = self.K[i].double().repeat_interleave(HQ // self.hkv, dim=1)  # [S, HQ, D]
            Vf = self.V[i].double().repeat_interleave(HQ // self.hkv, dim=1)
            qi = q[off : off + n].view(n, HQ, D).double()
            s = torch.einsum("qhd,khd->hqk", qi, Kf) / math.sqrt(D)
            if cap > 0:
                s = cap * torch.tanh(s / cap)
            qp = torch.arange(p, p + n)[:, None]
            kp = torch.arange(p + n)[None, :]
            allowed = kp <= qp
            if w > 0:
                allowed &= kp > qp - w
            s = s.masked_fill(~allowed, float("-inf"))
            outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), Vf).reshape(n, HQ * D))
            off += n
        return torch.cat(outs).float()


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("window", [-1, 5])
def test_extend_on_prefix_then_decode(page_size, window):
    st = Setup(page_size, 3, layer_window=window)
    for new_lens, decode in [([7, 1, 20], False), ([9, 13, 1], False), ([1, 1, 1], True), ([1, 1, 1], True),
                             ([0, 30, 2], False), ([1, 1, 1], True)]:
        out, ref, *_ = st.step(new_lens, decode=decode)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [-1, 5])
def test_extend_in_place_matches_the_sdpa_path(window):
    """With sgl-kernel the whole extend batch runs in place (sgl_kernel.extend_attention); the
    torch fallback runs SDPA per request over the gathered prefix: both match the reference."""
    outs = []
    for fallback in (False, True):
        with cpu_ops.torch_fallbacks() if fallback else contextlib.nullcontext():
            st = Setup(1, 3, layer_window=window)
            st.step([5, 1, 9])
            out, ref, *_ = st.step([3, 150, 0])
            # the in-place path builds its per-request lengths; the SDPA path never does
            assert (st.backend._extend_meta is not None) == (cpu_ops.available() and not fallback)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        outs.append(out)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not cpu_ops.available(), reason="sgl-kernel not built")
def test_extend_in_place_bf16_matches_sdpa():
    torch.manual_seed(0)
    outs = []
    for fallback in (False, True):
        st = Setup(16, 2)
        st.kv_pool = MHATokenToKVPool(1024, 16, torch.bfloat16, HKV, D, layer_ids=[0, 3])
        st.alloc = TokenToKVPoolAllocator(1024, 16, st.kv_pool)
        st._rand = lambda *shape: torch.randn(*shape, generator=st.gen).bfloat16()
        ctx = cpu_ops.torch_fallbacks() if fallback else contextlib.nullcontext()
        with ctx:
            out, ref, *_ = st.step([17, 40])
        outs.append(out)
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(outs[0].float(), outs[1].float(), atol=2e-2, rtol=2e-2)


def test_new_kv_written_to_pool_at_out_cache_loc():
    st = Setup(16, 2)
    _, _, loc, k, v = st.step([5, 12])
    kb, vb = st.kv_pool.get_kv_buffer(3)
    torch.testing.assert_close(kb[loc], k.view(-1, HKV, D))
    torch.testing.assert_close(vb[loc], v.view(-1, HKV, D))
    assert kb[:16].abs().sum() == 0  # padding page untouched
    assert st.kv_pool.get_key_buffer(0).abs().sum() == 0  # other layer untouched


@pytest.mark.parametrize("decode", [False, True])
def test_save_kv_cache_false_uses_given_kv_and_leaves_pool(decode):
    st = Setup(1, 2, layer_window=4)
    st.step([6, 9])
    before = st.kv_pool.get_key_buffer(3).clone()
    out, ref, *_ = st.step([1, 1] if decode else [3, 4], decode=decode, save_kv_cache=False)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(before, st.kv_pool.get_key_buffer(3))


def test_mha_and_logit_cap():
    st = Setup(1, 2, logit_cap=2.0, hkv=HQ)
    for new_lens, decode in [([4, 11], False), ([1, 1], True), ([3, 2], False)]:
        out, ref, *_ = st.step(new_lens, decode=decode)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_registry():
    assert isinstance(create_attention_backend("torch_native", None), TorchNativeAttnBackend)
    with pytest.raises(ValueError, match="Invalid attention backend: 'nope'"):
        create_attention_backend("nope", None)
