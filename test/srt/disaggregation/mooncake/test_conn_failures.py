"""Failure paths of the Mooncake KV layer: every one ends in KVPoll.Failed within its timeout and
with a reason (no hang). Timeouts come from the environment, read when the managers are built."""

import time

import numpy as np
import pytest

from pd_pair import PDPair, wait_poll
from sglang.srt.disaggregation.utils import KVPoll
from sglang.srt.utils import get_free_port

DONE = {KVPoll.Success, KVPoll.Failed}


@pytest.fixture
def short_timeouts(monkeypatch):
    monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "1.0")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "1.0")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "0.2")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "2")


@pytest.fixture
def pair(short_timeouts):
    p = PDPair(page_size=2, num_pages=16)
    yield p
    p.close()


def _reason(obj) -> str:
    with pytest.raises(Exception) as e:
        obj.failure_exception()
    return str(e.value)


def test_dead_bootstrap_port_fails_within_timeout(pair):
    dead = f"127.0.0.1:{get_free_port()}"
    rcv = pair.receiver(1, addr=dead)
    t0 = time.monotonic()
    rcv.init(0)
    assert wait_poll(rcv, DONE, 5) == KVPoll.Failed
    elapsed = time.monotonic() - t0
    assert 0.9 <= elapsed < 3.0, elapsed
    reason = _reason(rcv)
    assert f"could not bootstrap with prefill {dead} within 1.0s" in reason
    assert reason.startswith("KVTransferError(bootstrap_room=1): ")
    assert _reason(rcv) == reason  # stable on repeated calls


def test_prefill_shutdown_mid_request_fails_by_heartbeat(short_timeouts, monkeypatch):
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "30")  # only the heartbeat may end it
    pair = PDPair(page_size=2, num_pages=16)
    try:
        snd, rcv = pair.bootstrapped_pair(2, [3, 4], aux_index=0)
        pair.close_prefill()  # the prefill process "dies": manager and bootstrap server gone
        t0 = time.monotonic()
        assert wait_poll(rcv, DONE, 5) == KVPoll.Failed
        assert time.monotonic() - t0 < 0.2 * 2 + 1.5  # interval x max failures + request timeouts
        assert f"Losing connection with prefill instance (bootstrap_addr: {pair.bootstrap_addr})" in _reason(rcv)
        # a new request to the dead prefill re-resolves and fails by the bootstrap timeout
        rcv2 = pair.receiver(20)
        rcv2.init(0)
        assert wait_poll(rcv2, DONE, 5) == KVPoll.Failed
        assert "could not bootstrap" in _reason(rcv2)
    finally:
        pair.close()


def test_sender_abort_fails_receiver(pair):
    snd, rcv = pair.bootstrapped_pair(3, [5, 6], aux_index=1)
    snd.abort()
    assert snd.poll() == KVPoll.Failed
    assert wait_poll(rcv, DONE, 3) == KVPoll.Failed
    assert "Request 3 was aborted on the prefill instance" in _reason(rcv)
    assert "Aborted by AbortReq." in _reason(snd)


def test_sender_abort_before_decode_metadata(pair):
    """Abort while bootstrapping: decode's later metadata is answered with Failed, not left waiting."""
    snd = pair.sender(4)
    snd.abort()
    rcv = pair.receiver(4)
    rcv.init(0)
    assert wait_poll(rcv, {KVPoll.WaitingForInput, KVPoll.Failed}, 3) == KVPoll.WaitingForInput
    rcv.send_metadata(np.array([1], np.int32), 0)
    assert wait_poll(rcv, DONE, 0.9) == KVPoll.Failed  # well before the 1 s waiting timeout
    assert "aborted on the prefill instance" in _reason(rcv)


def test_receiver_abort_fails_sender(pair):
    snd, rcv = pair.bootstrapped_pair(5, [7], aux_index=2)
    rcv.abort()
    assert rcv.poll() == KVPoll.Failed
    assert wait_poll(snd, DONE, 3) == KVPoll.Failed
    assert "Request 5 was aborted by the decode instance" in _reason(snd)
    assert _reason(rcv) == "KVTransferError(bootstrap_room=5): Aborted by AbortReq."


def test_transfer_to_unregistered_address_fails(short_timeouts, monkeypatch):
    # Mooncake's refusals plus the sender's retries can take longer than 1 s: decode must learn the
    # failure from prefill, so its own waiting timeout may not end the request first (CI race).
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "30")
    pair = PDPair(page_size=2, num_pages=16)
    try:
        snd, rcv = pair.bootstrapped_pair(6, [8, 9], aux_index=3)
        # decode's KV memory is no longer registered with its engine: the write must be refused
        pair.decode.manager.engine.batch_deregister(pair.decode.kv_args.kv_data_ptrs)
        snd.init(2, aux_index=3)
        snd.send(np.array([1, 2], np.int32))
        assert wait_poll(snd, DONE, 10) == KVPoll.Failed
        assert wait_poll(rcv, DONE, 3) == KVPoll.Failed
        reason = _reason(rcv)
        assert "Failed to send KV chunk of request 6" in reason and "batch_transfer_sync_write returned -" in reason
        assert not pair.decode.page(0, 8).any()
    finally:
        pair.close()


