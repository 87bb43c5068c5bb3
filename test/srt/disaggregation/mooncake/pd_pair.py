"""Test helper: a real prefill/decode pair in one process (bootstrap server, two Mooncake managers
over loopback TCP, two real KV pools (MHATokenToKVPool, or an MLATokenToKVPool side), metadata
buffers, optional Mamba-style state).

The decode side offers the same-host copy (`same_host.py`) only when asked (`same_host_copy=True`):
the tests written for Mooncake's data path keep testing that path."""

from __future__ import annotations

import os
import time
from typing import Callable, List, Optional
from unittest import mock

import numpy as np
import torch

from sglang.srt.configs.runtime_config import DisaggConfig
from sglang.srt.disaggregation.base import kv_args_from_pools
from sglang.srt.disaggregation.transfer_backends import get_kv_class
from sglang.srt.disaggregation.bootstrap_server import KVBootstrapServer
from sglang.srt.disaggregation.utils import DisaggregationMode, KVClassType, KVPoll, MetadataBuffers
from sglang.srt.mem_cache.mamba_pool import MambaPool
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.utils import get_free_port

BACKEND = "mooncake_tcp"
LAYERS = [0, 1, 3]  # a hybrid-like layer id list: buffers are addressed by position, not id


def wait_for(pred: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def wait_poll(obj, wanted, timeout: float):
    """Poll until the state is in `wanted` (a set); returns the last state."""
    state = [obj.poll()]

    def _check():
        state[0] = obj.poll()
        return state[0] in wanted

    wait_for(_check, timeout)
    return state[0]


class Side:
    def __init__(self, mode, server_args, page_size, num_pages, head_dim=8, with_state=False, seed=0, system_dp_rank=0,
                 same_host_copy=False, mla=False):
        self.page_size = page_size
        if mla:  # one latent of 2 * head_dim values per token (same bytes per page as the MHA side)
            self.pool = MLATokenToKVPool(num_pages * page_size, page_size, torch.bfloat16, 2 * head_dim - 4, 4, LAYERS)
        else:
            self.pool = MHATokenToKVPool(num_pages * page_size, page_size, torch.bfloat16, 2, head_dim, LAYERS)
        self.metadata = MetadataBuffers(8)
        self.state: Optional[List[torch.Tensor]] = None
        self.mamba_pool = None
        if with_state:  # the real Mamba pool: conv + SSM state per layer, one slot per request
            self.mamba_pool = MambaPool(5, 2, (3, 4), (2, 4, 4), torch.float32, ssm_dtype=torch.bfloat16)
            self.state = self.mamba_pool.state_tensors()
        if mode == DisaggregationMode.PREFILL:
            g = torch.Generator().manual_seed(seed)
            for b in self.pool.kv_buffers():
                b.copy_(torch.randn(b.shape, generator=g).to(b.dtype))
            for t in self.state or []:
                t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
        self.kv_args = kv_args_from_pools(self.pool, self.metadata, page_size, mamba_pool=self.mamba_pool)
        self.kv_args.system_dp_rank = system_dp_rank
        with mock.patch.dict(os.environ, {"SGLANG_DISAGGREGATION_SAME_HOST_COPY": "1" if same_host_copy else "0"}):
            self.manager = get_kv_class(BACKEND, KVClassType.MANAGER)(self.kv_args, mode, server_args)

    def page(self, buf_idx: int, page: int) -> torch.Tensor:
        return self.pool.kv_buffers()[buf_idx][page * self.page_size : (page + 1) * self.page_size]

    @property
    def num_buffers(self) -> int:
        return len(self.pool.kv_buffers())


class PDPair:
    def __init__(self, page_size=1, num_pages=64, with_state=False, decode_head_dim=8, decode_page_size=None, same_host_copy=False,
                 prefill_mla=False, decode_mla=False):
        self.port = get_free_port()
        self.server = KVBootstrapServer("127.0.0.1", self.port)
        self.server_args = DisaggConfig(host="127.0.0.1", disaggregation_bootstrap_port=self.port, disaggregation_transfer_backend=BACKEND,
                                        tp_size=1)
        self.bootstrap_addr = f"127.0.0.1:{self.port}"
        self.prefill = Side(DisaggregationMode.PREFILL, self.server_args, page_size, num_pages, with_state=with_state,
                            mla=prefill_mla)
        self.decode = Side(
            DisaggregationMode.DECODE, self.server_args, decode_page_size or page_size, num_pages, head_dim=decode_head_dim, with_state=with_state,
            same_host_copy=same_host_copy, mla=decode_mla,
        )
        self._closed = False

    def sender(self, room: int):
        return get_kv_class(BACKEND, KVClassType.SENDER)(self.prefill.manager, self.bootstrap_addr, room)

    def receiver(self, room: int, addr: Optional[str] = None):
        return get_kv_class(BACKEND, KVClassType.RECEIVER)(self.decode.manager, addr or self.bootstrap_addr, room)

    def bootstrapped_pair(self, room: int, dst_pages, aux_index: int, state_indices=None, timeout: float = 10.0):
        """Sender + receiver with the decode metadata delivered (sender in WaitingForInput)."""
        snd = self.sender(room)
        rcv = self.receiver(room)
        rcv.init(0)
        assert wait_poll(rcv, {KVPoll.WaitingForInput, KVPoll.Failed}, timeout) == KVPoll.WaitingForInput
        rcv.send_metadata(np.asarray(dst_pages, dtype=np.int32), aux_index, state_indices)
        assert wait_poll(snd, {KVPoll.WaitingForInput, KVPoll.Failed}, timeout) == KVPoll.WaitingForInput
        return snd, rcv

    def assert_pages_equal(self, src_pages, dst_pages):
        """Every buffer's decode page dst_pages[i] holds the prefill's page src_pages[i]."""
        for b in range(self.prefill.num_buffers):
            for s, d in zip(np.asarray(src_pages).tolist(), np.asarray(dst_pages).tolist()):
                assert torch.equal(self.decode.page(b, d), self.prefill.page(b, s)), (b, s, d)

    def close_prefill(self):
        self.prefill.manager.close()
        self.server.close()

    def close(self):
        if self._closed:
            return
        self._closed = True
        self.close_prefill()
        self.decode.manager.close()


def random_pages(rng: np.random.Generator, num_pages: int, n: int, exclude=()) -> np.ndarray:
    """n distinct non-padding pages (page 0 is the pool's padding page), shuffled so runs are rare but possible."""
    candidates = np.array([p for p in range(1, num_pages + 1) if p not in set(exclude)])
    return rng.choice(candidates, size=n, replace=False).astype(np.int32)
