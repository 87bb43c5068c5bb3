"""Same-host KV copies (`same_host.py`): a real second process receives blocks through
process_vm_writev only when it proves it holds its token; everything else falls back to Mooncake."""

import multiprocessing as mp
import os

import numpy as np
import pytest
import torch

from pd_pair import PDPair, wait_poll
from sglang.srt.disaggregation.mooncake import same_host
from sglang.srt.disaggregation.mooncake.messages import KVArgsRegisterInfo
from sglang.srt.disaggregation.utils import KVPoll

DONE = {KVPoll.Success, KVPoll.Failed}


def _decode_main(conn):
    """Child: a token and a zeroed buffer; answers 'dump' with the buffer's bytes."""
    identity = same_host.HostIdentity()
    buf = np.zeros(1 << 16, dtype=np.uint8)
    conn.send((identity.frame(), buf.ctypes.data))
    while True:
        cmd = conn.recv()
        if cmd == "stop":
            return
        conn.send(buf.copy())


@pytest.fixture
def decode_process():
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_decode_main, args=(child,), daemon=True)
    proc.start()
    assert parent.poll(60)
    frame, base = parent.recv()
    yield proc, parent, frame, base
    if proc.is_alive():
        parent.send("stop")
        proc.join(10)


def _dump(conn):
    conn.send("dump")
    return conn.recv()


def test_blocks_land_in_the_other_process(decode_process):
    proc, conn, frame, base = decode_process
    src = np.arange(1 << 16, dtype=np.uint32).view(np.uint8)  # distinct bytes everywhere
    offsets = [(0, 100, 7), (5000, 3000, 4096), (60000, 64, 65000)]  # (src off, len, dst off)
    writer = same_host.SameHostWriter()
    ok = writer.write("peer", same_host.parse_frame(frame), [src.ctypes.data + s for s, _, _ in offsets],
                      [base + d for _, _, d in offsets], [n for _, n, _ in offsets])
    assert ok and writer.copied_bytes == 100 + 3000 + 64 and not writer.refused
    got, want = _dump(conn), np.zeros(1 << 16, dtype=np.uint8)
    for s, n, d in offsets:
        want[d:d + n] = src[s:s + n]
    assert np.array_equal(got, want)


def test_more_blocks_than_one_call_takes(decode_process):
    proc, conn, frame, base = decode_process
    src = (np.arange(3000) % 251 + 1).astype(np.uint8)
    n = 2500  # > IOV_MAX (1024): three calls
    writer = same_host.SameHostWriter()
    srcs = [src.ctypes.data + i for i in range(n)]
    dsts = [base + 2 * i for i in range(n)]  # every other byte
    assert writer.write("peer", same_host.parse_frame(frame), srcs, dsts, [1] * n)
    got = _dump(conn)
    assert np.array_equal(got[0:2 * n:2], src[:n]) and not got[1:2 * n:2].any()


def test_wrong_token_writes_nothing_and_is_not_tried_again(decode_process):
    proc, conn, frame, base = decode_process
    pid, addr, token = same_host.parse_frame(frame)
    src = np.full(64, 9, dtype=np.uint8)
    writer = same_host.SameHostWriter()
    forged = (pid, addr, bytes(b ^ 0xFF for b in token))
    assert not writer.write("peer", forged, [src.ctypes.data], [base], [64])
    assert "does not hold the decode's token" in writer.refused[f"peer (pid {pid})"]
    assert not writer.write("peer", (pid, addr, token), [src.ctypes.data], [base], [64])  # refused for good
    assert not _dump(conn).any() and writer.copied_bytes == 0


def test_dead_pid_and_bad_address_fall_back(decode_process):
    proc, conn, frame, base = decode_process
    pid, addr, token = same_host.parse_frame(frame)
    src = np.full(64, 9, dtype=np.uint8)
    writer = same_host.SameHostWriter()
    assert not writer.write("a", (pid, addr, token), [src.ctypes.data], [4096], [64])  # unmapped page
    assert "copied 0 of 64 bytes (Bad address)" in writer.refused[f"a (pid {pid})"]
    conn.send("stop")
    proc.join(10)
    assert not writer.write("b", (pid, addr, token), [src.ctypes.data], [base], [64])
    assert "cannot read pid" in writer.refused[f"b (pid {pid})"] and "No such process" in writer.refused[f"b (pid {pid})"]


def test_frames():
    identity = same_host.HostIdentity()
    pid, addr, token = same_host.parse_frame(identity.frame())
    assert addr == identity.token.ctypes.data and token == identity.token.tobytes() and len(token) == 16
    for bad in (b"", b"1:2", b"x:y:z", b"\xff"):
        assert same_host.parse_frame(bad) is None


