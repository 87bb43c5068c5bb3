"""Every validation rule of ServerArgs: upstream's exact message, and a neighbouring flag set that
passes (so a rule that fires too broadly fails too). Reference sections 1.4 and 1.5."""

import os
import re

import pytest

from sglang.srt.server_args import ServerArgs, ServerArgsAssertionError, prepare_server_args

HOST_POOL_NOT_DECODE = "--disaggregation-decode-retraction-backup=host_pool is only supported on a PD decode server."
HOST_POOL_DCP = "--disaggregation-decode-retraction-backup=host_pool does not support --dcp-size > 1."
HOST_POOL_PRIORITY = (
    "--disaggregation-decode-retraction-backup=host_pool requires --disable-priority-preemption "
    "when priority scheduling is enabled."
)
HICACHE_VS_NO_RADIX = (
    "The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive and cannot be "
    "used at the same time. Please use only one of them."
)
OFFLOAD_DECODE_ONLY = "The argument disaggregation-decode-enable-offload-kvcache is only supported for decode side."
OFFLOAD_NEEDS_STORAGE = (
    "The argument disaggregation-decode-enable-offload-kvcache is only supported when hicache-storage-backend is provided."
)
OFFLOAD_VS_HOST_POOL = (
    "The arguments disaggregation-decode-enable-offload-kvcache and disaggregation-decode-retraction-backup=host_pool "
    "are mutually exclusive: both build a decode host pool."
)
SWA_RATIO = "--swa-full-tokens-ratio should be in range (0, 1.0]."
SWA_TAILS = "--swa-prefix-tails should be a non-negative integer."
RECEIVE_RANGE = "--disaggregation-decode-host-receive-threshold must be between 0 and 1"
RECEIVE_NEEDS_HOST_POOL = "Decode host KV buffering requires host_pool retraction"
DECODE_RADIX_FAKE = "--disaggregation-decode-enable-radix-cache is incompatible with --disaggregation-transfer-backend fake"
PREFILL_FAKE = "Prefill server does not support 'fake' as the transfer backend"
FRACTION = "--hicache-host-memory-fraction must be in (0, 1]."

DECODE = dict(disaggregation_mode="decode")


def raises(exc, msg, **kwargs):
    with pytest.raises(exc, match="^" + re.escape(msg) + "$"):
        ServerArgs(**kwargs)


@pytest.fixture(autouse=True)
def _restore_mc_force_tcp(monkeypatch):
    # mooncake_tcp sets MC_FORCE_TCP in the environment; keep tests independent.
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)


EMBEDDING_PD = ("--is-embedding serves embedding, rerank and score requests on a plain server: they are prefill "
                "only, so there is nothing to disaggregate (use --disaggregation-mode null).")


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_embedding_servers_are_plain_servers(mode):
    raises(ValueError, EMBEDDING_PD, is_embedding=True, disaggregation_mode=mode)
    ServerArgs(is_embedding=True)
    ServerArgs(disaggregation_mode=mode)


# ---------------------------------------------------------------- 1.4 rules 1-3 (host_pool)
@pytest.mark.parametrize("mode", ["null", "prefill"])
def test_host_pool_only_on_decode(mode):
    raises(ValueError, HOST_POOL_NOT_DECODE, disaggregation_mode=mode, disaggregation_decode_retraction_backup="host_pool")
    ServerArgs(disaggregation_mode="decode", disaggregation_decode_retraction_backup="host_pool")
    ServerArgs(disaggregation_mode=mode, disaggregation_decode_retraction_backup="cpu_tensor")


def test_host_pool_rejects_dcp():
    raises(ValueError, HOST_POOL_DCP, dcp_size=2, disaggregation_decode_retraction_backup="host_pool", **DECODE)
    ServerArgs(dcp_size=2, disaggregation_decode_retraction_backup="cpu_tensor", **DECODE)
    ServerArgs(dcp_size=1, disaggregation_decode_retraction_backup="host_pool", **DECODE)


