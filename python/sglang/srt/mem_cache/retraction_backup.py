"""Where a PD decode server keeps the KV of a retracted request until it resumes (reference 4.4).

`cpu_tensor`: a private CPU copy per request (unbounded).
`host_pool`: slots of a reserved `HostKVPool`; when it is full (after reclaim) the request is
             aborted with 500 "Retraction host KV pool exhausted. Aborting the request."
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


class RetractionBackupStore:
    def __init__(self, backend: str, device_pool, allocator, host_pool=None, mamba_pool=None):
        if backend not in ("cpu_tensor", "host_pool", "none"):
            raise ValueError(f"Unknown retraction backup backend: {backend}")
        self.backend = backend
        self.device_pool = device_pool
        self.allocator = allocator
        self.host_pool = host_pool
        self.mamba_pool = mamba_pool
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
        mamba = self.mamba_pool.get_cpu_copy(mamba_slot) if (self.mamba_pool is not None and mamba_slot is not None) else None
        if self.backend == "cpu_tensor":
            self.num_live += 1
            return RetractionBackup(kv_len=n, cpu_tensors=self.device_pool.get_cpu_copy(device_indices), mamba_cpu=mamba)
        host_indices = self.host_pool.alloc(n) if n > 0 else torch.empty(0, dtype=torch.int64)
        if host_indices is None:
            return None
        try:
            self.host_pool.backup_from_device(device_indices, host_indices)
        except Exception:
            self.host_pool.free(host_indices)
            raise
        self.num_live += 1
        return RetractionBackup(kv_len=n, host_indices=host_indices, mamba_cpu=mamba)

    def restore(self, backup: RetractionBackup, device_indices: torch.Tensor, mamba_slot: Optional[int] = None) -> None:
        if backup.kv_len != int(device_indices.numel()):
            raise AssertionError(f"Host backup has {backup.kv_len} slots, but restore has {device_indices.numel()}")
        if backup.cpu_tensors is not None:
            self.device_pool.load_cpu_copy(backup.cpu_tensors, device_indices)
        elif backup.host_indices is not None:
            self.host_pool.load_to_device(backup.host_indices, device_indices)
        if backup.mamba_cpu is not None and mamba_slot is not None:
            self.mamba_pool.load_cpu_copy(backup.mamba_cpu, mamba_slot)
        self.discard(backup)

    def discard(self, backup: Optional[RetractionBackup]) -> None:
        """Frees a backup (after restore, or when its request is aborted while retracted)."""
        if backup is None:
            return
        if backup.host_indices is not None:
            self.host_pool.free(backup.host_indices)
            backup.host_indices = None
        backup.cpu_tensors = None
        backup.mamba_cpu = None
        self.num_live -= 1

    def stats(self) -> dict:
        out = {"backend": self.backend, "live_backups": self.num_live}
        if self.host_pool is not None:
            out["host_pool_size"] = self.host_pool.size
            out["host_pool_available"] = self.host_pool.available_size()
        return out


def build_retraction_store(server_args, model_config, device_pool, allocator, req_to_token_pool, mamba_pool=None):
    """Resolves --disaggregation-decode-retraction-backup for a decode server and builds its store.

    Returns None for non-decode servers (they recompute retracted requests)."""
    from sglang.srt.mem_cache.host_pool import HostKVPool, decode_retraction_hicache_ratio, host_pool_num_tokens
    from sglang.srt.mem_cache.registry import validate_host_pool_retraction
    from sglang.srt.server_args_resolution import infer_decode_retraction_backup

    if server_args.disaggregation_mode != "decode":
        return None
    backend, reason = infer_decode_retraction_backup(
        server_args, is_hybrid_ssm=model_config.is_hybrid_ssm, is_pure_swa=model_config.is_pure_swa
    )
    if server_args.disaggregation_decode_retraction_backup is None:
        server_args.override("kv_cache_builder.decode_retraction", disaggregation_decode_retraction_backup=backend)
    validate_host_pool_retraction(backend, model_config.is_hybrid_ssm, model_config.is_pure_swa)
    host_pool = None
    if backend == "host_pool":
        ratio = server_args.hicache_ratio
        explicit = server_args.raw_input().get("hicache_ratio") is not None
        if not explicit and not server_args.hicache_size:
            ratio = decode_retraction_hicache_ratio(
                req_to_token_pool.max_context_len, device_pool.size, device_pool.page_size,
                server_args.disaggregation_decode_host_receive_threshold,
            )
            server_args.override("kv_cache_builder.decode_retraction", hicache_ratio=ratio)
        tokens = host_pool_num_tokens(device_pool.size, device_pool.page_size, device_pool.bytes_per_token(),
                                      ratio, server_args.hicache_size)
        host_pool = HostKVPool(device_pool, tokens, device_pool.page_size)
    logger.info("Decode retraction backup: %s (%s)%s", backend, reason,
                f", host pool {host_pool.size} tokens" if host_pool else "")
    return RetractionBackupStore(backend, device_pool, allocator, host_pool=host_pool, mamba_pool=mamba_pool)
