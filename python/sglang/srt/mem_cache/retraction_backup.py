"""Where a PD decode server keeps the KV of a retracted request until it resumes (reference 4.4).

`cpu_tensor`: a private CPU copy per request (unbounded).
`host_pool`: slots of a reserved `HostKVPool`; when it is full (after reclaim) the request is
             aborted with 500 "Retraction host KV pool exhausted. Aborting the request." With
             --enable-mamba-host-pool-backup a hybrid SSM request's Mamba state goes to a
             `HostMambaPool` slot beside its pages; either tier running out aborts the same way.
`none`:      no backup; the request is aborted with 503 so the client can retry.

A backup holds the KV of the request's first `kv_len` tokens (everything but the last sampled
token). Restoring writes it into freshly allocated slots, so decoding continues without any
prefill.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

import torch

from sglang.srt.configs.runtime_config import RetractionConfig
from sglang.srt.core.finish_reason import FINISH_ABORT

logger = logging.getLogger(__name__)

HOST_POOL_EXHAUSTED = "Retraction host KV pool exhausted. Aborting the request."
NO_BACKUP = "Retracted under decode memory pressure without a KV backup. Retry later."


@dataclass
class RetractionBackup:
    kv_len: int
    cpu_tensors: Any = None
    host_indices: Optional[torch.Tensor] = None
    mamba_cpu: Any = None
    mamba_host_slot: Optional[int] = None


class RetractionBackupStore:
    def __init__(self, backend: str, device_pool, allocator, host_pool=None, mamba_pool=None, host_mamba_pool=None):
        if backend not in ("cpu_tensor", "host_pool", "none"):
            raise ValueError(f"Unknown retraction backup backend: {backend}")
        self.backend = backend
        self.device_pool = device_pool
        self.allocator = allocator
        self.host_pool = host_pool
        self.mamba_pool = mamba_pool
        self.host_mamba_pool = host_mamba_pool
        self.num_live = 0

    def abort_reason(self) -> FINISH_ABORT:
        if self.backend == "host_pool":
            return FINISH_ABORT(HOST_POOL_EXHAUSTED, status_code=500)
        return FINISH_ABORT(NO_BACKUP, status_code=503)

    def backup(self, device_indices: torch.Tensor, mamba_slot: Optional[int] = None) -> Optional[RetractionBackup]:
        """Copies the KV at `device_indices` out of the device pool. None: no backup could be kept."""
        n = int(device_indices.numel())
        if self.backend == "none":
            return None
        has_state = self.mamba_pool is not None and mamba_slot is not None
        if self.backend == "cpu_tensor":
            self.num_live += 1
            mamba = self.mamba_pool.get_cpu_copy(mamba_slot) if has_state else None
            return RetractionBackup(kv_len=n, cpu_tensors=self.device_pool.get_cpu_copy(device_indices), mamba_cpu=mamba)
        state_slot = None
        if has_state:
            if self.host_mamba_pool is None:
                raise AssertionError("host_pool retraction of a Mamba model without a host Mamba pool")
            state_slot = self.host_mamba_pool.alloc()
            if state_slot is None:
                return None
        host_indices = self.host_pool.alloc(n) if n > 0 else torch.empty(0, dtype=torch.int64)
        if host_indices is None:
            if state_slot is not None:
                self.host_mamba_pool.free(state_slot)
            return None
        try:
            self.host_pool.backup_from_device(device_indices, host_indices)
            if state_slot is not None:
                self.host_mamba_pool.backup_from_device(mamba_slot, state_slot)
        except Exception:
            self.host_pool.free(host_indices)
            if state_slot is not None:
                self.host_mamba_pool.free(state_slot)
            raise
        self.num_live += 1
        return RetractionBackup(kv_len=n, host_indices=host_indices, mamba_host_slot=state_slot)

    def restore(self, backup: RetractionBackup, device_indices: torch.Tensor, mamba_slot: Optional[int] = None) -> None:
        if backup.kv_len != int(device_indices.numel()):
            raise AssertionError(f"Host backup has {backup.kv_len} slots, but restore has {device_indices.numel()}")
        if backup.cpu_tensors is not None:
            self.device_pool.load_cpu_copy(backup.cpu_tensors, device_indices)
        elif backup.host_indices is not None:
            self.host_pool.load_to_device(backup.host_indices, device_indices)
        if backup.mamba_cpu is not None and mamba_slot is not None:
            self.mamba_pool.load_cpu_copy(backup.mamba_cpu, mamba_slot)
        if backup.mamba_host_slot is not None and mamba_slot is not None:
            self.host_mamba_pool.load_to_device(backup.mamba_host_slot, mamba_slot)
        self.discard(backup)

    def discard(self, backup: Optional[RetractionBackup]) -> None:
        """Frees a backup (after restore, or when its request is aborted while retracted)."""
        if backup is None:
            return
        if backup.host_indices is not None:
            self.host_pool.free(backup.host_indices)
            backup.host_indices = None
        if backup.mamba_host_slot is not None:
            self.host_mamba_pool.free(backup.mamba_host_slot)
            backup.mamba_host_slot = None
        backup.cpu_tensors = None
        backup.mamba_cpu = None
        self.num_live -= 1

    def stats(self) -> dict:
        out = {"backend": self.backend, "live_backups": self.num_live}
        if self.host_pool is not None:
            out["host_pool_size"] = self.host_pool.size
            out["host_pool_available"] = self.host_pool.available_size()
        if self.host_mamba_pool is not None:
            out["mamba_host_slots_total"] = self.host_mamba_pool.size
            out["mamba_host_slots_free"] = self.host_mamba_pool.available_size()
        return out


def build_retraction_store(config: RetractionConfig, device_pool, allocator, mamba_pool=None) -> RetractionBackupStore:
    """A PD decode server's store for `config`, a backend already resolved and checked by the
    scheduler (`managers/scheduler_memory.resolve_decode_retraction`): with `host_pool`, the host KV
    pool (and, for a hybrid SSM model, the host Mamba-state pool) sized from the device pools."""
    from sglang.srt.mem_cache.host_pool import HostKVPool, host_pool_num_tokens

    host_pool = host_mamba_pool = None
    if config.backend == "host_pool":
        tokens = host_pool_num_tokens(device_pool.size, device_pool.page_size, device_pool.bytes_per_token(),
                                      config.hicache_ratio, config.hicache_size)
        host_pool = HostKVPool(device_pool, tokens, device_pool.page_size)
        if mamba_pool is not None:
            from sglang.srt.mem_cache.host_mamba_pool import HostMambaPool, host_mamba_slots

            slots = host_mamba_slots(config.mamba_host_pool_slots, mamba_pool.size, host_pool.size,
                                     device_pool.page_size)
            host_mamba_pool = HostMambaPool(mamba_pool, slots)
    logger.info("Decode retraction backup: %s (%s)%s%s", config.backend, config.reason,
                f", host pool {host_pool.size} tokens" if host_pool else "",
                f", host Mamba pool {host_mamba_pool.size} slots ({host_mamba_pool.nbytes() / 2**20:.1f} MiB)"
                if host_mamba_pool else "")
    return RetractionBackupStore(config.backend, device_pool, allocator, host_pool=host_pool, mamba_pool=mamba_pool,
                                 host_mamba_pool=host_mamba_pool)
