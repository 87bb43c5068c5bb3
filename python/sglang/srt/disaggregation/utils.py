"""Shared vocabulary of PD disaggregation: modes, poll states, metadata rows, wire packing helpers.

Everything here is backend-independent so that the scheduler (prefill.py / decode.py) and the
transfer backends (fake, mooncake) can import it without importing each other.

Scheduler-facing API
--------------------
* `DisaggregationMode`, `TransferBackend`, `KVClassType`, `KVPoll`, `StateType`,
  `FAKE_BOOTSTRAP_HOST` ("2.2.2.2": a request whose `bootstrap_host` is this uses the fake sender /
  receiver, e.g. health checks and warmups in PD mode).
* `MetadataBuffers(size, max_top_logprobs_num=16, hidden_size=0)`: the CPU rows that travel with the
  KV (first output token, cached_tokens, output logprob, top logprobs, bootstrap_room for
  validation). `set_buf(idx, ...)` on prefill before the last `send()`, `get_buf(idx)` on decode after
  `poll() == KVPoll.Success`. `get_buf_infos()` -> (ptrs, lens, item_lens) for `KVArgs.aux_*`.
* `ReqToMetadataIdxAllocator(size)`: `alloc()` -> row index or None, `free(idx)`.
* `kv_to_page_indices(kv_indices, page_size)`: token slots of a request -> np.int32 page indices.
* `encode_failure(message, status)` / `decode_failure(reason)`: a refusal that the peer answers with
  the same HTTP status travels as "HTTP <status>: <text>".
"""

from __future__ import annotations

import struct
from collections import deque
from enum import Enum
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

FAKE_BOOTSTRAP_HOST = "2.2.2.2"


class DisaggregationMode(Enum):
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


class TransferBackend(Enum):
    MOONCAKE = "mooncake"
    # Input spelling of "mooncake forced onto TCP" (MC_FORCE_TCP=1); maps to the Mooncake classes.
    MOONCAKE_TCP = "mooncake_tcp"
    NIXL = "nixl"
    ASCEND = "ascend"
    MORI = "mori"
    FAKE = "fake"


class KVClassType(Enum):
    KVARGS = "kvargs"
    MANAGER = "manager"
    SENDER = "sender"
    RECEIVER = "receiver"
    BOOTSTRAP_SERVER = "bootstrap_server"