def test_host_pool_with_priority_needs_no_preemption():
    kw = dict(disaggregation_decode_retraction_backup="host_pool", enable_priority_scheduling=True, **DECODE)
    raises(ValueError, HOST_POOL_PRIORITY, **kw)
    ServerArgs(disable_priority_preemption=True, **kw)
    ServerArgs(disaggregation_decode_retraction_backup="none", enable_priority_scheduling=True, **DECODE)


def test_cpu_tensor_has_no_constraints():
    ServerArgs(
        disaggregation_decode_retraction_backup="cpu_tensor",
        dcp_size=2,
        enable_priority_scheduling=True,
    )


# ---------------------------------------------------------------- rule 4 (tlru)
def test_tlru_requires_non_negative_config():
    msg = (
        "--radix-eviction-policy tlru requires non-negative 'threshold' and 'next_prompt_estimate' in "
        "--radix-eviction-policy-config, got -1 and 5."
    )
    raises(ValueError, msg, radix_eviction_policy="tlru", radix_eviction_policy_config={"threshold": -1, "next_prompt_estimate": 5})


@pytest.mark.parametrize("config,shown", [(None, "0 <= 0"), ({"threshold": 8, "next_prompt_estimate": 8}, "8 <= 8")])
def test_tlru_threshold_must_exceed_estimate(config, shown):
    msg = (
        "--radix-eviction-policy tlru needs 'threshold' greater than 'next_prompt_estimate' in "
        f"--radix-eviction-policy-config, got {shown}; otherwise no tokens are ever TEL-safe and T-LRU is exactly LRU."
    )
    raises(ValueError, msg, radix_eviction_policy="tlru", radix_eviction_policy_config=config)
    ServerArgs(radix_eviction_policy="tlru", radix_eviction_policy_config={"threshold": 9, "next_prompt_estimate": 8})
    ServerArgs(radix_eviction_policy="lru", radix_eviction_policy_config=config)


# ---------------------------------------------------------------- rule 5
def test_hicache_and_disabled_radix_are_exclusive():
    raises(ValueError, HICACHE_VS_NO_RADIX, enable_hierarchical_cache=True, disable_radix_cache=True)
    ServerArgs(enable_hierarchical_cache=True)
    ServerArgs(disable_radix_cache=True)


def test_decode_hicache_needs_decode_radix_cache():
    # The decode server disables its radix cache (a declaration), and rule 5 reads the resolved value.
    raises(ValueError, HICACHE_VS_NO_RADIX, enable_hierarchical_cache=True, **DECODE)
    sa = ServerArgs(enable_hierarchical_cache=True, disaggregation_decode_enable_radix_cache=True, **DECODE)
    assert sa.disable_radix_cache is False


# ---------------------------------------------------------------- rule 6 (decode offload)
def test_offload_is_decode_only():
    raises(ValueError, OFFLOAD_DECODE_ONLY, disaggregation_decode_enable_offload_kvcache=True, hicache_storage_backend="file")
    raises(
        ValueError,
        OFFLOAD_DECODE_ONLY,
        disaggregation_mode="prefill",
        disaggregation_decode_enable_offload_kvcache=True,
        hicache_storage_backend="file",
    )


def test_offload_needs_storage_backend():
    raises(ValueError, OFFLOAD_NEEDS_STORAGE, disaggregation_decode_enable_offload_kvcache=True, **DECODE)
    ServerArgs(disaggregation_decode_enable_offload_kvcache=True, hicache_storage_backend="file", **DECODE)


def test_offload_rejects_host_pool_allows_cpu_tensor():
    kw = dict(disaggregation_decode_enable_offload_kvcache=True, hicache_storage_backend="file", **DECODE)
    raises(ValueError, OFFLOAD_VS_HOST_POOL, disaggregation_decode_retraction_backup="host_pool", **kw)
    with pytest.raises(ValueError, match="mutually exclusive"):  # upstream's own test assertion
        ServerArgs(disaggregation_decode_retraction_backup="host_pool", **kw)
    ServerArgs(disaggregation_decode_retraction_backup="cpu_tensor", **kw)


