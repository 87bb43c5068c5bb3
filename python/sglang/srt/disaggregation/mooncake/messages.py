"""ZMQ control-plane frames between decode and prefill KV managers (reference 5.7).

All ints travel as ASCII except the pointer / index payloads, which are packed little-endian.
Keeping builders and parsers side by side makes the layout testable as a round trip.

* Registration (decode -> prefill, once per peer; first frame b"None"): `KVArgsRegisterInfo`.
* Per-request metadata (decode -> prefill): `TransferInfo` (np.int32 **page** indices).
* Status (prefill -> decode): `[room, poll, prefill_rank(, failure_reason)]`.
* Abort (decode -> prefill): `[b"ABORT", room, session_id, reason]`.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import numpy as np

from sglang.srt.disaggregation.mooncake.same_host import parse_frame
from sglang.srt.disaggregation.utils import pack_int_lists, pack_ints, unpack_int_lists, unpack_ints

REGISTRATION_ROOM = b"None"
ABORT_TAG = b"ABORT"


def _s(frame: bytes) -> str:
    return frame.decode("ascii")


@dataclasses.dataclass
class KVArgsRegisterInfo:
    """What a decode rank tells a prefill rank about its buffers (frames >= 10 are optional)."""

    endpoint: str
    dst_port: int
    mooncake_session_id: str
    dst_kv_ptrs: List[int]
    dst_aux_ptrs: List[int]
    dst_state_data_ptrs: List[List[int]]
    dst_tp_rank: int = 0
    dst_attn_tp_size: int = 1
    dst_kv_item_len: int = 0
    dst_state_item_lens: List[List[int]] = dataclasses.field(default_factory=list)
    dst_state_dim_per_tensor: List[List[int]] = dataclasses.field(default_factory=list)
    dst_kv_layer_ids: List[int] = dataclasses.field(default_factory=list)
    dst_state_layer_ids: List[List[int]] = dataclasses.field(default_factory=list)
    staging_base_ptr: Optional[int] = None
    staging_total_size: int = 0
    dst_dcp_size: int = 1
    dst_dcp_rank: int = 0
    staging_slot_layer_ids: List[int] = dataclasses.field(default_factory=list)
    dst_kv_item_lens: List[int] = dataclasses.field(default_factory=list)
    same_host: bytes = b""  # frame 20, ours: same_host.HostIdentity.frame() of the decode rank, or absent
    # the decode's identity socket (same_host.py verifies the process behind it), or None
    same_host_peer: Optional[str] = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:  # parsed once per registration, not per transfer
        self.same_host_peer = parse_frame(self.same_host) if self.same_host else None

    def to_zmq(self) -> List[bytes]:
        frames = [
            REGISTRATION_ROOM,
            self.endpoint.encode("ascii"),
            str(self.dst_port).encode("ascii"),
            self.mooncake_session_id.encode("ascii"),
            pack_ints(self.dst_kv_ptrs, "Q"),
            pack_ints(self.dst_aux_ptrs, "Q"),
            pack_int_lists(self.dst_state_data_ptrs, "Q"),
            str(self.dst_tp_rank).encode("ascii"),
            str(self.dst_attn_tp_size).encode("ascii"),
            str(self.dst_kv_item_len).encode("ascii"),
            pack_int_lists(self.dst_state_item_lens, "I"),
            pack_int_lists(self.dst_state_dim_per_tensor, "I"),
            pack_ints(self.dst_kv_layer_ids, "I"),
            pack_int_lists(self.dst_state_layer_ids, "I"),
            pack_ints([self.staging_base_ptr], "Q") if self.staging_base_ptr is not None else b"",
            str(self.staging_total_size).encode("ascii"),
            str(self.dst_dcp_size).encode("ascii"),
            str(self.dst_dcp_rank).encode("ascii"),
            pack_ints(self.staging_slot_layer_ids, "I"),
            pack_ints(self.dst_kv_item_lens, "Q"),
        ]
        return frames + [self.same_host] if self.same_host else frames  # upstream's 20 frames, then ours

    @classmethod
    def from_zmq(cls, msg: List[bytes]) -> "KVArgsRegisterInfo":
        if len(msg) < 10 or msg[0] != REGISTRATION_ROOM:
            raise ValueError(f"malformed registration message ({len(msg)} frames)")
        opt = lambda i: msg[i] if len(msg) > i else b""  # noqa: E731
        staging = opt(14)
        return cls(
            endpoint=_s(msg[1]),
            dst_port=int(_s(msg[2])),
            mooncake_session_id=_s(msg[3]),
            dst_kv_ptrs=unpack_ints(msg[4], "Q"),
            dst_aux_ptrs=unpack_ints(msg[5], "Q"),
            dst_state_data_ptrs=unpack_int_lists(msg[6], "Q"),
            dst_tp_rank=int(_s(msg[7])),
            dst_attn_tp_size=int(_s(msg[8])),
            dst_kv_item_len=int(_s(msg[9])),
            dst_state_item_lens=unpack_int_lists(opt(10), "I"),
            dst_state_dim_per_tensor=unpack_int_lists(opt(11), "I"),
            dst_kv_layer_ids=unpack_ints(opt(12), "I"),
            dst_state_layer_ids=unpack_int_lists(opt(13), "I"),
            staging_base_ptr=unpack_ints(staging, "Q")[0] if staging else None,
            staging_total_size=int(_s(opt(15)) or 0),
            dst_dcp_size=int(_s(opt(16)) or 1),
            dst_dcp_rank=int(_s(opt(17)) or 0),
            staging_slot_layer_ids=unpack_ints(opt(18), "I"),
            dst_kv_item_lens=unpack_ints(opt(19), "Q"),
            same_host=opt(20),
        )


@dataclasses.dataclass
class TransferInfo:
    """Where one decode rank wants one request's pages, metadata row and state slots written."""

    room: int
    endpoint: str
    dst_port: int
    mooncake_session_id: str
    dst_kv_indices: np.ndarray
    dst_aux_index: Optional[int]
    dst_state_indices: List[List[int]]
    required_dst_info_num: int = 1
    decode_prefix_len: int = 0
    is_dummy: bool = False

    def to_zmq(self) -> List[bytes]:
        return [
            str(self.room).encode("ascii"),
            self.endpoint.encode("ascii"),
            str(self.dst_port).encode("ascii"),
            self.mooncake_session_id.encode("ascii"),
            b"" if self.is_dummy else np.ascontiguousarray(self.dst_kv_indices, dtype=np.int32).tobytes(),
            b"" if self.is_dummy or self.dst_aux_index is None else str(self.dst_aux_index).encode("ascii"),
            pack_int_lists(self.dst_state_indices, "i") if self.dst_state_indices else b"",
            str(self.required_dst_info_num).encode("ascii"),
            str(self.decode_prefix_len or 0).encode("ascii"),
            b"",  # device_kv_indices (staging path; unused here)
        ]

    @classmethod
    def from_zmq(cls, msg: List[bytes]) -> "TransferInfo":
        if len(msg) < 8:
            raise ValueError(f"malformed transfer metadata message ({len(msg)} frames)")
        is_dummy = msg[4] == b"" and msg[5] == b""
        return cls(
            room=int(_s(msg[0])),
            endpoint=_s(msg[1]),
            dst_port=int(_s(msg[2])),
            mooncake_session_id=_s(msg[3]),
            dst_kv_indices=np.frombuffer(msg[4], dtype=np.int32).copy(),
            dst_aux_index=int(_s(msg[5])) if msg[5] else None,
            dst_state_indices=unpack_int_lists(msg[6], "i") if msg[6] else [],
            required_dst_info_num=int(_s(msg[7])),
            decode_prefix_len=int(_s(msg[8])) if len(msg) > 8 and msg[8] else 0,
            is_dummy=is_dummy,
        )


