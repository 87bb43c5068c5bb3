"""create_tree_cache: upstream's decision chain, the two seed errors, registered backends and
the post-checks, on ModelConfigs of tiny dense, hybrid-SWA, pure-SWA and NemotronH configs."""

import logging
import re

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.runtime_config import CacheConfig
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.registry import (
    TreeCacheBuildContext,
    _unregister_radix_cache_backend,
    create_tree_cache,
    get_radix_cache_factory,
    register_radix_cache_backend,
    registered_radix_cache_backends,
    validate_host_pool_retraction,
)
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool, SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.server_args import ServerArgs

BASE = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
        "max_position_embeddings": 256}
DENSE = {**BASE, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}
HYBRID_SWA = {**BASE, "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2, "sliding_window": 16,
              "layer_types": ["sliding_attention", "full_attention"]}
PURE_SWA = {**BASE, "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2, "sliding_window": 16,
            "use_sliding_window": True, "max_window_layers": 0}
NEMOTRON_H = {**BASE, "architectures": ["NemotronHForCausalLM"], "num_hidden_layers": 4,
              "hybrid_override_pattern": "M*M*", "mamba_num_heads": 4, "mamba_head_dim": 8, "ssm_state_size": 8}

MAMBA_MSG = "Host-pool retraction does not support Mamba models."
PURE_SWA_MSG = "Host-pool retraction does not support pure-SWA models."


def _ctx(cfg, backup=None, disable=False, server_args=None, page_size=1, is_hybrid_swa_override=None, cache_config=None,
         **kw):
    mc = ModelConfig.from_dict(cfg)
    size = 64
    req_pool = ReqToTokenPool(4, 128)
    hybrid_pool = mc.is_hybrid_swa and not mc.is_pure_swa
    if hybrid_pool:
        kv = SWAKVPool(size, 32, page_size, torch.float32, 2, 8, mc.swa_layer_ids, mc.full_attention_layer_ids)
        alloc = SWATokenToKVPoolAllocator(size, 32, page_size, kv)
    else:
        kv = MHATokenToKVPool(size, page_size, torch.float32, 2, 8, mc.attention_layer_ids)
        alloc = TokenToKVPoolAllocator(size, page_size, kv)
    return TreeCacheBuildContext(
        cache_config=cache_config or CacheConfig.from_server_args(server_args or ServerArgs(model_path="dummy")),
        server_args=server_args,
        req_to_token_pool=req_pool,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        is_hybrid_swa=mc.is_hybrid_swa if is_hybrid_swa_override is None else is_hybrid_swa_override,
        is_hybrid_ssm=mc.is_hybrid_ssm,
        disable_radix_cache=disable,
        model_config=mc,
        retraction_backup=backup,
        **kw,
    )


def _init_line(caplog):
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Tree cache initialized")]
    assert len(lines) == 1, lines
    return lines[0]


def test_config_shapes_are_what_the_chain_expects():
    assert not ModelConfig.from_dict(DENSE).is_hybrid_swa
    assert ModelConfig.from_dict(HYBRID_SWA).is_hybrid_swa and not ModelConfig.from_dict(HYBRID_SWA).is_pure_swa
    assert ModelConfig.from_dict(PURE_SWA).is_pure_swa
    assert ModelConfig.from_dict(NEMOTRON_H).is_hybrid_ssm


@pytest.mark.parametrize("disable", [False, True])
def test_dense_model_gets_unified_cache(disable, caplog):
    caplog.set_level(logging.INFO, logger="sglang.srt.mem_cache.registry")
    cache = create_tree_cache(_ctx(DENSE, disable=disable))
    assert type(cache) is UnifiedRadixCache and cache.disable is disable
    assert cache.tree_components == (ComponentType.FULL,)
    assert _init_line(caplog) == (
        "Tree cache initialized: source=default impl=UnifiedRadixCache hybrid_swa=False hybrid_ssm=False hicache_attached=False"
    )


