"""Interfaces every KV transfer backend implements (reference 5.2); `transfer_backends.get_kv_class`
looks a backend's classes up.

How the scheduler uses them (both roles build the same `KVArgs` from their own pools):

    kv_args = kv_args_from_pools(token_to_kv_pool, metadata_buffers, page_size, mamba_pool=None)
    # with several DP schedulers set kv_args.system_dp_rank (and engine_rank for TP) before building the manager
    manager = get_kv_class(backend, KVClassType.MANAGER)(kv_args, DisaggregationMode.PREFILL, server_args)

Prefill, per request::

    sender = get_kv_class(backend, KVClassType.SENDER)(manager, f"{host}:{port}", bootstrap_room)
    sender.poll()                      # Bootstrapping until decode's metadata arrived, then WaitingForInput
    sender.init(num_pages, aux_index)  # metadata row index (ReqToMetadataIdxAllocator)
    sender.send(page_indices_np_int32, state_indices=None)  # once per chunk; last chunk carries the row
    sender.poll()                      # -> Success / Failed; on Failed: sender.failure_exception() raises

Decode, per request::

    receiver = get_kv_class(backend, KVClassType.RECEIVER)(manager, f"{host}:{port}", bootstrap_room)
    receiver.init(prefill_dp_rank=0)   # resolves the prefill rank in the background (None: room % dp_size)
    receiver.poll()                    # Bootstrapping -> WaitingForInput
    receiver.send_metadata(page_indices_np_int32, aux_index, state_indices=None)  # Mamba: [[slot]] on BOTH sides
    receiver.poll()                    # Transferring -> Success / Failed

`poll()` never blocks; `failure_exception()` raises an exception whose text says why.
`abort()` concludes Failed locally and tells the peer when it can; `clear()` drops the manager's
bookkeeping for the room.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import List, Optional

import numpy as np
import torch

from sglang.srt.disaggregation.utils import DisaggregationMode, StateType


class KVArgs:
    """Plain attribute bag describing the local buffers a transfer backend may read or write."""

    def __init__(self):
        self.engine_rank: int = 0
        self.kv_data_ptrs: List[int] = []
        self.kv_data_lens: List[int] = []
        self.kv_item_lens: List[int] = []
        self.kv_layer_ids: List[int] = []
        self.kv_cache_dtype_str: str = "auto"
        self.kv_layout: Optional[str] = None
        self.aux_data_ptrs: List[int] = []
        self.aux_data_lens: List[int] = []
        self.aux_item_lens: List[int] = []
        self.state_types: List[StateType] = []
        self.state_data_ptrs: List[List[int]] = []
        self.state_data_lens: List[List[int]] = []
        self.state_item_lens: List[List[int]] = []
        self.state_layer_ids: List[List[int]] = []
        self.state_dim_per_tensor: List[List[int]] = []
        self.ib_device: Optional[str] = None
        self.gpu_id: int = 0
        self.kv_head_num: int = 0
        self.total_kv_head_num: int = 0
        self.page_size: int = 1
        self.system_dp_rank: int = 0
        self.pp_rank: int = 0
        self.prefill_start_layer: int = 0
        self.prefill_end_layer: int = 0
        self.num_draft_entries: int = 0


@dataclasses.dataclass
class KVTransferMetric:
    transfer_latency_s: Optional[float] = None
    alloc_latency_s: Optional[float] = None
    transfer_total_bytes: int = 0


class KVTransferError(Exception):
    def __init__(self, bootstrap_room: int, failure_reason: str):
        super().__init__(failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason

    def __str__(self):
        return f"KVTransferError(bootstrap_room={self.bootstrap_room}): {self.failure_reason}"


def _contiguous_checked(t: torch.Tensor, what: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous to be registered with a transfer engine")
    return t


def kv_args_from_pools(token_to_kv_pool, metadata_buffers, page_size: int, mamba_pool=None, ib_device=None, engine_rank: int = 0) -> KVArgs:
    """Describe a KV pool (+ `MetadataBuffers`, + optional Mamba state) as `KVArgs`.

    KV: the pool's `kv_buffers()` (an MHA pool: every layer's K buffer, then every layer's V
    buffer; an MLA pool: every layer's latent buffer); `item_len` is the bytes of one page of one
    buffer (page_size * one slot's row), so page p of buffer i starts at `ptr_i + p * item_len_i`
    (slot p*page_size of the [size+page_size, heads, dim] tensor). `kv_layout` is the pool's
    `layout()`, which the decode side compares with its own at bootstrap.

    `mamba_pool`: either an object with `get_contiguous_buf_infos() -> (ptrs, lens, item_lens)` (one
    entry per state tensor per layer, slot-major) or a sequence of tensors whose dim 0 is the slot
    index; it becomes one `StateType.MAMBA` entry.
    """
    args = KVArgs()
    args.engine_rank = engine_rank
    bufs = [_contiguous_checked(b, "KV buffer") for b in token_to_kv_pool.kv_buffers()]
    args.kv_data_ptrs = [b.data_ptr() for b in bufs]
    args.kv_data_lens = [b.nbytes for b in bufs]
    args.kv_item_lens = [b[0].nbytes * page_size for b in bufs]
    args.kv_layer_ids = list(token_to_kv_pool.kv_buffer_layer_ids())
    args.kv_head_num = args.total_kv_head_num = getattr(token_to_kv_pool, "head_num", 0)
    args.kv_cache_dtype_str = str(getattr(token_to_kv_pool, "dtype", "auto")).replace("torch.", "")
    args.kv_layout = token_to_kv_pool.layout()
    if metadata_buffers is not None:
        args.aux_data_ptrs, args.aux_data_lens, args.aux_item_lens = metadata_buffers.get_buf_infos()
    if mamba_pool is not None:
        if hasattr(mamba_pool, "get_contiguous_buf_infos"):
            ptrs, lens, item_lens = mamba_pool.get_contiguous_buf_infos()
        else:
            tensors = [_contiguous_checked(t, "state tensor") for t in mamba_pool]
            ptrs = [t.data_ptr() for t in tensors]
            lens = [t.nbytes for t in tensors]
            item_lens = [t[0].nbytes for t in tensors]
        args.state_types = [StateType.MAMBA]
        args.state_data_ptrs = [list(ptrs)]
        args.state_data_lens = [list(lens)]
        args.state_item_lens = [list(item_lens)]
        args.state_layer_ids = [list(range(len(ptrs)))]
        args.state_dim_per_tensor = [[0] * len(ptrs)]
    args.page_size = page_size
    args.ib_device = ib_device
    return args


class BaseKVManager(ABC):
    @abstractmethod
    def __init__(self, args: KVArgs, disaggregation_mode: DisaggregationMode, server_args, is_mla_backend: bool = False):
        ...

    def register_to_bootstrap(self) -> None:
        """Prefill: announce this rank to the bootstrap server (no-op where not needed)."""

    def reject_room(self, room: int, message: str, status_code: int) -> None:
        """Prefill: the request of `room` was refused before it had a sender; tell a decode peer
        that asks for it (no-op where there is no peer)."""

    def close(self) -> None:
        """Stop threads and release sockets / registered memory."""


class BaseKVSender(ABC):
    @abstractmethod
    def __init__(self, mgr: BaseKVManager, bootstrap_addr: str, bootstrap_room: int, req_has_disagg_prefill_dp_rank: bool = False):
        ...

    @abstractmethod
    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        ...

    @abstractmethod
    def send(self, kv_indices: np.ndarray, state_indices=None, is_last: Optional[bool] = None) -> None:
        ...

    @abstractmethod
    def poll(self) -> int:
        ...

    def aborted_by_peer(self) -> bool:
        """Prefill: the decode side aborted this request (not an error of this server)."""
        return False

    @abstractmethod
    def failure_exception(self):
        ...

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        return num_pages > 0

    def get_transfer_metric(self) -> KVTransferMetric:
        return KVTransferMetric()

    def clear(self) -> None:
        pass

    def abort(self) -> None:
        pass


class BaseKVReceiver(ABC):
    @abstractmethod
    def __init__(self, mgr: BaseKVManager, bootstrap_addr: str, bootstrap_room: Optional[int] = None):
        ...

    @abstractmethod
    def init(self, prefill_dp_rank: int = 0) -> None:
        ...

    @abstractmethod
    def send_metadata(self, kv_indices: np.ndarray, aux_index: Optional[int] = None, state_indices=None, decode_prefix_len=None) -> None:
        ...

    @abstractmethod
    def poll(self) -> int:
        ...

    @abstractmethod
    def failure_exception(self):
        ...

    def clear(self) -> None:
        pass

    def abort(self) -> None:
        pass


class BaseKVBootstrapServer(ABC):
    @abstractmethod
    def __init__(self, host: str, port: int):
        ...

    def close(self) -> None:
        pass
