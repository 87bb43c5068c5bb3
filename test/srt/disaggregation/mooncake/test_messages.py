"""ZMQ frame layouts of reference 5.7: round trips and the positions upstream peers rely on."""

import struct

import numpy as np
import pytest

from sglang.srt.disaggregation.mooncake.messages import (
    KVArgsRegisterInfo,
    TransferInfo,
    build_abort_message,
    build_status_message,
    parse_abort_message,
    parse_kv_status_message,
)
from sglang.srt.disaggregation.utils import pack_int_lists


def _reg():
    return KVArgsRegisterInfo(
        endpoint="127.0.0.1",
        dst_port=5555,
        mooncake_session_id="127.0.0.1:16000",
        dst_kv_ptrs=[2**40 + 1, 2**40 + 4096],
        dst_aux_ptrs=[7, 8, 9],
        dst_state_data_ptrs=[[100, 200]],
        dst_tp_rank=1,
        dst_attn_tp_size=2,
        dst_kv_item_len=1024,
        dst_state_item_lens=[[24, 32]],
        dst_state_dim_per_tensor=[[0, 0]],
        dst_kv_layer_ids=[0, 1],
        dst_state_layer_ids=[[0, 1]],
        staging_base_ptr=None,
        dst_kv_item_lens=[1024, 512],
    )


def test_registration_frames():
    reg = _reg()
    frames = reg.to_zmq()
    assert len(frames) == 20
    assert frames[0] == b"None" and frames[1] == b"127.0.0.1" and frames[2] == b"5555" and frames[3] == b"127.0.0.1:16000"
    assert frames[4] == struct.pack("<2Q", 2**40 + 1, 2**40 + 4096)
    assert frames[6] == pack_int_lists([[100, 200]], "Q")
    assert frames[7:10] == [b"1", b"2", b"1024"]
    assert frames[14] == b""  # no staging buffer
    assert KVArgsRegisterInfo.from_zmq(frames) == reg


def test_registration_optional_frames_and_malformed():
    short = KVArgsRegisterInfo.from_zmq(_reg().to_zmq()[:10])
    assert short.dst_kv_ptrs == _reg().dst_kv_ptrs and short.dst_kv_item_lens == [] and short.dst_state_item_lens == []
    with pytest.raises(ValueError):
        KVArgsRegisterInfo.from_zmq(_reg().to_zmq()[:9])


def test_transfer_info_frames_round_trip():
    info = TransferInfo(
        room=2**63 - 1,
        endpoint="127.0.0.1",
        dst_port=6000,
        mooncake_session_id="127.0.0.1:17000",
        dst_kv_indices=np.array([3, 9, 10, 11], dtype=np.int32),
        dst_aux_index=5,
        dst_state_indices=[[4]],
        required_dst_info_num=1,
        decode_prefix_len=0,
    )
    frames = info.to_zmq()
    assert len(frames) == 10
    assert frames[0] == str(2**63 - 1).encode() and frames[4] == np.array([3, 9, 10, 11], dtype=np.int32).tobytes()
    assert frames[5] == b"5" and frames[6] == pack_int_lists([[4]], "i") and frames[7] == b"1" and frames[8] == b"0"
    back = TransferInfo.from_zmq(frames)
    assert back.dst_kv_indices.dtype == np.int32 and back.dst_kv_indices.tolist() == [3, 9, 10, 11]
    assert (back.room, back.dst_aux_index, back.dst_state_indices, back.is_dummy) == (2**63 - 1, 5, [[4]], False)


def test_transfer_info_dummy():
    info = TransferInfo(1, "127.0.0.1", 1, "s", np.zeros(0, np.int32), None, [], is_dummy=True)
    frames = info.to_zmq()
    assert frames[4] == b"" and frames[5] == b"" and frames[6] == b""
    assert TransferInfo.from_zmq(frames).is_dummy


def test_status_messages():
    assert build_status_message(7, 4, 0) == [b"7", b"4", b"0"]
    assert parse_kv_status_message([b"7", b"4", b"0"]) == (7, 4, 0, None)
    msg = build_status_message(7, 0, 1, "prefill died – ü")
    assert parse_kv_status_message(msg) == (7, 0, 1, "prefill died – ü")
    assert parse_kv_status_message([b"TAG"] + msg) == (7, 0, 1, "prefill died – ü")  # optional leading tag
    assert parse_kv_status_message([b"7", b"4"]) is None
    assert parse_kv_status_message([b"7", b"x", b"0"]) is None


def test_abort_message():
    assert parse_abort_message(build_abort_message(9, "127.0.0.1:1", "why")) == (9, "127.0.0.1:1", "why")
