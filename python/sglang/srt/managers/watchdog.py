"""(Scheduler process.) `--watchdog-timeout`: a scheduler step that runs longer than this takes the
server down instead of hanging it.

Upstream's watchdog fires when the scheduler's forward count has not moved for the timeout while
a batch is running; here it watches the scheduler loop's heartbeat (`utils/heartbeat.py`), which
the loop ticks at the start of every turn, so the whole step counts: taking in requests,
scheduling, the forward, output processing, grammar work, stop checks. An idle loop turns at
least once a second (its poll has a timeout), so an idle server never trips it.

A daemon thread looks at the heartbeat every `min(timeout / 2, 5)` seconds. When it is older
than the timeout it logs upstream's line "Scheduler watchdog timeout (self.watchdog_timeout=...,
self.soft=False)", dumps every thread's stack, and ends the process the way a fatal scheduler
error does (SIGQUIT to the parent, exit code 1), so that a supervisor restarts a server that no
longer makes progress.
"""

from __future__ import annotations

import faulthandler
import logging
import sys
import threading

logger = logging.getLogger(__name__)


class SchedulerWatchdog:
    def __init__(self, heartbeat, watchdog_timeout: float, on_timeout=None, notify_parent: bool = True):
        """`heartbeat`: anything with `age()` (seconds since the loop's last turn started)."""
        self.notify_parent = notify_parent
        self.heartbeat = heartbeat
        self.watchdog_timeout = watchdog_timeout
        self.soft = False
        self.on_timeout = on_timeout
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sglang-scheduler-watchdog", daemon=True)

    @classmethod
    def start_for(cls, heartbeat, server_args, notify_parent: bool = True):
        timeout = server_args.watchdog_timeout
        if timeout is None or timeout <= 0:
            return None
        dog = cls(heartbeat, float(timeout), notify_parent=notify_parent)
        dog.thread.start()
        return dog

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        period = min(self.watchdog_timeout / 2, 5.0)
        while not self._stop.wait(period):
            if self.heartbeat.age() > self.watchdog_timeout:
                self._fire()
                return

    def _fire(self) -> None:
        logger.error(f"Scheduler watchdog timeout ({self.watchdog_timeout=}, {self.soft=})")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        if self.on_timeout is not None:
            self.on_timeout()
            return
        from sglang.srt.utils.process import notify_parent_and_exit

        notify_parent_and_exit(1, self.notify_parent)