# ---------------------------------------------------------------- rules 7-9 (SWA)
@pytest.mark.parametrize("ratio", [0.0, -0.5, 1.01])
def test_swa_ratio_range(ratio):
    raises(ValueError, SWA_RATIO, swa_full_tokens_ratio=ratio)


@pytest.mark.parametrize("ratio", [1.0, 0.25])
def test_swa_ratio_valid_and_explicit_flag_declared(ratio):
    sa = ServerArgs(swa_full_tokens_ratio=ratio)
    assert sa.swa_full_tokens_ratio == ratio
    assert sa._swa_full_tokens_ratio_explicitly_set is True
    assert sa.resolution_source("_swa_full_tokens_ratio_explicitly_set") == "_handle_cache_compatibility"


def test_swa_ratio_fallback_when_unset():
    sa = ServerArgs()
    assert sa._swa_full_tokens_ratio_explicitly_set is False
    assert sa.swa_full_tokens_ratio == 0.8
    assert sa.raw_input()["swa_full_tokens_ratio"] is None


def test_swa_prefix_tails_non_negative():
    raises(ValueError, SWA_TAILS, swa_prefix_tails=-1)
    ServerArgs(swa_prefix_tails=0)


# ---------------------------------------------------------------- rule 10 (LMCache), in order
@pytest.mark.parametrize(
    "exc,msg,kw",
    [
        (ValueError, "--enable-lmcache and --enable-hierarchical-cache are mutually exclusive", dict(enable_hierarchical_cache=True)),
        (
            ValueError,
            "--enable-lmcache and --enable-unified-cache-external-linker are mutually exclusive",
            dict(enable_unified_cache_external_linker=True),
        ),
        (ValueError, "--enable-lmcache requires radix cache to be enabled", dict(disable_radix_cache=True)),
        (ValueError, "--enable-lmcache requires radix cache to be enabled", dict(disaggregation_mode="decode")),
        (NotImplementedError, "LMCacheUnifiedRadixCache does not yet support DP attention", dict(attn_dp_size=2)),
        (
            NotImplementedError,
            "--enable-lmcache with --dcp-size > 1 is not supported: LMCache has no DCP-aware index translation",
            dict(dcp_size=2),
        ),
        (NotImplementedError, "LMCacheUnifiedRadixCache does not yet support streaming sessions", dict(enable_streaming_session=True)),
        (ValueError, "--hicache-host-memory-mode=buffer_only is a HiCache-only mode", dict(hicache_host_memory_mode="buffer_only")),
        (
            NotImplementedError,
            "LMCacheUnifiedRadixCache currently supports colocated prefill/decode scheduling only",
            dict(disaggregation_mode="prefill"),
        ),
        (
            NotImplementedError,
            "LMCacheUnifiedRadixCache currently supports colocated prefill/decode scheduling only",
            dict(disaggregation_mode="decode", disaggregation_decode_enable_radix_cache=True),
        ),
    ],
)
def test_lmcache_rules(exc, msg, kw):
    raises(exc, msg, enable_lmcache=True, **kw)
    ServerArgs(**kw)  # the same flags without --enable-lmcache are fine


def test_lmcache_alone_passes():
    assert ServerArgs(enable_lmcache=True).enable_lmcache


# ---------------------------------------------------------------- 1.5 PD rules
@pytest.mark.parametrize("threshold", [-0.1, 1.5])
def test_host_receive_threshold_range(threshold):
    raises(ValueError, RECEIVE_RANGE, disaggregation_decode_host_receive_threshold=threshold, **DECODE)


