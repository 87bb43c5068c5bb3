"""TritonAttnBackend end to end on a real paged pool: extend, extend with a cached prefix, decode.

Outputs are compared with dense attention over each request's full K/V history (kept by the
test, not read from the pool) and with the torch_native backend on an identical pool.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from paged_kv_fixtures import fresh_generator
from sglang.srt.layers.attention.base_attn_backend import AttentionInputs
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.model_executor.forward_batch import ForwardBatch

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


def _dense_attention(q, k, v, layer, q_pos):
    """q [n, H, D] at positions q_pos over k/v [L, KVH, D] at positions 0..L-1 (fp32)."""
    g = HEADS // KV_HEADS
    k = k.float().repeat_interleave(g, 1)
    v = v.float().repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * layer.scaling
    if layer.logit_cap > 0:
        s = layer.logit_cap * torch.tanh(s / layer.logit_cap)
    kp = torch.arange(k.shape[0])
    vis = kp[None, :] <= q_pos[:, None]
    if layer.sliding_window_size > 0:
        vis &= kp[None, :] > q_pos[:, None] - layer.sliding_window_size
    s = s.masked_fill(~vis[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v)


class _Engine:
    """Pools + allocator + both backends over the same requests (what a model runner would own)."""

    def __init__(self, page_size, dtype, layers, swa=False):
        self.dtype, self.layers, self.page_size = dtype, layers, page_size
        ids = [l.layer_id for l in layers]
        self.rtt = ReqToTokenPool(8, 128)
        self.pools = {name: MHATokenToKVPool(512, page_size, dtype, KV_HEADS, HEAD_DIM, ids) for name in ("triton", "native")}
        self.swa = swa
        if swa:  # sliding-window layers live in their own, smaller pool with their own slots
            swa_ids = [l.layer_id for l in layers if l.sliding_window_size > 0]
            full_ids = [i for i in ids if i not in swa_ids]
            self.pools["triton"] = SWAKVPool(512, 256, page_size, dtype, KV_HEADS, HEAD_DIM, swa_ids, full_ids)
            self.mapping = torch.zeros(512 + page_size, dtype=torch.int64)
            self.pools["triton"].register_mapping(self.mapping)
            self.free_swa_pages = (torch.randperm(256 // page_size) + 1).tolist()
        self.alloc = TokenToKVPoolAllocator(512, page_size)
        self.alloc.free_pages.reverse()  # pages handed out high-to-low: slots are not in order
        inputs = AttentionInputs(device="cpu", req_to_token_pool=self.rtt, token_to_kv_pool=self.pools["triton"],
                                 num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM)
        self.triton = TritonAttnBackend(inputs, max_kv_splits=4)
        self.triton.min_tokens_per_split = 8  # exercise the split-KV merge on short sequences
        self.native = TorchNativeAttnBackend(AttentionInputs(device="cpu"))
        self.history = {}  # req slot -> per layer (k list, v list)
        self.lens = {}

    def step(self, reqs, new_lens, gen):
        """reqs: req pool slots; new_lens: new tokens each. Runs every layer, checks, returns nothing."""
        prefix = [self.lens.get(r, 0) for r in reqs]
        seq = [p + n for p, n in zip(prefix, new_lens)]
        last = [int(self.rtt.req_to_token[r, p - 1]) if p else 0 for r, p in zip(reqs, prefix)]
        loc = self.alloc.alloc_extend(prefix, seq, last)
        cursor = 0
        for r, p, n in zip(reqs, prefix, new_lens):
            self.rtt.write(r, p, loc[cursor : cursor + n])
            cursor += n
        if self.swa:  # give new full slots SWA slots, page to page
            ps = self.page_size
            for page in torch.unique(loc // ps).tolist():
                if self.mapping[page * ps] == 0 and self.mapping[page * ps + ps - 1] == 0:
                    swa_page = self.free_swa_pages.pop()
                    self.mapping[page * ps : page * ps + ps] = torch.arange(swa_page * ps, swa_page * ps + ps)
        decode = all(n == 1 for n in new_lens) and all(p > 0 for p in prefix)
        if decode:
            fb = ForwardBatch.for_decode([0] * len(reqs), seq, reqs, loc)
        else:
            fb = ForwardBatch.for_extend([[0] * n for n in new_lens], prefix, reqs, loc)
        fb.req_to_token_pool = self.rtt
        self.triton.init_forward_metadata(fb)
        self.native.init_forward_metadata(fb)
        T = sum(new_lens)
        for layer in self.layers:
            q = torch.randn((T, HEADS * HEAD_DIM), generator=gen).to(self.dtype)
            k = torch.randn((T, KV_HEADS * HEAD_DIM), generator=gen).to(self.dtype)
            v = torch.randn((T, KV_HEADS * HEAD_DIM), generator=gen).to(self.dtype)
            outs = {}
            backends = (("triton", self.triton),) if self.swa else (("triton", self.triton), ("native", self.native))
            for name, backend in backends:
                fb.token_to_kv_pool = self.pools[name]
                fb.attn_backend = backend
                outs[name] = layer(q, k, v, fb)
            cursor = 0
            refs = []
            for r, p, n in zip(reqs, prefix, new_lens):
                hk, hv = self.history.setdefault((r, layer.layer_id), ([], []))
                hk.append(k[cursor : cursor + n].view(n, KV_HEADS, HEAD_DIM))
                hv.append(v[cursor : cursor + n].view(n, KV_HEADS, HEAD_DIM))
                qq = q[cursor : cursor + n].view(n, HEADS, HEAD_DIM)
                refs.append(_dense_attention(qq, torch.cat(hk), torch.cat(hv), layer, torch.arange(p, p + n)))
                cursor += n
            ref = torch.cat(refs).reshape(T, -1)
            tol = dict(atol=2e-3, rtol=2e-3) if self.dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
            torch.testing.assert_close(outs["triton"].float(), ref, **tol)
            if not self.swa:
                torch.testing.assert_close(outs["triton"].float(), outs["native"].float(), **tol)
        for r, s in zip(reqs, seq):
            self.lens[r] = s
        if self.swa:
            # Tokens no later query can see lose their SWA slot (-> padding slot 0), as
            # free_swa does: the kernels must never read them.
            window = max(l.sliding_window_size for l in self.layers)
            for r, s in zip(reqs, seq):
                gone = self.rtt.req_to_token[r, : max(0, s - window + 1)]
                self.mapping[gone] = 0
        else:
            # The backend saved the new K/V into the pool, at the allocated slots.
            lid = self.layers[-1].layer_id
            torch.testing.assert_close(self.pools["triton"].get_key_buffer(lid)[loc], self.pools["native"].get_key_buffer(lid)[loc])


@pytest.mark.parametrize("page_size,dtype,swa", [(1, torch.float32, False), (16, torch.float16, False),
                                                  (4, torch.float32, True)])
def test_extend_prefix_then_decode(page_size, dtype, swa):
    gen = fresh_generator()
    layers = [
        RadixAttention(HEADS, HEAD_DIM, HEAD_DIM ** -0.5, KV_HEADS, layer_id=0),
        RadixAttention(HEADS, HEAD_DIM, 0.3, KV_HEADS, layer_id=1, sliding_window_size=6),
        RadixAttention(HEADS, HEAD_DIM, HEAD_DIM ** -0.5, KV_HEADS, layer_id=3, logit_cap=2.0),
    ]
    eng = _Engine(page_size, dtype, layers, swa=swa)
    eng.step([2, 5], [11, 3], gen)  # fresh prompts
    eng.step([2, 5, 0], [4, 20, 9], gen)  # two continue after a cached prefix, one new
    for _ in range(3):
        eng.step([2, 5, 0], [1, 1, 1], gen)  # decode