def test_hybrid_swa_model_gets_full_and_swa_components(caplog):
    caplog.set_level(logging.INFO, logger="sglang.srt.mem_cache.registry")
    ctx = _ctx(HYBRID_SWA, backup="host_pool")  # host_pool is allowed for hybrid SWA
    cache = create_tree_cache(ctx)
    assert cache.tree_components == (ComponentType.FULL, ComponentType.SWA) and not cache.disable
    assert cache.sliding_window_size == 16
    assert "hybrid_swa=True hybrid_ssm=False" in _init_line(caplog)
    # It caches and serves a prefix through the SWA pool.
    from sglang.srt.mem_cache.radix_key import RadixKey
    from sglang.srt.mem_cache.unified_radix_cache import InsertParams, MatchPrefixParams

    slots = ctx.token_to_kv_pool_allocator.alloc(20)
    cache.insert(InsertParams(RadixKey(list(range(20))), slots))
    assert torch.equal(cache.match_prefix(MatchPrefixParams(RadixKey(list(range(20))))).device_indices, slots)


@pytest.mark.parametrize("disable", [False, True])
def test_seed_error_mamba_model_with_host_pool(disable):
    with pytest.raises(ValueError, match=f"^{re.escape(MAMBA_MSG)}$"):
        create_tree_cache(_ctx(NEMOTRON_H, backup="host_pool", disable=disable))


@pytest.mark.parametrize("disable", [False, True])
def test_seed_error_pure_swa_model_with_host_pool(disable):
    with pytest.raises(ValueError, match=f"^{re.escape(PURE_SWA_MSG)}$"):
        create_tree_cache(_ctx(PURE_SWA, backup="host_pool", disable=disable))


def test_seed_errors_keep_upstream_order_and_other_backups_pass():
    with pytest.raises(ValueError, match=f"^{re.escape(MAMBA_MSG)}$"):
        validate_host_pool_retraction("host_pool", is_hybrid_ssm=True, is_pure_swa=True)
    for backup in (None, "cpu_tensor", "none"):
        validate_host_pool_retraction(backup, True, True)
        assert create_tree_cache(_ctx(PURE_SWA, backup=backup)).disable
        assert create_tree_cache(_ctx(NEMOTRON_H, backup=backup, disable=True)).disable


@pytest.mark.parametrize("disable", [False, True])
def test_pure_swa_model_gets_a_disabled_unified_cache(disable, caplog):
    """Upstream builds a PureSWARadixCache here; this fork caches nothing for pure-SWA models."""
    caplog.set_level(logging.INFO, logger="sglang.srt.mem_cache.registry")
    cache = create_tree_cache(_ctx(PURE_SWA, disable=disable))
    assert type(cache) is UnifiedRadixCache and cache.disable
    assert "impl=UnifiedRadixCache hybrid_swa=True hybrid_ssm=False" in _init_line(caplog)


def test_pure_swa_model_on_a_plain_pool():
    """The scheduler may build a plain pool (is_hybrid_swa=False) for a pure-SWA model: the
    host-pool refusal still applies; otherwise it caches like a dense model."""
    with pytest.raises(ValueError, match=f"^{re.escape(PURE_SWA_MSG)}$"):
        create_tree_cache(_ctx(PURE_SWA, backup="host_pool", is_hybrid_swa_override=False))
    cache = create_tree_cache(_ctx(PURE_SWA, is_hybrid_swa_override=False))
    assert not cache.disable and cache.tree_components == (ComponentType.FULL,)


def test_mamba_model_radix_cache_has_the_mamba_component(caplog):
    from sglang.srt.mem_cache.mamba_pool import MambaPool
    from sglang.srt.mem_cache.state_slots import StateSlots

    caplog.set_level(logging.INFO, logger="sglang.srt.mem_cache.registry")
    with pytest.raises(ValueError, match="MambaPool"):  # the component holds states in the pool
        create_tree_cache(_ctx(NEMOTRON_H))
    pool = MambaPool(4, 1, (8, 3), (2, 4, 4), torch.float32)
    with pytest.raises(ValueError, match="StateSlots"):  # the tree takes its slots from the memory manager
        create_tree_cache(_ctx(NEMOTRON_H, mamba_pool=pool))
    cache = create_tree_cache(_ctx(NEMOTRON_H, mamba_pool=pool, state_slots=StateSlots(pool)))
    assert not cache.disable and ComponentType.MAMBA in cache.core.components and cache.mamba_pool is pool
    caplog.clear()
    cache = create_tree_cache(_ctx(NEMOTRON_H, disable=True))
    assert cache.disable and cache.supports_mamba()
    assert cache.tree_components == (ComponentType.FULL, ComponentType.MAMBA)
    assert "hybrid_ssm=True" in _init_line(caplog)


