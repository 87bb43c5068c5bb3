"""Typed slices of `ServerArgs`: each component reads a small frozen dataclass of the settings it
uses, built once from the resolved `ServerArgs` (`Slice.from_server_args(sa)`), instead of
reaching into the whole record with `getattr(server_args, name, default)`.

Field names and defaults are the `ServerArgs` ones, so a slice built with keywords only (tests,
the offline tools) behaves like one built from a default `ServerArgs`. Which component reads
which slice:

  RunnerConfig   -> model_executor/model_runner.py, layers/attention backends
  MemoryConfig   -> mem_cache/memory_manager.py (pool sizes, hybrid pools, Mamba state pool)
  CacheConfig    -> mem_cache/registry.py (which prefix cache, and its checks)
  DisaggConfig   -> disaggregation/ (transfer backends, bootstrap, PD queues)
  RetractionConfig -> mem_cache/retraction_backup.py (a PD decode server's backup store); not a
                   plain slice: the scheduler plans it (`managers/scheduler_memory.retraction_plan`)
                   and `mem_cache.memory_manager.build_memory` resolves it once the pools exist

The scheduler reads `ServerArgs` itself (it is the one component that sees every concern).
Importing this is cheap (no torch).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Type, TypeVar

T = TypeVar("T")


def _from(cls: Type[T], server_args: Any, **extra: Any) -> T:
    """The slice `cls` of `server_args` (every field read by name: the record has them all)."""
    values = {f.name: getattr(server_args, f.name) for f in dataclasses.fields(cls) if f.name not in extra}
    return cls(**values, **extra)


@dataclasses.dataclass(frozen=True)
class RunnerConfig:
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    device: Optional[str] = None
    attention_backend: Optional[str] = None
    triton_attention_num_kv_splits: int = 8
    context_length: Optional[int] = None
    quantization: Optional[str] = None
    enable_fp32_lm_head: bool = False

    @classmethod
    def from_server_args(cls, server_args: Any) -> "RunnerConfig":
        return _from(cls, server_args)


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    page_size: Optional[int] = None
    max_total_tokens: Optional[int] = None
    mem_fraction_static: Optional[float] = None
    max_running_requests: Optional[int] = None
    disable_hybrid_swa_memory: bool = False
    swa_full_tokens_ratio: Optional[float] = None
    disaggregation_mode: str = "null"
    max_mamba_cache_size: Optional[int] = None
    mamba_full_memory_ratio: Optional[float] = None
    mamba_ssm_dtype: Optional[str] = None
    dp_size: int = 1  # replicas on this host (--dp-size): each sizes its pools from its share of the memory

    @classmethod
    def from_server_args(cls, server_args: Any) -> "MemoryConfig":
        return _from(cls, server_args)


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    disable_radix_cache: bool = False
    radix_cache_backend: Optional[str] = None
    radix_eviction_policy: str = "lru"
    enable_hierarchical_cache: bool = False
    hicache_host_memory_mode: str = "cache"
    enable_session_radix_cache: bool = False
    enable_streaming_session: bool = False
    enable_lmcache: bool = False
    enable_unified_cache_external_linker: bool = False
    enable_mamba_host_pool_backup: bool = False  # host-pool retraction allowed for hybrid SSM models
    disaggregation_decode_retraction_backup: Optional[str] = None  # as given (a decode server resolves it)
    # Upstream-only switches that select a cache this build does not have (see server_args/compat).
    enable_flexkv: bool = False

    @classmethod
    def from_server_args(cls, server_args: Any) -> "CacheConfig":
        upstream: Dict[str, Any] = server_args.ignored_upstream_args
        return _from(cls, server_args, enable_flexkv=bool(upstream.get("enable_flexkv")))


@dataclasses.dataclass(frozen=True)
class DisaggConfig:
    disaggregation_mode: str = "null"
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_bootstrap_port: int = 8998
    disaggregation_ib_device: Optional[str] = None
    disaggregation_decode_allocation_policy: str = "early"
    num_reserved_decode_tokens: int = 512
    optimistic_prefill_attempts: int = 0
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    nnodes: int = 1
    dist_init_addr: Optional[str] = None
    load_balance_method: str = "auto"
    dp_rank: int = 0  # which data-parallel replica this scheduler is (not a ServerArgs field)

    @classmethod
    def from_server_args(cls, server_args: Any, dp_rank: int = 0) -> "DisaggConfig":
        return _from(cls, server_args, dp_rank=dp_rank)

    @classmethod
    def of(cls, config_or_server_args: Any) -> "DisaggConfig":
        """Transfer backends take upstream's `server_args` argument: a record or a slice."""
        if isinstance(config_or_server_args, cls):
            return config_or_server_args
        if config_or_server_args is None:
            return cls()
        return cls.from_server_args(config_or_server_args)


@dataclasses.dataclass(frozen=True)
class RetractionConfig:
    """Where a PD decode server backs up retracted requests' KV, as resolved: the default backend
    depends on the model and the host-pool ratio on the built pools' sizes, so `build_memory`
    resolves this after the pools (and the scheduler then records the values in `ServerArgs` for
    /server_info); the store's builder needs nothing else from the server's settings."""

    backend: str = "none"  # cpu_tensor | host_pool | none
    reason: str = ""  # why this backend (for the start-up log line)
    hicache_ratio: Optional[float] = None  # host pool size / device pool size (host_pool)
    hicache_size: int = 0  # GB; overrides hicache_ratio when > 0
    mamba_host_pool_slots: Optional[int] = None  # host Mamba-state slots (None: derived)


SLICES = (RunnerConfig, MemoryConfig, CacheConfig, DisaggConfig)
