"""--watchdog-timeout: the watchdog thread fires on a forward that runs too long, never while idle."""

import logging
import threading
import time
import types

from sglang.srt.managers.watchdog import SchedulerWatchdog


def test_watchdog_fires_only_on_a_stuck_forward(caplog):
    scheduler = types.SimpleNamespace(forward_started_at=None)  # what the watchdog reads of the scheduler
    fired = threading.Event()
    dog = SchedulerWatchdog(scheduler, 0.4, on_timeout=fired.set)
    with caplog.at_level(logging.ERROR, logger="sglang.srt.managers.watchdog"):
        dog.thread.start()
        time.sleep(0.7)
        assert not fired.is_set()  # idle: no forward is running
        scheduler.forward_started_at = time.monotonic()  # a forward starts and never ends
        assert fired.wait(5)
    dog.stop()
    assert "Scheduler watchdog timeout (self.watchdog_timeout=0.4, self.soft=False)" in caplog.text


def test_a_forward_that_ends_in_time_does_not_fire():
    scheduler = types.SimpleNamespace(forward_started_at=None)
    fired = threading.Event()
    dog = SchedulerWatchdog(scheduler, 0.6, on_timeout=fired.set)
    dog.thread.start()
    for _ in range(6):  # forwards of 0.2 s, one after the other
        scheduler.forward_started_at = time.monotonic()
        time.sleep(0.2)
        scheduler.forward_started_at = None
    dog.stop()
    assert not fired.is_set()
