"""The resolution rules of `ServerArgs`: derived defaults and validations, in upstream's order.

Each rule is a function of the `ServerArgs` being built. It reads the current state through
`cfg = server_args._view()` (the last declaration of a field wins, else the raw input) and never
assigns a field: it records its decision with `server_args._declare("<upstream source>", ...)`.
The source strings are upstream's handler names, so `resolution_source("disable_radix_cache")`
answers "_handle_pd_disaggregation" here as it does upstream.

Validation messages are upstream's (reference sections 1.4 and 1.5), verbatim and in order:
deploy scripts and tests match on them.

Only the rules for options this fork accepts are present. Not ported: upstream's early return for
`--model-path dummy|none` (all our rules are model-independent, so they always run), model
overrides, speculative decoding other than NGRAM, DP-attention, CUDA-graph, MoE and multimodal rules.
"""

from __future__ import annotations

import logging
import os
import random

logger = logging.getLogger(__name__)


class ServerArgsAssertionError(ValueError, AssertionError):
    """Upstream checks some rules with `assert`; we raise an error that is both an AssertionError
    (like upstream) and a ValueError (like every other rule), and that survives `python -O`."""


# --------------------------------------------------------------------------------------------
# Early rules (before model paths / defaults upstream)
# --------------------------------------------------------------------------------------------


def handle_hicache_ratio_default(sa) -> None:
    cfg = sa._view()
    fraction = cfg.hicache_host_memory_fraction
    if fraction is not None and not (0 < fraction <= 1):
        raise ValueError("--hicache-host-memory-fraction must be in (0, 1].")
    if cfg.hicache_ratio is not None or cfg.hicache_size:
        # An explicit host pool size wins over the memory-fraction bound.
        if fraction is not None:
            sa._declare("_handle_hicache_ratio_default", hicache_host_memory_fraction=None)
    # A decode server's ratio depends on the retraction backend and the pool size: the scheduler
    # resolves it at start (reference section 4.5).
    if cfg.hicache_ratio is None and cfg.disaggregation_mode != "decode":
        ratio = 1.2 if cfg.hicache_host_memory_mode == "buffer_only" else 2.0
        sa._declare("_handle_hicache_ratio_default", hicache_ratio=ratio)


# Device nodes of NVIDIA, AMD (ROCm) and WSL GPUs: with none of them torch cannot see a GPU.
_GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def detect_device() -> str:
    """cuda when torch sees a GPU, else cpu. torch is imported here, not at module import, and
    not at all on a machine without any GPU device node: importing it costs ~2.4 s, and a server
    resolves its flags before it starts the scheduler, which then starts that much sooner."""
    import sys

    if "torch" not in sys.modules and not any(os.path.exists(p) for p in _GPU_DEVICE_NODES):
        return "cpu"
    try:
        import torch
    except ImportError:
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def handle_missing_default_values(sa) -> None:
    cfg = sa._view()
    decided = {}
    if cfg.tokenizer_path is None:
        decided["tokenizer_path"] = cfg.model_path
    if cfg.served_model_name is None:
        decided["served_model_name"] = cfg.model_path
    if cfg.device is None:
        decided["device"] = detect_device().split(":")[0]
    if cfg.random_seed is None:
        decided["random_seed"] = random.randint(0, 1 << 30)
    if decided:
        sa._declare("_handle_missing_default_values", **decided)


# Keys may come from the environment so that they need not be on the command line, where `ps`
# shows them to every user of the machine. A flag given wins.
API_KEY_ENV = {"api_key": "SGLANG_API_KEY", "admin_api_key": "SGLANG_ADMIN_API_KEY"}


def handle_api_keys_from_environment(sa) -> None:
    cfg = sa._view()
    decided = {field: os.environ[env] for field, env in API_KEY_ENV.items()
               if getattr(cfg, field) is None and os.environ.get(env)}
    if decided:
        sa._declare("_handle_api_keys_from_environment", **decided)


# --------------------------------------------------------------------------------------------
# PD disaggregation (reference 1.5, `handle_pd_disaggregation`)
# --------------------------------------------------------------------------------------------

_PD_DCP_BACKENDS = ("mooncake", "nixl", "mori", "ascend", "fake")


