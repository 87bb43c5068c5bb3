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
    level = getattr(server_args, "log_level", "info") or "info"
    fmt = f"[%(asctime)s{(' ' + prefix) if prefix else ''}] %(message)s"
    logging.basicConfig(level=level.upper(), format=fmt, datefmt="%Y-%m-%d %H:%M:%S", force=True)


def configure_subprocess(name: str, server_args, torch_threads: int = 1) -> None:
    """Common set-up of scheduler/detokenizer subprocesses."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and shuts us down
    configure_logging(server_args, name)
    if torch_threads:
        import torch

        torch.set_num_threads(torch_threads)


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
