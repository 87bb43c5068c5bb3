"""The scheduler's memory: the pools for the model, the radix tree over them and, on a PD decode
server, the store that keeps retracted requests' KV. The retraction backup is resolved here, once
the pools exist (its default host-pool size depends on them) and before the tree is built (the
tree's builder, and a registered backend, see the backup in use)."""

from __future__ import annotations

from sglang.srt.configs.runtime_config import CacheConfig, MemoryConfig, RetractionConfig
from sglang.srt.mem_cache.host_pool import decode_retraction_hicache_ratio
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache, validate_host_pool_retraction
from sglang.srt.mem_cache.retraction_backup import build_retraction_store
from sglang.srt.server_args_resolution import infer_decode_retraction_backup


def build_memory(server_args, model_runner):
    """The scheduler's MemoryManager: the pools for this model, then the radix tree over them
    (the registry picks it from the CacheConfig slice) and, on a PD decode server, the store
    that keeps retracted requests' KV."""
    sa, model_config = server_args, model_runner.model_config
    memory = model_runner.build_memory(MemoryConfig.from_server_args(sa))
    # Resolved first (it needs the pool sizes), so the tree's builder sees the backup in use.
    retraction = resolve_decode_retraction(sa, model_config, memory.token_to_kv_pool,
                                           memory.req_to_token_pool.max_context_len)
    memory.attach_tree_cache(create_tree_cache(TreeCacheBuildContext(
        req_to_token_pool=memory.req_to_token_pool,
        token_to_kv_pool_allocator=memory.allocator,
        cache_config=CacheConfig.from_server_args(sa),
        server_args=sa,
        page_size=memory.page_size,
        is_hybrid_swa=memory.is_hybrid_swa,
        sliding_window_size=model_config.sliding_window_size,
        is_hybrid_ssm=model_config.is_hybrid_ssm,
        disable_radix_cache=sa.disable_radix_cache,
        enable_hierarchical_cache=sa.enable_hierarchical_cache,
        eviction_policy=sa.radix_eviction_policy,
        retraction_backup=retraction.backend if retraction else sa.disaggregation_decode_retraction_backup,
        model_config=model_config,
        mamba_pool=memory.mamba_pool,
    )))
    memory.attach_retraction_store(None if retraction is None else build_retraction_store(
        retraction, memory.token_to_kv_pool, memory.allocator, mamba_pool=memory.mamba_pool))
    return memory


def resolve_decode_retraction(sa, model_config, device_pool, max_context_len: int):
    """A PD decode server's retraction backup, resolved by the scheduler once its pools exist
    (None on other servers: they recompute retracted requests). The default backend comes from
    the model (`infer_decode_retraction_backup`), the default host-pool ratio from the device
    pool's size; both are written back to `sa` (source "kv_cache_builder.decode_retraction", as
    upstream) so /server_info shows what the server runs with. Returns the `RetractionConfig` the
    store is built from, so `mem_cache/` never reads or writes `ServerArgs`."""
    if sa.disaggregation_mode != "decode":
        return None
    backend, reason = infer_decode_retraction_backup(
        sa, is_hybrid_ssm=model_config.is_hybrid_ssm, is_pure_swa=model_config.is_pure_swa
    )
    if sa.disaggregation_decode_retraction_backup is None:
        sa.override("kv_cache_builder.decode_retraction", disaggregation_decode_retraction_backup=backend)
    validate_host_pool_retraction(backend, model_config.is_hybrid_ssm, model_config.is_pure_swa,
                                  sa.enable_mamba_host_pool_backup)
    ratio = sa.hicache_ratio
    if backend == "host_pool" and sa.raw_input().get("hicache_ratio") is None and not sa.hicache_size:
        ratio = decode_retraction_hicache_ratio(max_context_len, device_pool.size, device_pool.page_size,
                                                sa.disaggregation_decode_host_receive_threshold)
        sa.override("kv_cache_builder.decode_retraction", hicache_ratio=ratio)
    return RetractionConfig(backend=backend, reason=reason, hicache_ratio=ratio, hicache_size=sa.hicache_size,
                            mamba_host_pool_slots=sa.mamba_host_pool_slots)