def test_host_receive_threshold_declares_host_pool():
    sa = ServerArgs(disaggregation_decode_host_receive_threshold=0.5, **DECODE)
    assert sa.disaggregation_decode_retraction_backup == "host_pool"
    assert sa.resolution_source("disaggregation_decode_retraction_backup") == "_handle_pd_disaggregation"
    assert sa.raw_input()["disaggregation_decode_retraction_backup"] is None
    assert ServerArgs(**DECODE).disaggregation_decode_retraction_backup is None  # left for the scheduler
    raises(
        ValueError,
        RECEIVE_NEEDS_HOST_POOL,
        disaggregation_decode_host_receive_threshold=0.5,
        disaggregation_decode_retraction_backup="cpu_tensor",
        **DECODE,
    )


def test_host_receive_off_decode_then_fails_host_pool_rule():
    # The declared host_pool is what rule 1 then reads: order of the pipeline.
    raises(ValueError, HOST_POOL_NOT_DECODE, disaggregation_decode_host_receive_threshold=0.5)


def test_decode_radix_cache_rejects_fake_backend():
    raises(
        ValueError,
        DECODE_RADIX_FAKE,
        disaggregation_decode_enable_radix_cache=True,
        disaggregation_transfer_backend="fake",
        **DECODE,
    )
    sa = ServerArgs(disaggregation_decode_enable_radix_cache=True, **DECODE)
    assert sa.disable_radix_cache is False
    assert ServerArgs(disaggregation_transfer_backend="fake", **DECODE).disable_radix_cache is True


def test_prefill_rejects_fake_backend():
    for exc in (ValueError, AssertionError):
        with pytest.raises(exc, match="^" + re.escape(PREFILL_FAKE) + "$"):
            ServerArgs(disaggregation_mode="prefill", disaggregation_transfer_backend="fake")
    assert issubclass(ServerArgsAssertionError, AssertionError)
    ServerArgs(disaggregation_mode="decode", disaggregation_transfer_backend="fake")
    ServerArgs(disaggregation_mode="prefill", disaggregation_transfer_backend="nixl")


def test_mooncake_tcp_rewrite():
    sa = ServerArgs(disaggregation_mode="prefill", disaggregation_transfer_backend="mooncake_tcp", disaggregation_ib_device="mlx5_0")
    assert os.environ["MC_FORCE_TCP"] == "1"
    assert sa.disaggregation_transfer_backend == "mooncake"
    assert sa.disaggregation_ib_device is None
    assert sa.raw_input()["disaggregation_transfer_backend"] == "mooncake_tcp"
    assert sa.raw_input()["disaggregation_ib_device"] == "mlx5_0"
    assert sa.resolution_source("disaggregation_transfer_backend") == "_handle_pd_disaggregation"


def test_plain_mooncake_does_not_force_tcp():
    sa = ServerArgs(disaggregation_mode="prefill", disaggregation_ib_device="mlx5_0")
    assert "MC_FORCE_TCP" not in os.environ
    assert sa.disaggregation_ib_device == "mlx5_0"


def test_prefill_complete_lists_unsupported_features_in_order():
    prefix = "--disaggregation-decode-allocation-policy prefill_complete does not yet support "
    raises(
        ValueError,
        prefix + "aggregated serving, transfer backends other than Mooncake, attention tensor parallelism greater than one",
        disaggregation_decode_allocation_policy="prefill_complete",
        disaggregation_transfer_backend="nixl",
        tp_size=2,
    )
    raises(
        ValueError,
        prefix + "decode host KV buffering, decode radix cache or decode HiCache",
        disaggregation_decode_allocation_policy="prefill_complete",
        disaggregation_decode_host_receive_threshold=0.5,
        disaggregation_decode_enable_radix_cache=True,
        **DECODE,
    )
    raises(
        ValueError,
        prefix + "prefill HiCache other than L2 write_back",
        disaggregation_decode_allocation_policy="prefill_complete",
        disaggregation_mode="prefill",
        enable_hierarchical_cache=True,
    )
    # mooncake_tcp is rewritten to mooncake first, so it is accepted.
    sa = ServerArgs(
        disaggregation_decode_allocation_policy="prefill_complete",
        disaggregation_mode="prefill",
        disaggregation_transfer_backend="mooncake_tcp",
        enable_hierarchical_cache=True,
        hicache_write_policy="write_back",
    )
    assert sa.optimistic_prefill_attempts == 1
    assert ServerArgs(disaggregation_decode_allocation_policy="prefill_complete", **DECODE).optimistic_prefill_attempts == 0


