"""Process plumbing: subprocess set-up, dying with the parent, killing a process tree."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time


def die_with_parent() -> None:
    """Linux: get SIGKILL when the parent exits, so no worker outlives the server."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        ppid = os.getppid()

        def watch():
            while True:
                if os.getppid() != ppid:
                    os._exit(1)
                time.sleep(1)

        threading.Thread(target=watch, daemon=True).start()


def configure_logging(server_args, prefix: str = "") -> None:
    level = server_args.log_level or "info"
    fmt = f"[%(asctime)s{(' ' + prefix) if prefix else ''}] %(message)s"
    logging.basicConfig(level=level.upper(), format=fmt, datefmt="%Y-%m-%d %H:%M:%S", force=True)


def configure_subprocess(name: str, server_args, torch_threads: int = 1) -> None:
    """Common set-up of scheduler/detokenizer subprocesses.

    SIGTERM (the parent's shutdown) becomes a normal exit (`SystemExit(0)`), so the process's
    exit handlers run: multiprocessing unlinks the semaphores it created (tqdm makes one), and
    nothing is left for the resource tracker to report as leaked."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and shuts us down
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    configure_logging(server_args, name)
    if torch_threads:
        import torch

        torch.set_num_threads(torch_threads)


def _exit_on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once is enough
    raise SystemExit(0)


def stop_resource_tracker(timeout: float = 5.0) -> None:
    """multiprocessing's resource tracker is a child of this process too. A server stops it at
    exit (it unlinks whatever is still registered) and waits for it, bounded, so that no child
    outlives the server. Only for a process that owns all its children (not an Engine host,
    whose application may use multiprocessing itself)."""
    import psutil

    try:
        from multiprocessing import resource_tracker

        tracker = resource_tracker._resource_tracker
        pid, fd = getattr(tracker, "_pid", None), getattr(tracker, "_fd", None)
        if pid is None or fd is None:
            return
        tracker._pid = tracker._fd = None
        os.close(fd)  # the tracker exits on EOF once every child (holding a copy) is gone
        proc = psutil.Process(pid)
        try:
            proc.wait(timeout=timeout)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    except Exception:  # noqa: BLE001 - best effort at exit
        pass


def kill_process_tree(pid: int, include_parent: bool = True, timeout: float = 5.0) -> None:
    """Terminates pid's children (then pid): SIGTERM, and SIGKILL for what is left after `timeout`."""
    import psutil

    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = parent.children(recursive=True)
    if include_parent:
        procs.append(parent)
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def exit_after_cleanup(code: int = 0) -> None:
    """Leaves the process now: its exit handlers run (multiprocessing's finalizers unlink what it
    created, the resource tracker is told), logs and stdio are flushed, but the interpreter's
    module teardown is skipped: with torch loaded that takes ~1.5 s, most of a server's shutdown."""
    import atexit
    import sys

    try:
        atexit._run_exitfuncs()
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def notify_parent_and_exit(code: int, notify_parent: bool = True) -> None:
    """A child's fatal error, upstream's way: SIGQUIT to the parent, which takes the server down.
    (Without `notify_parent`, e.g. under an Engine, the parent notices the exit by itself.)"""
    import sys

    if notify_parent:
        try:
            os.kill(os.getppid(), signal.SIGQUIT)
        except OSError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
