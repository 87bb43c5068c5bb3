"""(Scheduler process.) `--watchdog-timeout`: a forward that runs longer than this takes the server
down instead of hanging it.

A daemon thread looks at `Scheduler.forward_started_at` (set around every model forward) every
`min(timeout / 2, 5)` seconds. When one forward has run for more than the timeout it logs
upstream's line "Scheduler watchdog timeout (self.watchdog_timeout=..., self.soft=False)", dumps
every thread's stack, and ends the process the way a fatal scheduler error does (SIGQUIT to the
parent, exit code 1), so that a supervisor restarts a server that no longer makes progress.
"""

from __future__ import annotations

import faulthandler
import logging
import sys
import threading
import time

logger = logging.getLogger(__name__)


class SchedulerWatchdog:
    def __init__(self, scheduler, watchdog_timeout: float, on_timeout=None, notify_parent: bool = True):
        self.notify_parent = notify_parent
        self.scheduler = scheduler
        self.watchdog_timeout = watchdog_timeout
        self.soft = False
        self.on_timeout = on_timeout
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sglang-scheduler-watchdog", daemon=True)

    @classmethod
    def start_for(cls, scheduler, server_args, notify_parent: bool = True):
        timeout = server_args.watchdog_timeout
        if timeout is None or timeout <= 0:
            return None
        dog = cls(scheduler, float(timeout), notify_parent=notify_parent)
        dog.thread.start()
        return dog

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        period = min(self.watchdog_timeout / 2, 5.0)
        while not self._stop.wait(period):
            started = self.scheduler.forward_started_at
            if started is not None and time.monotonic() - started > self.watchdog_timeout:
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
