"""--watchdog-timeout: the watchdog thread fires when the scheduler loop's heartbeat stops (one step,
any part of it, runs too long), never while the loop keeps turning. The whole-server case (a
stalled loop, outside any forward, takes the server down) is in test/security/test_liveness.py."""

import logging
import threading
import time

from sglang.srt.managers.watchdog import SchedulerWatchdog
from sglang.srt.utils.heartbeat import Heartbeat


def test_watchdog_fires_only_on_a_stuck_step(caplog):
    heartbeat = Heartbeat()
    fired = threading.Event()
    dog = SchedulerWatchdog(heartbeat, 0.4, on_timeout=fired.set)
    with caplog.at_level(logging.ERROR, logger="sglang.srt.managers.watchdog"):
        heartbeat.tick()
        dog.thread.start()
        for _ in range(7):  # the loop turns every 0.1 s
            time.sleep(0.1)
            heartbeat.tick()
        assert not fired.is_set()
        # a step starts and never ends: no more ticks
        assert fired.wait(5)
    dog.stop()
    assert "Scheduler watchdog timeout (self.watchdog_timeout=0.4, self.soft=False)" in caplog.text


def test_steps_that_end_in_time_do_not_fire():
    heartbeat = Heartbeat()
    fired = threading.Event()
    dog = SchedulerWatchdog(heartbeat, 0.6, on_timeout=fired.set)
    heartbeat.tick()
    dog.thread.start()
    for _ in range(6):  # steps of 0.2 s, one after the other
        heartbeat.tick()
        time.sleep(0.2)
    dog.stop()
    assert not fired.is_set()


def test_heartbeat_in_shared_memory_is_read_from_another_process():
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    heartbeat = Heartbeat(ctx)
    assert heartbeat.age() == float("inf")  # never ticked: as old as can be
    p = ctx.Process(target=_tick_once, args=(heartbeat,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert heartbeat.age() < 30  # the child's tick is visible here


def _tick_once(heartbeat) -> None:
    heartbeat.tick()