def _prefill_complete_unsupported(cfg) -> list:
    """The features `--disaggregation-decode-allocation-policy prefill_complete` cannot serve
    yet, in upstream's listing order (only those expressible with this fork's flags)."""
    mode = cfg.disaggregation_mode
    attn_tp = cfg.tp_size // max(cfg.attn_dp_size, 1) // max(cfg.attn_cp_size, 1)
    items = []
    if mode == "null":
        items.append("aggregated serving")
    if cfg.disaggregation_transfer_backend != "mooncake":
        items.append("transfer backends other than Mooncake")
    if cfg.pp_size > 1 or cfg.attn_cp_size > 1:
        items.append("pipeline or attention context parallelism")
    if attn_tp > 1:
        items.append("attention tensor parallelism greater than one")
    if mode == "decode" and cfg.disaggregation_decode_host_receive_threshold < 1:
        items.append("decode host KV buffering")
    if mode == "decode" and (cfg.disaggregation_decode_enable_radix_cache or cfg.enable_hierarchical_cache):
        items.append("decode radix cache or decode HiCache")
    if (
        mode == "prefill"
        and cfg.enable_hierarchical_cache
        and (cfg.hicache_write_policy != "write_back" or cfg.hicache_storage_backend is not None)
    ):
        items.append("prefill HiCache other than L2 write_back")
    return items


