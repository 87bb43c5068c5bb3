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


UNMAPPED = (4096, 4096)  # a region the child declares but has no memory at (the first page is never mapped)


def _decode_main(conn):
    """Child: a zeroed buffer, offered through its identity socket (plus an unmapped region);
    answers 'dump' with the buffer's bytes."""
    buf = np.zeros(1 << 16, dtype=np.uint8)
    identity = same_host.HostIdentity([(buf.ctypes.data, buf.nbytes), UNMAPPED])
    conn.send((identity.frame(), buf.ctypes.data))
    while True:
        cmd = conn.recv()
        if cmd == "stop":
            return
        conn.send(buf.copy())


@pytest.fixture
def decode_process():
    if not same_host.copy_permitted(into_child=True):
        pytest.skip("this kernel does not let a process copy into its child (Yama ptrace_scope >= 2)")
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


def test_the_pid_comes_from_the_kernel_and_the_token_is_checked_before_every_batch(decode_process):
    proc, conn, frame, base = decode_process
    src = np.full(64, 9, dtype=np.uint8)
    writer = same_host.SameHostWriter()
    claim = same_host.parse_frame(frame)
    assert writer.write("peer", claim, [src.ctypes.data], [base], [64])
    (peer,) = writer._peers.values()
    assert peer.pid == proc.pid  # SO_PEERCRED names the process behind the socket
    conn.send("stop")
    proc.join(10)
    assert not writer.write("peer", claim, [src.ctypes.data], [base + 64], [64])  # it died: its pid holds no token
    (why,) = writer.refused.values()
    assert "cannot read pid" in why and "No such process" in why
    assert not writer.write("peer", claim, [src.ctypes.data], [base + 64], [64])  # refused for good
    assert not same_host.SameHostWriter().write("other", claim, [src.ctypes.data], [base], [64])  # socket gone


def test_blocks_outside_the_advertised_buffers_are_not_copied(decode_process):
    proc, conn, frame, base = decode_process
    peer = same_host.parse_frame(frame)
    src = np.full(64, 9, dtype=np.uint8)
    writer = same_host.SameHostWriter()
    for dst, n in ((base + (1 << 16) - 32, 64), (base - 64, 64), (base + (1 << 16), 1)):
        assert not writer.write("peer", peer, [src.ctypes.data, src.ctypes.data], [base, dst], [8, n])
    assert not writer.refused and not _dump(conn).any() and writer.copied_bytes == 0


def test_long_blocks_and_many_blocks_are_cut_into_calls(decode_process, monkeypatch):
    proc, conn, frame, base = decode_process
    monkeypatch.setattr(same_host, "_CALL_BYTES", 1000)  # as if a call could move 1000 bytes
    src = (np.arange(1 << 16) % 253 + 1).astype(np.uint8)
    writer = same_host.SameHostWriter()
    srcs, dsts, lens = [src.ctypes.data, src.ctypes.data + 5000], [base, base + 10000], [2500, 40000]
    assert writer.write("peer", same_host.parse_frame(frame), srcs, dsts, lens)
    got = _dump(conn)
    assert np.array_equal(got[:2500], src[:2500]) and np.array_equal(got[10000:50000], src[5000:45000])
    assert not got[2500:10000].any() and not got[50000:].any()
    calls = list(same_host._calls(*(np.asarray(v, dtype=np.uint64) for v in (srcs, dsts, lens))))
    assert [int(c[2].sum()) for c in calls] == [1000, 1000, 500] + [1000] * 40
    assert all(int(c[2].max()) <= 1000 for c in calls)


def test_bad_address_falls_back(decode_process):
    proc, conn, frame, base = decode_process
    src = np.full(64, 9, dtype=np.uint8)
    writer = same_host.SameHostWriter()
    assert not writer.write("a", same_host.parse_frame(frame), [src.ctypes.data], [UNMAPPED[0]], [64])
    (why,) = writer.refused.values()
    assert "copied 0 of 64 bytes (Bad address)" in why


