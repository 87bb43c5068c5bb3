"""The scheduler's memory: what it asks of `mem_cache.memory_manager.build_memory`, the one call
that builds the pools, the radix tree and (PD decode servers) the retraction store, from typed
config. The retraction backup is planned here from the settings and the model (the backend and
why); the build resolves what depends on the pools (the default host-pool size) before the tree
is built, so the tree's builder (the registry, and a registered backend) sees the backup in use.
Afterwards the resolved values are recorded in `ServerArgs` (source
"kv_cache_builder.decode_retraction", as upstream) so /server_info shows what the server runs with."""

from __future__ import annotations

from typing import Optional

from sglang.srt.configs.runtime_config import CacheConfig, MemoryConfig
from sglang.srt.mem_cache.memory_manager import MemoryManager, RetractionPlan, build_memory
from sglang.srt.server_args.resolution import infer_decode_retraction_backup


def build_scheduler_memory(sa, worker) -> MemoryManager:
    """All of this scheduler's memory, for the model its worker loaded."""
    spec = worker.memory_spec()
    plan = retraction_plan(sa, spec.model_config)
    memory = build_memory(spec, MemoryConfig.from_server_args(sa), CacheConfig.from_server_args(sa), plan,
                          plugin_server_args=sa)
    if plan is not None:
        record_retraction(sa, plan, memory.retraction_config)
    return memory


def retraction_plan(sa, model_config) -> Optional[RetractionPlan]:
    """A PD decode server's retraction backup (None on other servers: they recompute retracted
    requests). The default backend comes from the model (`infer_decode_retraction_backup`); the
    host pool is sized from the device pool unless --hicache-ratio or --hicache-size is given."""
    if sa.disaggregation_mode != "decode":
        return None
    backend, reason = infer_decode_retraction_backup(
        sa, is_hybrid_ssm=model_config.is_hybrid_ssm, is_pure_swa=model_config.is_pure_swa
    )
    return RetractionPlan(
        backend=backend, reason=reason, hicache_ratio=sa.hicache_ratio,
        derive_hicache_ratio=sa.raw_input().get("hicache_ratio") is None and not sa.hicache_size,
        hicache_size=sa.hicache_size, mamba_host_pool_slots=sa.mamba_host_pool_slots,
        host_receive_threshold=sa.disaggregation_decode_host_receive_threshold,
        enable_mamba_host_pool_backup=sa.enable_mamba_host_pool_backup,
    )


def record_retraction(sa, plan: RetractionPlan, resolved) -> None:
    """What the build decided, in `ServerArgs` for /server_info (the automatic backend, the
    derived host-pool ratio)."""
    if sa.disaggregation_decode_retraction_backup is None:
        sa.override("kv_cache_builder.decode_retraction", disaggregation_decode_retraction_backup=resolved.backend)
    if resolved.backend == "host_pool" and plan.derive_hicache_ratio:
        sa.override("kv_cache_builder.decode_retraction", hicache_ratio=resolved.hicache_ratio)