def handle_pd_disaggregation(sa) -> None:
    src = "_handle_pd_disaggregation"
    cfg = sa._view()

    if cfg.is_embedding and cfg.disaggregation_mode != "null":
        raise ValueError("--is-embedding serves embedding, rerank and score requests on a plain server: they are "
                         "prefill only, so there is nothing to disaggregate (use --disaggregation-mode null).")

    if cfg.disaggregation_transfer_backend == "mooncake_tcp":
        # Mooncake reads MC_FORCE_TCP when its engine starts (in the scheduler process, which
        # inherits this environment) and then ignores any InfiniBand device.
        os.environ["MC_FORCE_TCP"] = "1"
        sa._declare(src, disaggregation_transfer_backend="mooncake", disaggregation_ib_device=None)

    if cfg.disaggregation_decode_allocation_policy == "prefill_complete":
        unsupported = _prefill_complete_unsupported(cfg)
        if unsupported:
            raise ValueError(
                "--disaggregation-decode-allocation-policy prefill_complete does not yet support " + ", ".join(unsupported)
            )
        if cfg.disaggregation_mode == "prefill" and cfg.optimistic_prefill_attempts == 0:
            sa._declare(src, optimistic_prefill_attempts=1)

    if cfg.disaggregation_mode == "prefill" and cfg.dcp_size > 1:
        logger.warning("--dcp-size > 1 has no effect on a PD prefill server; it applies to the decode server.")

    threshold = cfg.disaggregation_decode_host_receive_threshold
    if not 0 <= threshold <= 1:
        raise ValueError("--disaggregation-decode-host-receive-threshold must be between 0 and 1")
    if threshold < 1:
        if cfg.disaggregation_decode_retraction_backup == "cpu_tensor":
            raise ValueError("Decode host KV buffering requires host_pool retraction")
        sa._declare(src, disaggregation_decode_retraction_backup="host_pool")

    if cfg.disaggregation_mode == "decode":
        backend = cfg.disaggregation_transfer_backend
        if cfg.dcp_size > 1 and backend not in _PD_DCP_BACKENDS:
            raise ValueError(
                "PD decode DCP requires --disaggregation-transfer-backend mooncake, nixl, mori, ascend, "
                f"or fake for synthetic benchmarking, got {backend!r}."
            )
        if cfg.disaggregation_decode_enable_radix_cache:
            if backend == "fake":
                raise ValueError(
                    "--disaggregation-decode-enable-radix-cache is incompatible with --disaggregation-transfer-backend fake"
                )
            logger.warning("EXPERIMENTAL: Radix cache is enabled for decode server")
            sa._declare(src, disable_radix_cache=False)
        else:
            logger.warning("Radix cache is disabled for decode server")
            sa._declare(src, disable_radix_cache=True)
        if cfg.disaggregation_decode_extra_slots is None:
            extra = 0
            mrr = cfg.max_running_requests
            if mrr is not None and mrr // max(cfg.dp_size, 1) <= 32:
                extra = 2 * (mrr // max(cfg.dp_size, 1))
            sa._declare(src, disaggregation_decode_extra_slots=extra)

    if cfg.disaggregation_mode == "prefill" and cfg.disaggregation_transfer_backend == "fake":
        raise ServerArgsAssertionError("Prefill server does not support 'fake' as the transfer backend")


# --------------------------------------------------------------------------------------------
# Platform, memory and kernel defaults
# --------------------------------------------------------------------------------------------


def handle_platform_backends(sa) -> None:
    """CPU (and HPU) get torch_native attention; the fork has no intel_amx backend, so unlike
    upstream (intel_amx on x86) CPU always gets torch_native."""
    cfg = sa._view()
    if cfg.device in ("cpu", "hpu"):
        decided = {}
        if cfg.attention_backend is None:
            decided["attention_backend"] = "torch_native"
        if cfg.sampling_backend is None:
            decided["sampling_backend"] = "pytorch"
        if decided:
            sa._declare("_handle_cpu_backends" if cfg.device == "cpu" else "_handle_hpu_backends", **decided)


def gpu_memory_defaults(gpu_mem_mb, *, chunked_prefill_size, max_running_requests, is_decode, tp_size=1, pp_size=1):
    """Upstream's `_handle_gpu_memory_settings` arithmetic for a GPU of `gpu_mem_mb` MiB.

    Returns (chunked_prefill_size, mem_fraction_static). `gpu_mem_mb` None means unknown.
    No CUDA-graph reserve: this fork captures no CUDA graphs.
    """
    if chunked_prefill_size is None:
        if gpu_mem_mb is None:
            chunked_prefill_size = 4096
        else:
            gib = gpu_mem_mb / 1024
            if gib < 20:
                chunked_prefill_size = 2048
            elif gib < 60:
                chunked_prefill_size = 4096
            elif gib < 160:
                chunked_prefill_size = 8192
            else:
                chunked_prefill_size = 16384
    if gpu_mem_mb is None:
        return chunked_prefill_size, 0.95
    if is_decode:
        activation_tokens = max(max_running_requests or 0, 2048)
    else:
        activation_tokens = max(chunked_prefill_size, 2048)
    reserved_mb = 512 + activation_tokens * 1.5 + tp_size * pp_size / 8 * 1024
    if gpu_mem_mb > 60 * 1024:
        reserved_mb = max(reserved_mb, 10 * 1024)
    return chunked_prefill_size, round((gpu_mem_mb - reserved_mb) / gpu_mem_mb, 3)


def _cuda_total_memory_mb(gpu_id: int):
    try:
        import torch

        return torch.cuda.get_device_properties(gpu_id).total_memory / (1 << 20)
    except Exception:
        return None


def handle_gpu_memory_settings(sa) -> None:
    cfg = sa._view()
    if cfg.mem_fraction_static is not None and cfg.chunked_prefill_size is not None:
        return
    decided = {}
    if cfg.device == "cpu":
        # Fork: on CPU the static fraction bounds the KV pool within host memory available at start.
        if cfg.chunked_prefill_size is None:
            decided["chunked_prefill_size"] = 4096
        if cfg.mem_fraction_static is None:
            decided["mem_fraction_static"] = 0.8
    else:
        gpu_mem = _cuda_total_memory_mb(cfg.base_gpu_id) if cfg.device == "cuda" else None
        chunked, fraction = gpu_memory_defaults(
            gpu_mem,
            chunked_prefill_size=cfg.chunked_prefill_size,
            max_running_requests=cfg.max_running_requests,
            is_decode=cfg.disaggregation_mode == "decode",
            tp_size=cfg.tp_size,
            pp_size=cfg.pp_size,
        )
        if cfg.chunked_prefill_size is None:
            decided["chunked_prefill_size"] = chunked
        if cfg.mem_fraction_static is None:
            decided["mem_fraction_static"] = fraction
    sa._declare("_handle_gpu_memory_settings", **decided)


def sampling_backend_default(sa) -> None:
    if sa._view().sampling_backend is None:
        sa._declare("_sampling_backend_default", sampling_backend="pytorch")


def handle_attention_backend_compatibility(sa) -> None:
    cfg = sa._view()
    if cfg.attention_backend is None and cfg.device == "cuda":
        sa._declare("_handle_attention_backend_compatibility", attention_backend="triton")


def page_size_default(sa) -> None:
    if sa._view().page_size is None:
        sa._declare("_page_size_default", page_size=1)


def grammar_backend_default(sa) -> None:
    """Upstream defaults --grammar-backend to xgrammar; outlines/llguidance are not installed in
    this fork, so they say so and use xgrammar (same request surface, same constraints)."""
    backend = sa._view().grammar_backend
    if backend is None:
        sa._declare("_grammar_backend_default", grammar_backend="xgrammar")
    elif backend in ("outlines", "llguidance"):
        logger.warning("--grammar-backend %s is not available in this server; using xgrammar", backend)
        sa._declare("_grammar_backend_default", grammar_backend="xgrammar")


# --------------------------------------------------------------------------------------------
# Hierarchical cache, load balancing, cache compatibility
# --------------------------------------------------------------------------------------------


def handle_hicache(sa) -> None:
    src = "_handle_hicache"
    cfg = sa._view()
    if cfg.enable_unified_cache_external_linker:
        if cfg.disable_radix_cache or cfg.radix_cache_backend is not None:
            raise ValueError(
                "--enable-unified-cache-external-linker requires the default UnifiedRadixCache with radix caching enabled."
            )
        if cfg.enable_hierarchical_cache:
            raise ValueError(
                "--enable-unified-cache-external-linker and --enable-hierarchical-cache are mutually exclusive."
            )
        if cfg.hicache_storage_backend is not None:
            raise ValueError("--enable-unified-cache-external-linker does not use --hicache-storage-backend.")

    uses_host_pool = (
        cfg.enable_hierarchical_cache
        or cfg.disaggregation_decode_enable_offload_kvcache
        or (cfg.disaggregation_mode == "decode" and cfg.disaggregation_decode_retraction_backup in (None, "host_pool"))
    )
    if not uses_host_pool:
        return
    if cfg.hicache_mem_layout == "page_first_direct" and cfg.hicache_io_backend == "kernel":
        logger.warning("Kernel io backend does not support page first direct layout, switching to direct io backend")
        sa._declare(src, hicache_io_backend="direct")
    elif cfg.hicache_mem_layout == "page_first" and cfg.hicache_io_backend == "direct":
        logger.warning("Page first layout is not supported with direct IO backend, switching to page first direct layout")
        sa._declare(src, hicache_mem_layout="page_first_direct")
    if cfg.hicache_storage_backend in ("mooncake", "npu_memcache") and cfg.hicache_mem_layout == "layer_first":
        new_layout = "page_first_direct" if cfg.hicache_io_backend == "direct" else "page_first"
        logger.warning(
            f"Mooncake/Ascend MemCache storage backend does not support layer_first layout, "
            f"switching to {new_layout} layout for {cfg.hicache_io_backend} io backend"
        )
        sa._declare(src, hicache_mem_layout=new_layout)


def handle_data_parallelism(sa) -> None:
    """`--dp-size N`: N scheduler replicas behind one tokenizer (`managers/data_parallel_controller.py`).
    On a PD prefill server each replica registers its KV rank with the bootstrap server under its
    dp rank, and the decode side finds a request's replica as `bootstrap_room % dp_size`: the
    prefill's dispatch must follow that rule (upstream's `follow_bootstrap_room`, its default
    there); upstream's room registration for the other methods is not implemented."""
    cfg = sa._view()
    if cfg.dp_size < 1:
        raise ValueError(f"--dp-size must be at least 1, got {cfg.dp_size}.")
    if cfg.dp_size > 1 and cfg.disaggregation_mode == "prefill" and cfg.load_balance_method not in (
            "auto", "follow_bootstrap_room"):
        raise ValueError(
            f"--load-balance-method {cfg.load_balance_method} is not supported on a PD prefill server with "
            f"--dp-size {cfg.dp_size}: the decode server finds a request's prefill replica as "
            "bootstrap_room % dp_size. Use follow_bootstrap_room (the default on a prefill server)."
        )


LOAD_FORMATS_HERE = ("auto", "safetensors", "gguf")


def handle_load_format(sa) -> None:
    """--load-format: auto reads a GGUF file as GGUF (as upstream's `check_gguf_file`) and a folder
    as safetensors; gguf needs a GGUF file, or "default" (then the packaged GGUF file is served in its
    blocks instead of its dense copy); the other formats are refused in one line."""
    cfg = sa._view()
    fmt = cfg.load_format
    if fmt not in LOAD_FORMATS_HERE:
        raise ValueError(f"--load-format {fmt} is not supported by this server; use one of "
                         f"{', '.join(LOAD_FORMATS_HERE)}")
    if fmt == "auto":
        return
    from sglang.srt.configs.gguf_file import is_gguf_file

    path = cfg.model_path
    if path in (None, "default"):
        return  # gguf: the shipped GGUF file; safetensors: its dense copy (model_loader/default_model.py)
    gguf = is_gguf_file(path)
    if fmt == "gguf" and not gguf:
        raise ValueError(f"--load-format gguf needs a GGUF file as --model-path; {path} is not one")
    if fmt == "safetensors" and gguf:
        raise ValueError(f"--load-format safetensors cannot read {path}: it is a GGUF file "
                         "(use --load-format gguf or auto)")


def handle_load_balance_method(sa) -> None:
    cfg = sa._view()
    if cfg.load_balance_method == "auto":
        method = "follow_bootstrap_room" if cfg.disaggregation_mode == "prefill" else "round_robin"
        sa._declare("_handle_load_balance_method", load_balance_method=method)


def handle_cache_compatibility(sa) -> None:
    """Reference section 1.4, every rule in order."""
    src = "_handle_cache_compatibility"
    cfg = sa._view()
    backup = cfg.disaggregation_decode_retraction_backup
    if backup == "host_pool":
        if cfg.disaggregation_mode != "decode":
            raise ValueError("--disaggregation-decode-retraction-backup=host_pool is only supported on a PD decode server.")
        if cfg.dcp_size > 1:
            raise ValueError("--disaggregation-decode-retraction-backup=host_pool does not support --dcp-size > 1.")
        if cfg.enable_priority_scheduling and not cfg.disable_priority_preemption:
            raise ValueError(
                "--disaggregation-decode-retraction-backup=host_pool requires --disable-priority-preemption "
                "when priority scheduling is enabled."
            )

    if cfg.radix_eviction_policy == "tlru":
        policy_config = cfg.radix_eviction_policy_config or {}
        threshold = policy_config.get("threshold", 0)
        next_prompt_estimate = policy_config.get("next_prompt_estimate", 0)
        if threshold < 0 or next_prompt_estimate < 0:
            raise ValueError(
                "--radix-eviction-policy tlru requires non-negative 'threshold' and 'next_prompt_estimate' in "
                f"--radix-eviction-policy-config, got {threshold} and {next_prompt_estimate}."
            )
        if threshold <= next_prompt_estimate:
            raise ValueError(
                "--radix-eviction-policy tlru needs 'threshold' greater than 'next_prompt_estimate' in "
                f"--radix-eviction-policy-config, got {threshold} <= {next_prompt_estimate}; otherwise no tokens "
                "are ever TEL-safe and T-LRU is exactly LRU."
            )

    if cfg.enable_hierarchical_cache and cfg.disable_radix_cache:
        raise ValueError(
            "The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive "
            "and cannot be used at the same time. Please use only one of them."
        )

    if cfg.disaggregation_decode_enable_offload_kvcache:
        if cfg.disaggregation_mode != "decode":
            raise ValueError("The argument disaggregation-decode-enable-offload-kvcache is only supported for decode side.")
        if cfg.hicache_storage_backend is None:
            raise ValueError(
                "The argument disaggregation-decode-enable-offload-kvcache is only supported when "
                "hicache-storage-backend is provided."
            )
        if backup == "host_pool":
            raise ValueError(
                "The arguments disaggregation-decode-enable-offload-kvcache and "
                "disaggregation-decode-retraction-backup=host_pool are mutually exclusive: both build a decode host pool."
            )

    if cfg._swa_full_tokens_ratio_explicitly_set is None:
        sa._declare(src, _swa_full_tokens_ratio_explicitly_set=cfg.swa_full_tokens_ratio is not None)
    ratio = cfg.swa_full_tokens_ratio
    if ratio is None:
        ratio = sa._fallback("swa_full_tokens_ratio")
    if not (0 < ratio <= 1.0):
        raise ValueError("--swa-full-tokens-ratio should be in range (0, 1.0].")
    if cfg.swa_prefix_tails is not None and cfg.swa_prefix_tails < 0:
        raise ValueError("--swa-prefix-tails should be a non-negative integer.")

    if cfg.enable_lmcache:
        _check_lmcache(cfg)


def _check_lmcache(cfg) -> None:
    if cfg.enable_hierarchical_cache:
        raise ValueError("--enable-lmcache and --enable-hierarchical-cache are mutually exclusive")
    if cfg.enable_unified_cache_external_linker:
        raise ValueError("--enable-lmcache and --enable-unified-cache-external-linker are mutually exclusive")
    if cfg.disable_radix_cache:
        raise ValueError("--enable-lmcache requires radix cache to be enabled")
    if cfg.speculative_algorithm is not None:
        raise NotImplementedError("LMCacheUnifiedRadixCache does not yet support speculative decoding")
    if cfg.attn_dp_size > 1:
        raise NotImplementedError("LMCacheUnifiedRadixCache does not yet support DP attention")
    if cfg.dcp_size > 1:
        raise NotImplementedError(
            "--enable-lmcache with --dcp-size > 1 is not supported: LMCache has no DCP-aware index translation"
        )
    if cfg.enable_streaming_session:
        raise NotImplementedError("LMCacheUnifiedRadixCache does not yet support streaming sessions")
    if cfg.hicache_host_memory_mode == "buffer_only":
        raise ValueError("--hicache-host-memory-mode=buffer_only is a HiCache-only mode")
    if cfg.disaggregation_mode != "null":
        raise NotImplementedError("LMCacheUnifiedRadixCache currently supports colocated prefill/decode scheduling only")


_SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
_SPEC_RUNS_HERE = ("NGRAM",)


def handle_speculative_decoding(sa) -> None:
    """Upstream's `_handle_speculative_decoding` for NGRAM (its defaults, warnings and messages);
    the algorithms this server does not run are refused here, before anything loads."""
    src = "_handle_speculative_decoding"
    cfg = sa._view()
    algo = cfg.speculative_algorithm
    if algo is None:
        return
    algo = str(algo).upper()
    if algo not in _SPEC_ALGORITHMS:
        raise ValueError(f"Unknown --speculative-algorithm {cfg.speculative_algorithm!r}: "
                         f"choose one of {', '.join(_SPEC_ALGORITHMS)}.")
    if algo == "NEXTN":  # upstream's alias
        algo = "EAGLE"
    if algo not in _SPEC_RUNS_HERE:
        raise ValueError(f"--speculative-algorithm {algo} is not supported by this server yet; "
                         f"it runs {', '.join(_SPEC_RUNS_HERE)} speculative decoding.")
    sa._declare(src, speculative_algorithm=algo)
    _handle_ngram(sa, src)


def _handle_ngram(sa, src: str) -> None:
    cfg = sa._view()
    if cfg.device not in ("cuda", "cpu"):
        raise ValueError("Ngram speculative decoding only supports CUDA or CPU devices.")
    if cfg.max_running_requests is None:
        sa._declare(src, max_running_requests=48)
        logger.warning("Max running requests is reset to 48 for speculative decoding. You can override this by "
                       "explicitly setting --max-running-requests.")
    sa._declare(src, enable_mixed_chunk=False, speculative_eagle_topk=cfg.speculative_ngram_max_bfs_breadth)
    num_draft_tokens = cfg.speculative_num_draft_tokens
    if num_draft_tokens is None:
        num_draft_tokens = 12
        sa._declare(src, speculative_num_draft_tokens=num_draft_tokens)
        logger.warning("speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. "
                       "You can override this by explicitly setting --speculative-num-draft-tokens.")
    if num_draft_tokens < 1:
        raise ValueError(f"--speculative-num-draft-tokens must be at least 1, got {num_draft_tokens}.")
    topk = sa._view().speculative_eagle_topk  # the BFS breadth, declared above (upstream's tree width)
    if cfg.speculative_num_steps is None:
        sa._declare(src, speculative_num_steps=num_draft_tokens // max(topk, 1))
    if cfg.speculative_ngram_external_corpus_path is not None:
        if cfg.speculative_ngram_external_sam_budget <= 0:
            raise ValueError("--speculative-ngram-external-sam-budget must be positive when "
                             "--speculative-ngram-external-corpus-path is set.")
        if cfg.speculative_ngram_external_corpus_max_tokens <= 0:
            raise ValueError("--speculative-ngram-external-corpus-max-tokens must be positive when "
                             "--speculative-ngram-external-corpus-path is set.")
        if cfg.speculative_ngram_external_sam_budget > num_draft_tokens - 1:
            raise ValueError("speculative_ngram_external_sam_budget must be less than or equal to "
                             f"speculative_num_draft_tokens - 1 ({num_draft_tokens - 1}).")
        raise ValueError("--speculative-ngram-external-corpus-path is not supported by this server: its NGRAM "
                         "drafts come from each request's own tokens.")
    logger.warning("The mixed chunked prefill are disabled because of using ngram speculative decoding.")
    page_size = cfg.page_size
    if topk > 1 and page_size is not None and page_size > 1 and cfg.attention_backend != "flashinfer":
        raise ValueError(
            f"speculative_eagle_topk({topk}) > 1 with page_size({page_size}) > 1 is unstable and produces incorrect "
            "results for paged attention backends. This combination is only supported for the 'flashinfer' backend."
        )
    # What upstream's shared token trie does that one chain per request does not: said when set.
    if (topk != 10 or cfg.speculative_ngram_min_bfs_breadth != 1 or cfg.speculative_ngram_match_type != "BFS"
            or cfg.speculative_ngram_capacity != 10 * 1000 * 1000):
        logger.warning("NGRAM here verifies one chain per request, drafted from that request's own tokens: "
                       "--speculative-ngram-min/max-bfs-breadth, --speculative-ngram-match-type and "
                       "--speculative-ngram-capacity (upstream's shared token trie) have no effect.")


def check_parsers_implemented(sa) -> None:
    """(This fork.) Every upstream parser name is a valid choice; one whose format is not
    implemented here stops the start-up with a message that names it and lists what is."""
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    for flag, name, implemented in (("--tool-call-parser", sa.tool_call_parser, FunctionCallParser.ToolCallParserEnum),
                                    ("--reasoning-parser", sa.reasoning_parser, ReasoningParser.DetectorMap)):
        if name and name != "auto" and name not in implemented:
            raise ValueError(f"{flag} {name}: upstream's parser of that name is not implemented by this server. "
                             f"Implemented: {', '.join(sorted(implemented))}.")


def check_tensor_parallel(sa) -> None:
    """--tp-size / --nnodes / --node-rank / --dist-init-addr: a layout the launcher can start,
    else one line before anything starts."""
    cfg = sa._view()
    if cfg.tp_size < 1 or cfg.nnodes < 1:
        raise ValueError(f"--tp-size ({cfg.tp_size}) and --nnodes ({cfg.nnodes}) must be at least 1")
    if not 0 <= cfg.node_rank < cfg.nnodes:
        raise ValueError(f"--node-rank {cfg.node_rank} is not in [0, --nnodes {cfg.nnodes})")
    if cfg.tp_size % cfg.nnodes:
        raise ValueError(f"--tp-size {cfg.tp_size} must be a multiple of --nnodes {cfg.nnodes} (the same number of "
                         "ranks on every node)")
    if cfg.nnodes > 1 and not cfg.dist_init_addr:
        raise ValueError("--nnodes > 1 needs --dist-init-addr HOST:PORT (node 0's address, reachable from every node)")
    if cfg.dist_init_addr:
        from sglang.srt.utils import split_host_port

        split_host_port(cfg.dist_init_addr)  # upstream's error for a malformed address
    if cfg.tp_size > 1 and (cfg.dp_size or 1) > 1:
        raise ValueError(f"--tp-size {cfg.tp_size} with --dp-size {cfg.dp_size} is not supported yet: run one of them "
                         "(each data-parallel replica is one process)")
    if cfg.tp_size > 1 and cfg.disaggregation_mode != "null":
        raise ValueError(f"--tp-size {cfg.tp_size} with --disaggregation-mode {cfg.disaggregation_mode} is not supported "
                         "yet: the KV transfer moves one rank's pages; run PD servers with --tp-size 1")
    if cfg.tp_size > 1 and cfg.speculative_algorithm is not None:
        raise ValueError(f"--tp-size {cfg.tp_size} with --speculative-algorithm {cfg.speculative_algorithm} is not "
                         "supported yet: the verify step runs on one rank; run speculative decoding with --tp-size 1")
    if cfg.tp_size > 1 and (cfg.load_format == "gguf" or _is_gguf_model(cfg.model_path)):
        raise ValueError(f"--tp-size {cfg.tp_size} with a GGUF model is not supported yet: its blocks are not split "
                         "across ranks; run it with --tp-size 1")


def _is_gguf_model(path) -> bool:
    from sglang.srt.configs.gguf_file import is_gguf_file

    return path not in (None, "default") and is_gguf_file(path)


# Upstream's pipeline order (reference 1.2), restricted to the rules above (and this fork's checks).
RESOLUTION_PIPELINE = (
    handle_hicache_ratio_default,
    handle_missing_default_values,
    handle_api_keys_from_environment,
    handle_pd_disaggregation,
    handle_platform_backends,
    handle_gpu_memory_settings,
    sampling_backend_default,
    handle_attention_backend_compatibility,
    page_size_default,
    grammar_backend_default,
    handle_hicache,
    handle_data_parallelism,
    handle_load_balance_method,
    handle_speculative_decoding,
    handle_cache_compatibility,
    handle_load_format,
    check_parsers_implemented,
    check_tensor_parallel,
)


def run_resolution_pipeline(sa) -> None:
    for rule in RESOLUTION_PIPELINE:
        rule(sa)


# --------------------------------------------------------------------------------------------
# Decode retraction backup auto rule (reference 4.5), usable before the pool exists; the
# scheduler resolves it once the pools do (`managers/scheduler_memory.py`)
# --------------------------------------------------------------------------------------------


def infer_decode_retraction_backup(sa, *, is_hybrid_ssm=None, is_pure_swa=None, is_hip=False):
    """What `--disaggregation-decode-retraction-backup` resolves to when omitted.

    Upstream decides at scheduler start from the built KV pool
    (`kv_cache_builder.resolve_decode_retraction_backup`): `host_pool` iff a PD decode server, not
    HIP, no DCP, no decode radix cache, no decode offload, no priority preemption, and a pool that
    supports it (no SSM state, not pure sliding-window). Here the pool facts come from the
    model's config (`is_hybrid_ssm`, `is_pure_swa`; None = unknown). Returns `(value, reason)`;
    value None means "host_pool unless the model rules it out" (model not inspected). An explicit
    flag is returned as is.
    """
    given = sa.disaggregation_decode_retraction_backup
    if given is not None:
        return given, "given"
    if sa.disaggregation_mode != "decode":
        return "cpu_tensor", "not a PD decode server"
    blockers = []
    if is_hip:
        blockers.append("HIP/ROCm")
    if sa.dcp_size > 1:
        blockers.append("--dcp-size > 1")
    if sa.disaggregation_decode_enable_radix_cache:
        blockers.append("decode radix cache")
    if sa.disaggregation_decode_enable_offload_kvcache:
        blockers.append("decode KV offload")
    if sa.enable_priority_scheduling and not sa.disable_priority_preemption:
        blockers.append("priority scheduling with preemption")
    if is_hybrid_ssm and not sa.enable_mamba_host_pool_backup:
        blockers.append("model has SSM (Mamba) state")
    if is_pure_swa:
        blockers.append("model is pure sliding-window")
    if blockers:
        return "cpu_tensor", "host pool ruled out by: " + ", ".join(blockers)
    if is_hybrid_ssm is None or is_pure_swa is None:
        return None, "host_pool unless the model has SSM state or is pure sliding-window (model not inspected)"
    return "host_pool", "PD decode server whose KV pool supports a host backup"