def build_status_message(room: int, status: int, prefill_rank: int, failure_reason: Optional[str] = None) -> List[bytes]:
    frames = [str(room).encode("ascii"), str(int(status)).encode("ascii"), str(prefill_rank).encode("ascii")]
    if failure_reason is not None:
        frames.append(failure_reason.encode("utf-8"))
    return frames


def parse_kv_status_message(msg: List[bytes]) -> Optional[Tuple[int, int, int, Optional[str]]]:
    """-> (room, status, prefill_rank, failure_reason) or None for a malformed message.

    An optional leading non-numeric tag frame is skipped.
    """
    if msg and not msg[0].lstrip(b"-").isdigit():
        msg = msg[1:]
    if len(msg) < 3:
        return None
    try:
        room, status, rank = int(msg[0]), int(msg[1]), int(msg[2])
    except ValueError:
        return None
    reason = msg[3].decode("utf-8", "replace") if len(msg) > 3 else None
    return room, status, rank, reason


def build_abort_message(room: int, session_id: str, reason: str) -> List[bytes]:
    return [ABORT_TAG, str(room).encode("ascii"), session_id.encode("ascii"), reason.encode("utf-8")]


def parse_abort_message(msg: List[bytes]) -> Tuple[int, str, str]:
    return int(msg[1]), msg[2].decode("ascii"), msg[3].decode("utf-8", "replace") if len(msg) > 3 else ""
