"""fake.py state machine (reference 5.9), including the waiting-timeout warning."""

import logging
import time

import numpy as np
import pytest

from sglang.srt.disaggregation import fake
from sglang.srt.disaggregation.base import KVArgs
from sglang.srt.disaggregation.fake import FakeKVManager, FakeKVReceiver, FakeKVSender
from sglang.srt.disaggregation.utils import DisaggregationMode, KVPoll


def _mgr(mode=DisaggregationMode.PREFILL):
    m = FakeKVManager(KVArgs(), mode, None)
    m.register_to_bootstrap()  # no-op
    return m


def test_fake_sender_success_path():
    s = FakeKVSender(_mgr(), "2.2.2.2:8998", 7)
    assert s.poll() == KVPoll.WaitingForInput
    s.init(3, aux_index=1)
    assert s.poll() == KVPoll.WaitingForInput
    assert s.should_send_kv_chunk(0, False) is False
    assert s.should_send_kv_chunk(0, True) is True and s.should_send_kv_chunk(2, False) is True
    s.send(np.array([1, 2, 3], dtype=np.int32))
    assert s.poll() == KVPoll.Success
    assert s.poll() == KVPoll.Success  # concluded state is cached
    s.abort()  # after conclusion abort only changes the state
    assert s.poll() == KVPoll.Failed
    with pytest.raises(Exception) as e:
        s.failure_exception()
    assert str(e.value) == "Fake KVSender Exception"


def test_fake_sender_waiting_timeout(monkeypatch, caplog):
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "0.2")
    monkeypatch.setattr(fake, "_warned_waiting_timeout", False)
    s = FakeKVSender(_mgr(), "2.2.2.2:8998", 8)
    s.init(1)
    with caplog.at_level(logging.WARNING, logger="sglang.srt.disaggregation.fake"):
        assert s.poll() == KVPoll.WaitingForInput  # the clock starts at the first poll after init
        time.sleep(0.3)
        assert s.poll() == KVPoll.Failed
    assert fake._WAITING_TIMEOUT_WARNING in caplog.text
    assert "export SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600" in caplog.text
    s.send(np.array([1], dtype=np.int32))
    assert s.poll() == KVPoll.Failed  # no resurrection


def test_fake_sender_no_timeout_before_init(monkeypatch):
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "0.05")
    s = FakeKVSender(_mgr(), "2.2.2.2:8998", 9)
    s.poll()
    time.sleep(0.1)
    assert s.poll() == KVPoll.WaitingForInput


def test_fake_sender_abort():
    s = FakeKVSender(_mgr(), "2.2.2.2:8998", 10)
    s.init(1)
    s.abort()
    assert s.poll() == KVPoll.Failed


def test_fake_receiver_state_machine():
    r = FakeKVReceiver(_mgr(DisaggregationMode.DECODE), "2.2.2.2:8998", 11)
    assert r.poll() == KVPoll.Bootstrapping
    r.init(0)
    assert r.poll() == KVPoll.WaitingForInput
    r.send_metadata(np.array([4, 5], dtype=np.int32), aux_index=0)
    assert r.poll() == KVPoll.Success
    with pytest.raises(Exception) as e:
        r.failure_exception()
    assert str(e.value) == "Fake KVReceiver Exception"
    r2 = FakeKVReceiver(_mgr(DisaggregationMode.DECODE), "2.2.2.2:8998", 12)
    r2.init(0)
    r2.abort()
    assert r2.poll() == KVPoll.Failed