def test_waiting_timeout_on_decode(pair):
    snd, rcv = pair.bootstrapped_pair(7, [10], aux_index=4)
    t0 = time.monotonic()  # prefill never sends
    assert wait_poll(rcv, DONE, 5) == KVPoll.Failed
    assert 0.9 <= time.monotonic() - t0 < 3.0
    assert "Request 7 timed out after" in _reason(rcv)


def test_bootstrap_timeout_on_prefill(pair):
    snd = pair.sender(8)  # no decode ever sends metadata for this room
    assert snd.poll() == KVPoll.Bootstrapping
    assert wait_poll(snd, DONE, 5) == KVPoll.Failed
    assert "Request 8 timed out after" in _reason(snd) and "KVPoll.Bootstrapping" in _reason(snd)


def test_bootstrap_server_up_but_prefill_never_registered(short_timeouts):
    """503 'not fully registered' is retried until the bootstrap timeout, then Failed."""
    from sglang.srt.disaggregation.bootstrap_server import KVBootstrapServer

    p = PDPair(page_size=1, num_pages=4)
    empty = KVBootstrapServer("127.0.0.1", get_free_port())
    try:
        rcv = p.receiver(9, addr=f"127.0.0.1:{empty.port}")
        rcv.init(0)
        assert wait_poll(rcv, DONE, 5) == KVPoll.Failed
        assert "Prefill server not fully registered yet (0 workers registered)." in _reason(rcv)
    finally:
        empty.close()
        p.close()


def test_many_requests_to_dead_prefill_all_fail_in_time(pair):
    """Bootstrap retries are per address, so a crowd of requests to a dead prefill cannot push each
    other past the timeout, and a healthy prefill's requests still bootstrap meanwhile."""
    dead = f"127.0.0.1:{get_free_port()}"
    receivers = [pair.receiver(100 + i, addr=dead) for i in range(20)]
    t0 = time.monotonic()
    for r in receivers:
        r.init(0)
    snd, ok = pair.bootstrapped_pair(200, [1], aux_index=0, timeout=1.0)
    assert ok.poll() == KVPoll.Transferring
    for r in receivers:
        assert wait_poll(r, DONE, 5) == KVPoll.Failed
    assert time.monotonic() - t0 < 2.5


def test_decode_gone_before_send_fails_sender(pair):
    """The decode instance disappears after sending its metadata: the write fails, no hang."""
    snd, rcv = pair.bootstrapped_pair(300, [2, 3], aux_index=0)
    pair.decode.manager.close()  # engine destroyed, sockets closed
    snd.init(2, aux_index=0)
    t0 = time.monotonic()
    snd.send(np.array([4, 5], np.int32))
    assert wait_poll(snd, DONE, 20) == KVPoll.Failed
    assert time.monotonic() - t0 < 15
    assert "Failed to send KV chunk of request 300" in _reason(snd)


def _transfer_ok(pair, room, src, dst):
    snd, rcv = pair.bootstrapped_pair(room, dst, aux_index=0)
    snd.init(len(src), aux_index=0)
    snd.send(np.array(src, np.int32))
    assert wait_poll(rcv, DONE, 10) == KVPoll.Success
    for b in range(pair.prefill.num_buffers):
        for s_, d_ in zip(src, dst):
            assert np.array_equal(pair.decode.page(b, d_).float().numpy(), pair.prefill.page(b, s_).float().numpy())


def test_prefill_restart_behind_live_bootstrap_server(short_timeouts, monkeypatch):
    """The prefill rank restarts (new rank port) while its bootstrap server stays up: decode's
    request in flight on the old rank fails promptly, and new requests use the new rank."""
    from pd_pair import Side
    from sglang.srt.disaggregation.utils import DisaggregationMode

    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "30")
    pair = PDPair(page_size=2, num_pages=16)
    try:
        _transfer_ok(pair, 400, [1, 2], [3, 4])
        snd, rcv = pair.bootstrapped_pair(401, [5], aux_index=1)
        old_port = pair.prefill.manager.rank_port
        pair.prefill.manager.close()
        pair.prefill = Side(DisaggregationMode.PREFILL, pair.server_args, 2, 16, seed=1)
        assert pair.prefill.manager.rank_port != old_port
        t0 = time.monotonic()
        assert wait_poll(rcv, DONE, 5) == KVPoll.Failed
        assert time.monotonic() - t0 < 2.0
        assert "restarted (rank endpoint" in _reason(rcv)
        _transfer_ok(pair, 402, [6, 7], [8, 9])  # re-resolved and re-registered with the new rank
    finally:
        pair.close()


def test_prefill_that_lost_our_registration_gets_it_again(pair):
    _transfer_ok(pair, 500, [1], [2])
    pair.prefill.manager.decode_kv_args_table.clear()  # as after a prefill-side state loss
    snd, rcv = pair.bootstrapped_pair(501, [3], aux_index=0)
    snd.init(1, aux_index=0)
    snd.send(np.array([4], np.int32))
    assert wait_poll(rcv, DONE, 10) == KVPoll.Failed
    assert "has not registered its KV buffers" in _reason(rcv)
    _transfer_ok(pair, 502, [5], [6])  # the next request re-sends the registration