# ---------------------------------------------------------------- HiCache rules
@pytest.mark.parametrize("fraction", [0.0, 1.5])
def test_hicache_host_memory_fraction_range(fraction):
    raises(ValueError, FRACTION, hicache_host_memory_fraction=fraction)


def test_hicache_fraction_cleared_by_explicit_size():
    assert ServerArgs(hicache_host_memory_fraction=1.0).hicache_host_memory_fraction == 1.0
    sa = ServerArgs(enable_hierarchical_cache=True, hicache_size=4)
    assert sa.hicache_host_memory_fraction is None
    assert sa.resolution_source("hicache_host_memory_fraction") == "_handle_hicache_ratio_default"


@pytest.mark.parametrize(
    "msg,kw",
    [
        (
            "--enable-unified-cache-external-linker requires the default UnifiedRadixCache with radix caching enabled.",
            dict(disable_radix_cache=True),
        ),
        (
            "--enable-unified-cache-external-linker and --enable-hierarchical-cache are mutually exclusive.",
            dict(enable_hierarchical_cache=True),
        ),
        ("--enable-unified-cache-external-linker does not use --hicache-storage-backend.", dict(hicache_storage_backend="file")),
    ],
)
def test_external_linker_rules(msg, kw):
    raises(ValueError, msg, enable_unified_cache_external_linker=True, **kw)
    ServerArgs(enable_unified_cache_external_linker=True)


def test_hicache_layout_normalization():
    sa = ServerArgs(enable_hierarchical_cache=True, hicache_mem_layout="page_first_direct")
    assert (sa.hicache_mem_layout, sa.hicache_io_backend) == ("page_first_direct", "direct")
    sa = ServerArgs(enable_hierarchical_cache=True, hicache_io_backend="direct")
    assert (sa.hicache_mem_layout, sa.hicache_io_backend) == ("page_first_direct", "direct")
    sa = ServerArgs(enable_hierarchical_cache=True, hicache_mem_layout="layer_first", hicache_storage_backend="mooncake")
    assert sa.hicache_mem_layout == "page_first"
    assert sa.resolution_source("hicache_mem_layout") == "_handle_hicache"
    # Without a host pool there is nothing to normalize.
    sa = ServerArgs(hicache_io_backend="direct")
    assert (sa.hicache_mem_layout, sa.resolution_source("hicache_mem_layout")) == ("page_first", None)


# ---------------------------------------------------------------- order and the CLI path
def test_first_rule_in_upstream_order_wins():
    # Violates rule 1 (host_pool off decode) and rule 5 (hicache vs disabled radix): rule 1 first.
    raises(
        ValueError,
        HOST_POOL_NOT_DECODE,
        disaggregation_decode_retraction_backup="host_pool",
        enable_hierarchical_cache=True,
        disable_radix_cache=True,
    )
    # PD rules (1.5) run before cache compatibility (1.4).
    raises(
        ValueError,
        RECEIVE_RANGE,
        disaggregation_decode_host_receive_threshold=2.0,
        swa_full_tokens_ratio=5.0,
    )


def test_cli_raises_the_same_messages():
    with pytest.raises(ValueError, match="^" + re.escape(HOST_POOL_DCP) + "$"):
        prepare_server_args(
            ["--disaggregation-mode", "decode", "--disaggregation-decode-retraction-backup", "host_pool", "--dcp-size", "2"]
        )
    with pytest.raises(ValueError, match="^" + re.escape(HICACHE_VS_NO_RADIX) + "$"):
        prepare_server_args(["--enable-hicache", "--disable-radix-cache"])