def test_hicache_attach_hook(caplog):
    caplog.set_level(logging.INFO, logger="sglang.srt.mem_cache.registry")
    seen = []
    cache = create_tree_cache(_ctx(DENSE, enable_hierarchical_cache=True, attach_hicache=lambda c: seen.append(c) or "backend"))
    assert seen == [cache] and cache.host_stack == "backend" and cache.hicache_attached
    assert _init_line(caplog).endswith("hicache_attached=True")
    with pytest.raises(NotImplementedError):
        create_tree_cache(_ctx(DENSE, enable_hierarchical_cache=True))


class _ForeignTree:
    """An external backend's cache (what a registered factory may return)."""

    def __init__(self, ctx):
        self.ctx = ctx


@pytest.fixture
def foreign_backend():
    register_radix_cache_backend("foreign-test", _ForeignTree)
    yield "foreign-test"
    _unregister_radix_cache_backend("foreign-test")


def test_register_backend_errors(foreign_backend):
    for bad in ("", "   "):
        with pytest.raises(ValueError, match=f"^{re.escape(f'register_radix_cache_backend: name must be non-empty, got {bad!r}')}$"):
            register_radix_cache_backend(bad, _ForeignTree)
    with pytest.raises(ValueError, match="^register_radix_cache_backend: 'foreign-test' is already registered$"):
        register_radix_cache_backend("foreign-test", _ForeignTree)
    assert get_radix_cache_factory("foreign-test") is _ForeignTree
    assert "foreign-test" in registered_radix_cache_backends()


def test_unknown_backend_error(foreign_backend):
    sa = ServerArgs(model_path="dummy", radix_cache_backend="nope")
    expected = (
        f"--radix-cache-backend='nope' is not registered. Registered backends: {registered_radix_cache_backends()}. "
        "External backends must call register_radix_cache_backend(...) at import time."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        create_tree_cache(_ctx(DENSE, server_args=sa))


def test_registered_backend_is_used_and_post_checked(foreign_backend, caplog):
    caplog.set_level(logging.INFO, logger="sglang.srt.mem_cache.registry")
    cache = create_tree_cache(_ctx(DENSE, server_args=ServerArgs(model_path="dummy", radix_cache_backend=foreign_backend)))
    assert isinstance(cache, _ForeignTree)
    assert _init_line(caplog) == (
        "Tree cache initialized: source=registered('foreign-test') impl=_ForeignTree hybrid_swa=False "
        "hybrid_ssm=False hicache_attached=False"
    )
    tail = "Drop the flag or the option that selected another tree cache for this model."
    issue = "Please open an issue or a PR at https://github.com/sgl-project/sglang if you need this."
    cases = [
        (dict(radix_eviction_policy="tlru"), DENSE, ValueError,
         f"--radix-eviction-policy tlru requires UnifiedRadixCache, but tree_cache is _ForeignTree. {tail}"),
        (dict(enable_session_radix_cache=True), DENSE, ValueError,
         f"--enable-session-radix-cache requires UnifiedRadixCache, but tree_cache is _ForeignTree. {tail}"),
        (dict(enable_streaming_session=True), DENSE, NotImplementedError,
         f"--enable-streaming-session is not verified with _ForeignTree; streaming sessions run on UnifiedRadixCache. {issue}"),
        (dict(), NEMOTRON_H, NotImplementedError,
         f"Models with mamba state are not verified with _ForeignTree; mamba state lives in UnifiedRadixCache. {issue}"),
        (dict(enable_hierarchical_cache=True, hicache_host_memory_mode="buffer_only"), DENSE, ValueError,
         "--hicache-host-memory-mode buffer_only is only implemented for the unified radix tree; this model selected _ForeignTree."),
    ]
    for flags, cfg, exc, msg in cases:
        # The post-checks see the cache flags as given (ServerArgs itself refuses some of these pairs earlier).
        with pytest.raises(exc, match=f"^{re.escape(msg)}$"):
            create_tree_cache(_ctx(cfg, cache_config=CacheConfig(radix_cache_backend=foreign_backend, **flags)))
