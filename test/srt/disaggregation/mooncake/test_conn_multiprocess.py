"""Prefill in its own process (own Mooncake engine, bootstrap server, ZMQ sockets), decode here:
pages arrive across processes (by Mooncake TCP, and by the same-host copy when the decode offers
it), and SIGKILLing the prefill process fails decode's in-flight request through the heartbeat
within its timeout (the crash case the in-process tests can only approximate by closing the
manager)."""

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest
import torch

from pd_pair import Side, wait_poll
from sglang.srt.disaggregation.mooncake import same_host
from sglang.srt.configs.runtime_config import DisaggConfig
from sglang.srt.disaggregation.utils import DisaggregationMode, KVPoll

DONE = {KVPoll.Success, KVPoll.Failed}
PAGE_SIZE = 4


def _prefill_main(conn, port):
    """Child: bootstrap server + prefill manager; serves 'send' commands until told to stop."""
    from pd_pair import BACKEND
    from sglang.srt.disaggregation.transfer_backends import get_kv_class
    from sglang.srt.disaggregation.bootstrap_server import KVBootstrapServer
    from sglang.srt.disaggregation.utils import KVClassType

    torch.set_num_threads(1)
    server = KVBootstrapServer("127.0.0.1", port)
    sa = DisaggConfig(host="127.0.0.1", disaggregation_bootstrap_port=port, disaggregation_transfer_backend=BACKEND, tp_size=1)
    side = Side(DisaggregationMode.PREFILL, sa, PAGE_SIZE, 32, seed=7)
    sender_cls = get_kv_class(BACKEND, KVClassType.SENDER)
    conn.send("ready")
    while True:
        cmd = conn.recv()
        if cmd[0] == "stop":
            break
        _, room, src, aux, do_send = cmd
        snd = sender_cls(side.manager, f"127.0.0.1:{port}", room)
        state = wait_poll(snd, {KVPoll.WaitingForInput, KVPoll.Failed}, 10)
        if state == KVPoll.WaitingForInput and do_send:
            side.metadata.set_buf(aux, output_id=room % 1000, bootstrap_room=room)
            snd.init(len(src), aux_index=aux)
            snd.send(np.array(src, np.int32))
            state = wait_poll(snd, DONE, 10)
        pages = [[side.page(b, p).clone() for p in src] for b in range(side.num_buffers)]
        conn.send((state, pages, side.manager.same_host_writer.copied_bytes))
    side.manager.close()
    server.close()


@pytest.fixture
def prefill_process(monkeypatch):
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "0.2")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "2")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "30")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    from sglang.srt.utils import get_free_port

    port = get_free_port()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_prefill_main, args=(child, port), daemon=True)
    proc.start()
    assert parent.poll(60), "prefill process did not start"
    assert parent.recv() == "ready"
    yield proc, parent, port
    if proc.is_alive():
        parent.send(("stop",))
        proc.join(10)
    if proc.is_alive():
        proc.kill()
        proc.join(5)


@pytest.mark.parametrize("same_host_copy", [False, True], ids=["mooncake_tcp", "same_host_copy"])
def test_cross_process_transfer_then_prefill_killed(prefill_process, same_host_copy):
    proc, conn, port = prefill_process
    sa = DisaggConfig(host="127.0.0.1", disaggregation_bootstrap_port=port, disaggregation_transfer_backend="mooncake_tcp", tp_size=1)
    decode = Side(DisaggregationMode.DECODE, sa, PAGE_SIZE, 32, same_host_copy=same_host_copy)
    from pd_pair import BACKEND
    from sglang.srt.disaggregation.transfer_backends import get_kv_class
    from sglang.srt.disaggregation.utils import KVClassType

    receiver_cls = get_kv_class(BACKEND, KVClassType.RECEIVER)
    addr = f"127.0.0.1:{port}"
    try:
        # 1. a real transfer between processes
        src, dst = [5, 6, 20], [9, 1, 2]
        rcv = receiver_cls(decode.manager, addr, 11)
        rcv.init(0)
        assert wait_poll(rcv, {KVPoll.WaitingForInput, KVPoll.Failed}, 10) == KVPoll.WaitingForInput
        rcv.send_metadata(np.array(dst, np.int32), 3)
        conn.send(("send", 11, src, 2, True))
        assert conn.poll(30)
        state, pages, copied_bytes = conn.recv()
        assert state == KVPoll.Success
        # the bytes went by the path the decode offered, where the kernel lets the child write into us
        assert (copied_bytes > 0) == (same_host_copy and same_host.copy_permitted())
        assert wait_poll(rcv, DONE, 10) == KVPoll.Success
        for b in range(decode.num_buffers):
            for i, d in enumerate(dst):
                assert torch.equal(decode.page(b, d), pages[b][i])
        row = decode.metadata.get_buf(3)
        assert (row.output_id, row.bootstrap_room) == (11, 11)

        # 2. the prefill process dies (SIGKILL, no cleanup) while a request is in flight
        rcv2 = receiver_cls(decode.manager, addr, 12)
        rcv2.init(0)
        assert wait_poll(rcv2, {KVPoll.WaitingForInput, KVPoll.Failed}, 10) == KVPoll.WaitingForInput
        rcv2.send_metadata(np.array([4], np.int32), 0)
        conn.send(("send", 12, [1], 0, False))  # prefill sees the metadata but never sends
        assert conn.poll(30)
        assert conn.recv()[0] == KVPoll.WaitingForInput
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(5)
        t0 = time.monotonic()
        assert wait_poll(rcv2, DONE, 10) == KVPoll.Failed
        assert time.monotonic() - t0 < 0.2 * 2 + 2.5
        with pytest.raises(Exception, match=r"Losing connection with prefill instance \(bootstrap_addr: 127.0.0.1:\d+\)"):
            rcv2.failure_exception()
    finally:
        decode.manager.close()