class KVPoll:
    """Plain ints (not an Enum) so that schedulers can all-reduce them with MIN across ranks."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class StateType(str, Enum):
    MAMBA = "mamba"
    QSA_PENDING = "qsa_pending"
    QSA_COMPRESSED = "qsa_compressed"
    SWA = "swa"
    DSA = "dsa"
    DSA_TAIL = "dsa_tail"
    MINIMAX_INDEX_K = "minimax_index_k"
    MINIMAX_DENSE_KV = "minimax_dense_kv"
    SWA_RING = "swa_ring"
    DSV4_REQUEST_STATE = "c128_state"
    REQUEST_ROW = "request_row"
    BLOCK_SCALE = "block_scale"
    BLOCK_SCALE_SWA = "block_scale_swa"


# A failure that the peer should answer with a given HTTP status (e.g. the prefill refused the
# request as a client error: the decode answers 400, not 500) travels as "HTTP <status>: <text>".
_STATUS_PREFIX = "HTTP "


def encode_failure(message: str, status_code: int) -> str:
    return f"{_STATUS_PREFIX}{int(status_code)}: {message}"


def decode_failure(reason: str) -> Tuple[Optional[int], str]:
    """(status code or None, message) of a failure reason."""
    if reason.startswith(_STATUS_PREFIX):
        head, _, rest = reason[len(_STATUS_PREFIX):].partition(": ")
        if head.isdigit() and rest:
            return int(head), rest
    return None, reason


# ---------------------------------------------------------------------------------------------
# Metadata rows


class MetadataRow(NamedTuple):
    output_id: int
    cached_tokens: int
    output_token_logprob_val: float
    output_token_logprob_idx: int
    top_logprobs_val: List[float]
    top_logprobs_idx: List[int]
    bootstrap_room: int
    hidden_state: Optional[torch.Tensor]


class MetadataBuffers:
    """Fixed-size CPU rows, one per in-flight request, transferred byte-for-byte next to the KV.

    Every row is padded to at least 64 bytes (16 x int32/float32, 8 x int64) as upstream does for
    RDMA alignment, so a row of each buffer is one transfer block of `item_len` bytes.
    """

    ROW_INTS = 16  # int32/float32 columns in the small per-request rows (64 bytes)

    def __init__(self, size: int, max_top_logprobs_num: int = 16, hidden_size: int = 0, hidden_states_dtype=torch.float32):
        self.size = size
        self.max_top_logprobs_num = max_top_logprobs_num
        top_cols = max(max_top_logprobs_num, self.ROW_INTS)
        self.output_ids = torch.zeros((size, self.ROW_INTS), dtype=torch.int32)
        # column 0: cached_tokens, column 1: number of valid top logprobs, column 2: has-logprob flag
        self.cached_tokens = torch.zeros((size, self.ROW_INTS), dtype=torch.int32)
        self.output_token_logprobs_val = torch.zeros((size, self.ROW_INTS), dtype=torch.float32)
        self.output_token_logprobs_idx = torch.zeros((size, self.ROW_INTS), dtype=torch.int32)
        self.output_top_logprobs_val = torch.zeros((size, top_cols), dtype=torch.float32)
        self.output_top_logprobs_idx = torch.zeros((size, top_cols), dtype=torch.int32)
        self.bootstrap_room = torch.zeros((size, 8), dtype=torch.int64)
        self.output_hidden_states = (
            torch.zeros((size, max(hidden_size, 16)), dtype=hidden_states_dtype) if hidden_size > 0 else None
        )
        self.hidden_size = hidden_size

    def _buffers(self) -> List[torch.Tensor]:
        bufs = [
            self.output_ids,
            self.cached_tokens,
            self.output_token_logprobs_val,
            self.output_token_logprobs_idx,
            self.output_top_logprobs_val,
            self.output_top_logprobs_idx,
            self.bootstrap_room,
        ]
        if self.output_hidden_states is not None:
            bufs.append(self.output_hidden_states)
        return bufs

    def get_buf_infos(self) -> Tuple[List[int], List[int], List[int]]:
        bufs = self._buffers()
        return (
            [b.data_ptr() for b in bufs],
            [b.nbytes for b in bufs],
            [b[0].nbytes for b in bufs],
        )

    def set_buf(
        self,
        idx: int,
        output_id: int,
        cached_tokens: int = 0,
        output_token_logprob_val: Optional[float] = None,
        output_token_logprob_idx: Optional[int] = None,
        top_logprobs_val: Optional[Sequence[float]] = None,
        top_logprobs_idx: Optional[Sequence[int]] = None,
        bootstrap_room: Optional[int] = None,
        hidden_state: Optional[torch.Tensor] = None,
    ) -> None:
        self.output_ids[idx].zero_()
        self.output_ids[idx, 0] = int(output_id)
        self.cached_tokens[idx].zero_()
        self.cached_tokens[idx, 0] = int(cached_tokens)
        self.output_token_logprobs_val[idx].zero_()
        self.output_token_logprobs_idx[idx].zero_()
        if output_token_logprob_val is not None:
            self.output_token_logprobs_val[idx, 0] = float(output_token_logprob_val)
            self.output_token_logprobs_idx[idx, 0] = int(output_id if output_token_logprob_idx is None else output_token_logprob_idx)
            self.cached_tokens[idx, 2] = 1
        self.output_top_logprobs_val[idx].zero_()
        self.output_top_logprobs_idx[idx].zero_()
        if top_logprobs_val is not None:
            n = len(top_logprobs_val)
            if n > self.max_top_logprobs_num:
                raise ValueError(f"top_logprobs_num {n} exceeds the metadata buffer maximum {self.max_top_logprobs_num}")
            if top_logprobs_idx is None or len(top_logprobs_idx) != n:
                raise ValueError("top_logprobs_val and top_logprobs_idx must have the same length")
            if n:
                self.output_top_logprobs_val[idx, :n] = torch.tensor(list(top_logprobs_val), dtype=torch.float32)
                self.output_top_logprobs_idx[idx, :n] = torch.tensor(list(top_logprobs_idx), dtype=torch.int32)
            self.cached_tokens[idx, 1] = n
        self.bootstrap_room[idx].zero_()
        if bootstrap_room is not None:
            self.bootstrap_room[idx, 0] = int(bootstrap_room)
        if hidden_state is not None:
            if self.output_hidden_states is None:
                raise ValueError("MetadataBuffers was built without hidden_size; cannot store hidden states")
            self.output_hidden_states[idx, : self.hidden_size] = hidden_state.reshape(-1)[: self.hidden_size]

    def get_buf(self, idx: int) -> MetadataRow:
        has_logprob = int(self.cached_tokens[idx, 2]) == 1
        n_top = int(self.cached_tokens[idx, 1])
        return MetadataRow(
            output_id=int(self.output_ids[idx, 0]),
            cached_tokens=int(self.cached_tokens[idx, 0]),
            output_token_logprob_val=float(self.output_token_logprobs_val[idx, 0]) if has_logprob else None,
            output_token_logprob_idx=int(self.output_token_logprobs_idx[idx, 0]) if has_logprob else None,
            top_logprobs_val=self.output_top_logprobs_val[idx, :n_top].tolist(),
            top_logprobs_idx=self.output_top_logprobs_idx[idx, :n_top].tolist(),
            bootstrap_room=int(self.bootstrap_room[idx, 0]),
            hidden_state=(
                self.output_hidden_states[idx, : self.hidden_size].clone() if self.output_hidden_states is not None else None
            ),
        )

    def clear_buf(self, idx: int) -> None:
        for b in self._buffers():
            b[idx].zero_()


class ReqToMetadataIdxAllocator:
    """Free list of metadata rows (upstream sizes it `max_running_requests * 2`)."""

    def __init__(self, size: int):
        self.size = size
        self.free_slots = deque(range(size))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self) -> Optional[int]:
        if not self.free_slots:
            return None
        return self.free_slots.popleft()

    def free(self, free_index: int) -> None:
        self.free_slots.append(free_index)


# ---------------------------------------------------------------------------------------------
# Wire packing (reference 5.7)


def pack_list_of_buffers(bufs: Sequence[bytes]) -> bytes:
    """`<n, len_0..len_{n-1}>` as little-endian uint32, then the buffers; b"" for an empty list."""
    if not bufs:
        return b""
    return struct.pack(f"<{len(bufs) + 1}I", len(bufs), *[len(b) for b in bufs]) + b"".join(bufs)


def unpack_list_of_buffers(data: bytes) -> List[bytes]:
    if not data:
        return []
    (n,) = struct.unpack_from("<I", data, 0)
    lens = struct.unpack_from(f"<{n}I", data, 4)
    out, off = [], 4 * (n + 1)
    for ln in lens:
        out.append(bytes(data[off : off + ln]))
        off += ln
    if off != len(data):
        raise ValueError(f"packed buffer list has {len(data) - off} trailing bytes")
    return out


def pack_int_lists(lists: Sequence[Sequence[int]], fmt: str) -> bytes:
    return pack_list_of_buffers([struct.pack(f"<{len(a)}{fmt}", *a) for a in lists])


def unpack_int_lists(data: bytes, fmt: str) -> List[List[int]]:
    size = struct.calcsize(f"<{fmt}")
    return [list(struct.unpack(f"<{len(b) // size}{fmt}", b)) for b in unpack_list_of_buffers(data)]


def pack_ints(values: Sequence[int], fmt: str) -> bytes:
    """A flat run of ints (registration frames: kv ptrs as "Q", layer ids as "I")."""
    return struct.pack(f"<{len(values)}{fmt}", *values)


def unpack_ints(data: bytes, fmt: str) -> List[int]:
    size = struct.calcsize(f"<{fmt}")
    return list(struct.unpack(f"<{len(data) // size}{fmt}", data))


# ---------------------------------------------------------------------------------------------
# Page index helpers


def group_concurrent_contiguous(src_indices: np.ndarray, dst_indices: np.ndarray) -> Tuple[List[List[int]], List[List[int]]]:
    """Split parallel index vectors into runs where both sides advance by exactly one.

    Each run becomes one transfer block per layer buffer (reference 5.8).
    """
    src_indices = np.asarray(src_indices)
    dst_indices = np.asarray(dst_indices)
    if src_indices.shape != dst_indices.shape:
        raise ValueError(f"index length mismatch: src={src_indices.size}, dst={dst_indices.size}")
    if src_indices.size == 0:
        return [], []
    brk = np.where((np.diff(src_indices) != 1) | (np.diff(dst_indices) != 1))[0] + 1
    src_groups = [g.tolist() for g in np.split(src_indices, brk)]
    dst_groups = [g.tolist() for g in np.split(dst_indices, brk)]
    return src_groups, dst_groups


def kv_to_page_indices(kv_indices, page_size: int) -> np.ndarray:
    """Token slot indices of a request (page aligned, in order) -> np.int32 page indices."""
    if isinstance(kv_indices, torch.Tensor):
        kv_indices = kv_indices.cpu().numpy()
    kv_indices = np.asarray(kv_indices)
    if page_size == 1:
        return kv_indices.astype(np.int32)
    return (kv_indices[::page_size] // page_size).astype(np.int32)


def kv_to_page_num(num_kv_indices: int, page_size: int) -> int:
    return (num_kv_indices + page_size - 1) // page_size