def test_registration_carries_the_token_after_upstreams_frames():
    reg = KVArgsRegisterInfo("127.0.0.1", 1, "127.0.0.1:2", [1], [2], [[3]], same_host=b"7:8:ab")
    frames = reg.to_zmq()
    assert len(frames) == 21 and frames[20] == b"7:8:ab"
    assert KVArgsRegisterInfo.from_zmq(frames).same_host == b"7:8:ab"
    assert KVArgsRegisterInfo.from_zmq(frames[:20]).same_host == b""  # an upstream decode: Mooncake only


def _transfer(p, room, src, dst, after_registration=lambda: None):
    snd, rcv = p.bootstrapped_pair(room, dst, aux_index=0)
    after_registration()
    p.prefill.metadata.set_buf(1, output_id=room, bootstrap_room=room)
    snd.init(len(src), aux_index=1)
    snd.send(src)
    return wait_poll(snd, DONE, 10), wait_poll(rcv, DONE, 10)


def _assert_pages_equal(p, src, dst):
    for b in range(p.prefill.num_buffers):
        for s, d in zip(src.tolist(), dst.tolist()):
            assert torch.equal(p.decode.page(b, d), p.prefill.page(b, s)), (b, s, d)


def test_manager_copies_where_mooncake_would_refuse():
    """The decode's KV memory is no longer registered with Mooncake (a Mooncake write fails, see
    test_conn_failures): the request still succeeds, so the bytes went by the same-host copy."""
    p = PDPair(page_size=2, num_pages=16, same_host_copy=True)
    try:
        p.decode.manager.engine.batch_deregister(p.decode.kv_args.kv_data_ptrs)
        src, dst = np.array([3, 4, 9], np.int32), np.array([7, 8, 1], np.int32)
        assert _transfer(p, 21, src, dst) == (KVPoll.Success, KVPoll.Success)
        _assert_pages_equal(p, src, dst)
        assert p.decode.metadata.get_buf(0).output_id == 21
        writer = p.prefill.manager.same_host_writer
        assert writer.copied_bytes == len(src) * sum(p.prefill.kv_args.kv_item_lens) + sum(p.prefill.kv_args.aux_item_lens)
    finally:
        p.close()


def test_manager_falls_back_to_mooncake_when_the_token_is_wrong():
    p = PDPair(page_size=2, num_pages=16, same_host_copy=True)
    try:
        def forget_token():  # the registered pid no longer holds the token: as if it were another process
            p.decode.manager.host_identity.token ^= 0xFF

        src, dst = np.array([2, 5], np.int32), np.array([6, 3], np.int32)
        assert _transfer(p, 22, src, dst, forget_token) == (KVPoll.Success, KVPoll.Success)
        _assert_pages_equal(p, src, dst)
        writer = p.prefill.manager.same_host_writer
        assert writer.copied_bytes == 0 and list(writer.refused) == [f"{p.decode.manager.session_id} (pid {os.getpid()})"]
    finally:
        p.close()


def test_mamba_state_slots_by_copy():
    p = PDPair(page_size=4, num_pages=16, with_state=True, same_host_copy=True)
    try:
        src, dst = np.array([3, 4], np.int32), np.array([9, 1], np.int32)
        snd, rcv = p.bootstrapped_pair(42, dst, aux_index=0, state_indices=[[5]])
        snd.init(2, aux_index=1)
        snd.send(src, state_indices=[2])
        assert wait_poll(rcv, DONE, 10) == KVPoll.Success
        for t_src, t_dst in zip(p.prefill.state, p.decode.state):
            assert torch.equal(t_dst[5], t_src[2]) and not t_dst[[0, 1, 2, 3, 4]].any()
        _assert_pages_equal(p, src, dst)
        assert p.prefill.manager.same_host_writer.copied_bytes > 0
    finally:
        p.close()


def test_switched_off_on_the_decode(monkeypatch):
    monkeypatch.setenv("SGLANG_DISAGGREGATION_SAME_HOST_COPY", "0")
    assert not same_host.enabled()
    p = PDPair(page_size=2, num_pages=8, same_host_copy=False)
    try:
        assert p.decode.manager.host_identity is None
        src, dst = np.array([1], np.int32), np.array([2], np.int32)
        assert _transfer(p, 23, src, dst) == (KVPoll.Success, KVPoll.Success)
        assert p.prefill.manager.same_host_writer.copied_bytes == 0
    finally:
        p.close()
