"""Which prefix (tree) cache a scheduler gets: `create_tree_cache(ctx)`.

The model-dependent refusals of host-pool retraction live here, so that the server start and
`python -m sglang.check_server_args` raise the same error from the same code.

Decision chain (upstream 0.5.23 `default_radix_cache_factory`, reduced to what this fork has):
1. `--radix-cache-backend NAME`: the factory registered under NAME (unknown NAME: error).
2. `--disable-radix-cache`: pure-SWA model and backup != host_pool -> upstream builds a
   PureSWARadixCache; here a disabled `UnifiedRadixCache` (same outward behaviour: nothing is
   cached). Otherwise `create_unified_radix_cache(ctx)` with `disable=True`.
3. `--enable-lmcache` / FlexKV: not available in this fork (NotImplementedError).
4. pure-SWA model -> upstream PureSWARadixCache; here a disabled `UnifiedRadixCache` (prefix
   caching off for pure-SWA models), after the host-pool check.
5. else `create_unified_radix_cache(ctx)`: components FULL (+ SWA when the KV pool is an SWA
   pool) (+ MAMBA for hybrid-SSM models: one Mamba state slot per node).
Then upstream's post-checks and the "Tree cache initialized: ..." log line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from sglang.srt.configs.runtime_config import CacheConfig

logger = logging.getLogger(__name__)


def validate_host_pool_retraction(retraction_backup: Optional[str], is_hybrid_ssm: bool, is_pure_swa: bool,
                                  allow_mamba: bool = False) -> None:
    """Upstream's `create_unified_radix_cache` checks, in its order. `allow_mamba`
    (--enable-mamba-host-pool-backup, a fork addition): hybrid SSM models get a host state pool."""
    if retraction_backup != "host_pool":
        return
    if is_hybrid_ssm and not allow_mamba:
        raise ValueError("Host-pool retraction does not support Mamba models.")
    if is_pure_swa:
        raise ValueError("Host-pool retraction does not support pure-SWA models.")


@dataclass
class TreeCacheBuildContext:
    """Everything the factory decides from (upstream 2.1, flattened: no CacheInitParams here).

    is_hybrid_swa: the KV pool is an `SWAKVPool` (model has sliding-window layers and hybrid SWA
      memory is on). full_tokens_per_layer: full-attention tokens per layer, 0 for a pure-SWA
      model (every attention layer slides); None = not reported (derived from model_config).
      Cache choice follows upstream's pool-based "pure SWA" (is_hybrid_swa and no full tokens);
      the host-pool refusal also fires for a pure-SWA *model* on a plain pool.
    retraction_backup: the *resolved* `--disaggregation-decode-retraction-backup`.
    cache_config: the cache flags the chain reads (`CacheConfig`, a slice of `ServerArgs`);
      `server_args` is the whole record, for registered backends that want more (as upstream).
    attach_hicache: builds the host stack when HiCache or host-pool retraction is on; called as
      `cache.init_hicache(attach_hicache)` (see `UnifiedRadixCache.init_hicache`).
    """

    req_to_token_pool: Any
    token_to_kv_pool_allocator: Any
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    server_args: Any = None
    page_size: int = 1
    is_hybrid_swa: bool = False
    is_hybrid_ssm: bool = False
    enable_hierarchical_cache: bool = False
    disable_radix_cache: bool = False
    model_config: Any = None
    full_tokens_per_layer: Optional[int] = None
    sliding_window_size: Optional[int] = None
    eviction_policy: str = "lru"
    retraction_backup: Optional[str] = None
    attach_hicache: Optional[Callable] = None
    tp_worker: Any = None
    tp_size: int = 1
    tp_rank: int = 0
    tp_group: Any = None
    is_dsa: bool = False
    mamba_pool: Any = None  # hybrid SSM models: the MambaPool (requests' and the tree's state slots)
    state_slots: Any = None  # ... and the memory manager's StateSlots that hands its slots out

    @property
    def is_pure_swa(self) -> bool:
        if not self.is_hybrid_swa:
            return False
        if self.full_tokens_per_layer is not None:
            return self.full_tokens_per_layer == 0
        return bool(self.model_config is not None and getattr(self.model_config, "is_pure_swa", False))

    @property
    def is_pure_swa_model(self) -> bool:
        """For the host-pool refusal: the model itself has no full-attention layer, whatever
        pool was built (the same fact `check_server_args` reads from config.json)."""
        return self.is_pure_swa or bool(getattr(self.model_config, "is_pure_swa", False))

    @property
    def window(self) -> Optional[int]:
        if self.sliding_window_size is not None:
            return self.sliding_window_size
        return getattr(self.model_config, "sliding_window_size", None)


# ---- registered backends ------------------------------------------------------------------
_RADIX_CACHE_BACKENDS: Dict[str, Callable[[TreeCacheBuildContext], Any]] = {}


def register_radix_cache_backend(name: str, factory: Callable[[TreeCacheBuildContext], Any]) -> None:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"register_radix_cache_backend: name must be non-empty, got {name!r}")
    if name in _RADIX_CACHE_BACKENDS:
        raise ValueError(f"register_radix_cache_backend: {name!r} is already registered")
    _RADIX_CACHE_BACKENDS[name] = factory


def get_radix_cache_factory(name: str) -> Optional[Callable[[TreeCacheBuildContext], Any]]:
    return _RADIX_CACHE_BACKENDS.get(name)


def registered_radix_cache_backends() -> List[str]:
    return sorted(_RADIX_CACHE_BACKENDS)


def _unregister_radix_cache_backend(name: str) -> None:
    """For tests: registrations are process-wide."""
    _RADIX_CACHE_BACKENDS.pop(name, None)


# ---- the default chain ----------------------------------------------------------------------
def _cache_params(ctx: TreeCacheBuildContext, disable: bool, components):
    from sglang.srt.mem_cache.unified_cache.cache_init_params import CacheInitParams

    return CacheInitParams(
        disable=disable,
        req_to_token_pool=ctx.req_to_token_pool,
        token_to_kv_pool_allocator=ctx.token_to_kv_pool_allocator,
        page_size=ctx.page_size,
        eviction_policy=ctx.eviction_policy or "lru",
        sliding_window_size=ctx.window,
        tree_components=tuple(components),
        mamba_pool=ctx.mamba_pool,
        state_slots=ctx.state_slots,
    )


def _disabled_cache(ctx: TreeCacheBuildContext):
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    return UnifiedRadixCache(_cache_params(ctx, True, (ComponentType.FULL,)))


def _allow_mamba(ctx) -> bool:
    return bool(ctx.cache_config.enable_mamba_host_pool_backup)


def create_unified_radix_cache(ctx: TreeCacheBuildContext, *, cache_class=None):
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    validate_host_pool_retraction(ctx.retraction_backup, ctx.is_hybrid_ssm, ctx.is_pure_swa_model,
                                  _allow_mamba(ctx))
    components = [ComponentType.FULL]
    if ctx.is_hybrid_swa:
        components.append(ComponentType.SWA)
    if ctx.is_hybrid_ssm:
        components.append(ComponentType.MAMBA)
    cache = (cache_class or UnifiedRadixCache)(_cache_params(ctx, bool(ctx.disable_radix_cache), components))
    if ctx.enable_hierarchical_cache or ctx.retraction_backup == "host_pool":
        if ctx.attach_hicache is not None:
            cache.init_hicache(ctx.attach_hicache)
        elif ctx.enable_hierarchical_cache:
            raise NotImplementedError("--enable-hierarchical-cache: no HiCache host stack is available in this build.")
        # host_pool without a host stack: kv_cache_builder reports it with upstream's message.
    return cache


def default_radix_cache_factory(ctx: TreeCacheBuildContext):
    cfg = ctx.cache_config
    if ctx.disable_radix_cache:
        if ctx.is_pure_swa and ctx.retraction_backup != "host_pool":
            return _disabled_cache(ctx)  # upstream: PureSWARadixCache
        return create_unified_radix_cache(ctx)
    if cfg.enable_lmcache:
        raise NotImplementedError("--enable-lmcache: LMCacheUnifiedRadixCache is not available in this build.")
    if cfg.enable_unified_cache_external_linker:
        raise NotImplementedError("--enable-unified-cache-external-linker: no external linker is available in this build.")
    if ctx.is_pure_swa:
        validate_host_pool_retraction(ctx.retraction_backup, ctx.is_hybrid_ssm, True, _allow_mamba(ctx))
        return _disabled_cache(ctx)  # upstream: PureSWARadixCache
    # A pure-SWA model on a plain pool (every layer's KV kept, windows applied by the attention
    # mask) caches like a dense model: FULL only.
    if cfg.enable_flexkv:
        raise NotImplementedError("--enable-flexkv: FlexKV is not available in this build.")
    return create_unified_radix_cache(ctx)


def create_tree_cache(ctx: TreeCacheBuildContext):
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    cfg = ctx.cache_config
    name = cfg.radix_cache_backend
    if name:
        factory = get_radix_cache_factory(name)
        if factory is None:
            raise ValueError(
                f"--radix-cache-backend={name!r} is not registered. Registered backends: "
                f"{registered_radix_cache_backends()}. External backends must call "
                f"register_radix_cache_backend(...) at import time."
            )
        cache, source = factory(ctx), f"registered({name!r})"
    else:
        cache, source = default_radix_cache_factory(ctx), "default"

    impl = type(cache).__name__
    is_unified = isinstance(cache, UnifiedRadixCache)
    if (
        (ctx.enable_hierarchical_cache or cfg.enable_hierarchical_cache)
        and cfg.hicache_host_memory_mode == "buffer_only"
        and not is_unified
    ):
        raise ValueError(
            f"--hicache-host-memory-mode buffer_only is only implemented for the unified radix tree; this model selected {impl}."
        )
    if cfg.enable_session_radix_cache and is_unified:
        raise NotImplementedError("--enable-session-radix-cache: session radix caching is not available in this build.")
    if cfg.enable_session_radix_cache and not hasattr(cache, "enable_session_radix_cache"):
        raise ValueError(
            f"--enable-session-radix-cache requires UnifiedRadixCache, but tree_cache is {impl}. Drop the flag or the "
            f"option that selected another tree cache for this model."
        )
    if cfg.radix_eviction_policy == "tlru" and not is_unified:
        raise ValueError(
            f"--radix-eviction-policy tlru requires UnifiedRadixCache, but tree_cache is {impl}. Drop the flag or the "
            f"option that selected another tree cache for this model."
        )
    if cfg.enable_streaming_session and not is_unified:
        raise NotImplementedError(
            f"--enable-streaming-session is not verified with {impl}; streaming sessions run on UnifiedRadixCache. "
            f"Please open an issue or a PR at https://github.com/sgl-project/sglang if you need this."
        )
    supports_mamba = getattr(cache, "supports_mamba", None)
    if ctx.is_hybrid_ssm and not (supports_mamba is not None and supports_mamba()):
        raise NotImplementedError(
            f"Models with mamba state are not verified with {impl}; mamba state lives in UnifiedRadixCache. "
            f"Please open an issue or a PR at https://github.com/sgl-project/sglang if you need this."
        )
    logger.info(
        "Tree cache initialized: source=%s impl=%s hybrid_swa=%s hybrid_ssm=%s hicache_attached=%s",
        source,
        impl,
        ctx.is_hybrid_swa,
        ctx.is_hybrid_ssm,
        bool(getattr(cache, "hicache_attached", False)),
    )
    return cache