def test_frames_and_the_identity_socket():
    identity = same_host.HostIdentity([(8192, 100), (4096, 50)])
    try:
        name = same_host.parse_frame(identity.frame())
        assert name == identity.name and identity.frame() == f"uds:{name}".encode()
        peer, why = same_host.verify_peer(name)
        assert why == "" and peer.pid == os.getpid() and peer.token_addr == identity.token.ctypes.data
        assert peer.token == identity.token.tobytes() and len(peer.token) == 16
        assert peer.regions.tolist() == [[4096, 50], [8192, 100]]  # sorted for the bounds check
    finally:
        identity.close()
    assert same_host.verify_peer(name)[0] is None  # closed: nobody answers
    token = identity.token.tobytes().hex()
    bad = [b"", b"\xff", f"{os.getpid()}:{identity.token.ctypes.data}:{token}:{'00' * 16}".encode(),  # the old frame
           b"uds:", b"uds:other-" + b"0" * 32, ("uds:" + name[:-1]).encode(), ("uds:" + name + "0").encode(),
           ("uds:" + name.upper()).encode(), ("uds:" + name + "\n").encode()]
    for frame in bad:
        assert same_host.parse_frame(frame) is None, frame
    assert same_host.verify_peer("not-ours")[0] is None


def test_registration_carries_the_socket_after_upstreams_frames():
    reg = KVArgsRegisterInfo("127.0.0.1", 1, "127.0.0.1:2", [1], [2], [[3]], same_host=b"7:8:ab")
    frames = reg.to_zmq()
    assert len(frames) == 21 and frames[20] == b"7:8:ab"
    assert KVArgsRegisterInfo.from_zmq(frames).same_host == b"7:8:ab" and reg.same_host_peer is None  # malformed
    assert KVArgsRegisterInfo.from_zmq(frames[:20]).same_host_peer is None  # an upstream decode: Mooncake only
    identity = same_host.HostIdentity([(4096, 64)])
    try:
        reg = KVArgsRegisterInfo.from_zmq([*frames[:20], identity.frame()])
        assert reg.same_host_peer == identity.name
    finally:
        identity.close()


def _transfer(p, room, src, dst, after_registration=lambda: None):
    snd, rcv = p.bootstrapped_pair(room, dst, aux_index=0)
    after_registration()
    p.prefill.metadata.set_buf(1, output_id=room, bootstrap_room=room)
    snd.init(len(src), aux_index=1)
    snd.send(src)
    return wait_poll(snd, DONE, 10), wait_poll(rcv, DONE, 10)


def test_manager_copies_where_mooncake_would_refuse():
    """The decode's KV memory is no longer registered with Mooncake (a Mooncake write fails, see
    test_conn_failures): the request still succeeds, so the bytes went by the same-host copy."""
    p = PDPair(page_size=2, num_pages=16, same_host_copy=True)
    try:
        p.decode.manager.engine.batch_deregister(p.decode.kv_args.kv_data_ptrs)
        src, dst = np.array([3, 4, 9], np.int32), np.array([7, 8, 1], np.int32)
        assert _transfer(p, 21, src, dst) == (KVPoll.Success, KVPoll.Success)
        p.assert_pages_equal(src, dst)
        assert p.decode.metadata.get_buf(0).output_id == 21
        writer = p.prefill.manager.same_host_writer
        assert writer.copied_bytes == len(src) * sum(p.prefill.kv_args.kv_item_lens) + sum(p.prefill.kv_args.aux_item_lens)
    finally:
        p.close()


def test_manager_falls_back_to_mooncake_when_the_token_is_wrong():
    p = PDPair(page_size=2, num_pages=16, same_host_copy=True)
    try:
        src, dst = np.array([2, 5], np.int32), np.array([6, 3], np.int32)
        assert _transfer(p, 22, src, dst) == (KVPoll.Success, KVPoll.Success)  # verified, copied
        writer = p.prefill.manager.same_host_writer
        copied = writer.copied_bytes
        assert copied > 0
        # the verified pid no longer holds the token: as if the decode died and its pid was reused
        p.decode.manager.host_identity.token ^= 0xFF
        src, dst = np.array([7, 1], np.int32), np.array([4, 9], np.int32)
        assert _transfer(p, 24, src, dst) == (KVPoll.Success, KVPoll.Success)
        p.assert_pages_equal(src, dst)
        (key,) = writer.refused
        assert writer.copied_bytes == copied and key == f"{p.decode.manager.session_id} ({p.decode.manager.host_identity.name})"
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
        p.assert_pages_equal(src, dst)
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
