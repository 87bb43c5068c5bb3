"""This process's place in the tensor-parallel group, and the collectives the layers call.

One process per TP rank. `init_tp_group` joins the group over torch.distributed: gloo when the
device is CPU, NCCL on CUDA, through the same calls. Before it runs (or with tp_size 1) the
process is rank 0 of a group of one and every collective is the identity, so single-process
code pays nothing.

Bounded waits: joining waits at most `init_timeout_s` for the other ranks (a rank that cannot
reach --dist-init-addr fails with the address in the message); every collective afterwards
waits at most `collective_timeout_s` for a peer (SGLANG_TP_COLLECTIVE_TIMEOUT, default 20 s),
so a rank that dies or hangs makes the others raise instead of waiting forever. Rank 0 keeps
idle followers busy enough for that (a keep-alive plan each second, managers/tp_group.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from typing import Optional

import torch

logger = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT_ENV = "SGLANG_TP_COLLECTIVE_TIMEOUT"
DEFAULT_COLLECTIVE_TIMEOUT_S = 20.0
DEFAULT_INIT_TIMEOUT_S = 300.0


@dataclasses.dataclass
class TpGroup:
    rank: int = 0
    size: int = 1
    backend: str = ""  # "gloo" / "nccl"; "" for a group of one
    device: str = "cpu"


_GROUP = TpGroup()


class TpPeerError(RuntimeError):
    """A collective failed: a peer rank died, hung past the timeout, or went away. Fatal."""


def tp_group() -> TpGroup:
    return _GROUP


def get_tp_rank() -> int:
    return _GROUP.rank


def get_tp_size() -> int:
    return _GROUP.size


def collective_timeout_s() -> float:
    return float(os.environ.get(COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S))


def init_tp_group(rank: int, size: int, init_addr: str, device: str = "cpu",
                  init_timeout_s: Optional[float] = None) -> TpGroup:
    """Joins the TP group as `rank` of `size` through the TCP store at `init_addr` ("host:port";
    rank 0 serves it). Raises RuntimeError naming the address when the group is not complete
    within `init_timeout_s` (--dist-timeout, else 300 s)."""
    global _GROUP
    if size <= 1:
        _GROUP = TpGroup(0, 1, "", device)
        return _GROUP
    import torch.distributed as dist

    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank % max(torch.cuda.device_count(), 1))
    init_s = float(init_timeout_s or DEFAULT_INIT_TIMEOUT_S)
    host, _, port = init_addr.rpartition(":")
    if host.strip("[]") in ("127.0.0.1", "localhost", "::1"):
        # One host: gloo's connections stay on loopback (else it picks the hostname's interface).
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # The TCP store waits `init_s` for its peers; collectives afterwards wait collective_timeout_s.
    try:
        store = dist.TCPStore(host.strip("[]"), int(port), world_size=size, is_master=(rank == 0),
                              timeout=datetime.timedelta(seconds=init_s), wait_for_workers=False)
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=collective_timeout_s()))
        # Everyone there: the first collective, under the start-up bound (ranks load at different speeds).
        if backend == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=init_s), wait_all_ranks=True)
        else:
            dist.barrier()
    except Exception as e:  # noqa: BLE001 - one line that names the address, whatever torch raised
        raise RuntimeError(f"TP rank {rank} of {size} could not join the group at --dist-init-addr {init_addr} "
                           f"within {init_s:.0f} s: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    _GROUP = TpGroup(rank, size, backend, device)
    logger.info(f"TP rank {rank} of {size} (pid {os.getpid()}) joined the group at {init_addr} ({backend}; collectives time out "
                f"after {collective_timeout_s():.0f} s)")
    return _GROUP


def destroy_tp_group() -> None:
    global _GROUP
    if _GROUP.size > 1:
        import torch.distributed as dist

        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - leaving anyway
            pass
    _GROUP = TpGroup()


def _checked(what: str, fn):
    try:
        return fn()
    except TpPeerError:
        raise
    except Exception as e:  # noqa: BLE001 - gloo/NCCL raise RuntimeError subclasses of many kinds
        raise TpPeerError(f"TP rank {_GROUP.rank}: {what} failed (a peer rank died, hung or went away): "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum over the ranks, in place (upstream's name); the identity for a group of one."""
    if _GROUP.size == 1:
        return x
    import torch.distributed as dist

    x = x.contiguous()
    _checked("all_reduce", lambda: dist.all_reduce(x))
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Every rank's `x` concatenated along `dim`, in rank order, on every rank."""
    if _GROUP.size == 1:
        return x
    import torch.distributed as dist

    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(_GROUP.size)]
    _checked("all_gather", lambda: dist.all_gather(parts, x))
    return torch.cat(parts, dim=dim)


def all_reduce_min(value: int) -> int:
    """The smallest of every rank's `value` (ranks agree on pool sizes)."""
    if _GROUP.size == 1:
        return int(value)
    import torch.distributed as dist

    t = torch.tensor([int(value)], dtype=torch.int64, device=_comm_device())
    _checked("all_reduce(min)", lambda: dist.all_reduce(t, op=dist.ReduceOp.MIN))
    return int(t.item())


def broadcast_bytes_from_rank0(payload: Optional[bytes], header: int = 0) -> tuple:
    """Rank 0 sends (`header`, `payload`); every rank returns them. `header` is a small control
    code (the caller's); the payload goes as a uint8 tensor (bytes the caller encoded: never a
    pickled object). The length and header travel by an all-reduce (the others add zeros), which
    completes only once every rank is there: rank 0 learns of a rank that hangs even when it sends
    only keep-alives; then the bytes, when there are any, by a broadcast."""
    if _GROUP.size == 1:
        return header, payload
    import torch.distributed as dist

    dev = _comm_device()
    mine = [len(payload) if payload else 0, header] if _GROUP.rank == 0 else [0, 0]
    meta = torch.tensor(mine, dtype=torch.int64, device=dev)
    _checked("exchange of the batch plan", lambda: dist.all_reduce(meta))
    n, header = int(meta[0].item()), int(meta[1].item())
    if n == 0:
        return header, b""
    if _GROUP.rank == 0:
        buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(dev)
    else:
        buf = torch.empty(n, dtype=torch.uint8, device=dev)
    _checked("broadcast of the batch plan", lambda: dist.broadcast(buf, src=0))
    return header, bytes(buf.cpu().numpy().tobytes()) if _GROUP.rank != 0 else payload


def _comm_device() -> str:
    return "cuda" if _GROUP.backend == "nccl" else "cpu"
