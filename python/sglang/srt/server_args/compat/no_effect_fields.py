"""Upstream `ServerArgs` fields that this server parses and validates but that change nothing here.

They are declared apart from the fields that act (`server_args/fields.py`) so that a reader of
`fields.py` sees only what the server does. Each declaration keeps upstream's name, default, help
and choices (so upstream launch commands, `--config` files and `Engine(**kwargs)` keep working and
upstream's validation rules still see them) and carries its `no_effect` reason, which the start-up
warning and `docs/server_args.md` report. When a feature makes one of them act, its declaration
moves to `fields.py` and loses the reason.

No `from __future__ import annotations` here: the CLI builder reads the real types.
"""

import dataclasses
from typing import Any, Dict, Optional

import sglang.srt.server_args.choices as C
from sglang.srt.server_args.fields import arg, json_dict

_ONE_DEVICE = "one device per server: no tensor/data/pipeline/expert parallelism"
_NO_HICACHE = "HiCache storage tiers are not implemented (only the host pool of decode retraction backups)"
_NO_GRAPHS = "no CUDA graphs or torch.compile"


@dataclasses.dataclass
class NoEffectFields:
    # --- from upstream's model fields
    revision: Optional[str] = arg(None, "The specific model version to use (branch name, tag name, or commit id).",
        no_effect="no model hub: --model-path is a local folder",
    )
    json_model_override_args: str = arg("{}", "A dictionary in JSON string format used to override default model configurations.",
        no_effect="config.json is read as is",
    )
    # --- from upstream's serving fields
    tokenizer_worker_num: int = arg(1, "The worker num of the tokenizer manager.",
        no_effect="one tokenizer process",
    )
    file_storage_path: Optional[str] = arg(None, "The path of the file storage in backend.",
        no_effect="no file API",
    )
    enable_streaming_session: bool = arg(False, "Enable streaming sessions (incremental multi-turn requests on one KV).",
        no_effect="no sessions API",
    )
    sleep_on_idle: bool = arg(False, "Reduce CPU usage when sglang is idle.",
        no_effect="the scheduler always sleeps on its socket when idle",
    )
    constrained_json_whitespace_pattern: Optional[str] = arg(
        None, "(outlines backend only) Regex pattern for syntactic whitespaces allowed in JSON constrained output.",
        no_effect="outlines only; xgrammar has --constrained-json-max-whitespace-cnt",
    )
    # --- from upstream's observability fields
    show_time_cost: bool = arg(False, "Show time cost of custom marks.",
        no_effect="no per-stage timers",
    )
    # --- from upstream's schedule fields
    disable_priority_preemption: bool = arg(False, "With priority scheduling, never preempt running requests for higher-priority ones.",
        no_effect="priority scheduling orders the queue but never preempts",
    )
    priority_scheduling_preemption_threshold: int = arg(10, "Minimum difference in priorities for an incoming request to preempt running request(s).",
        no_effect="priority scheduling never preempts",
    )
    swa_prefix_tails: Optional[int] = arg(None, "Number of SWA prefix tail tokens kept per cached prefix.",
        no_effect="SWA prefix tails are not kept",
    )
    disable_overlap_schedule: bool = arg(False, "Disable the overlap scheduler, which overlaps the CPU scheduler with GPU model worker.",
        no_effect="there is no overlap scheduler (always off)",
    )
    num_continuous_decode_steps: int = arg(1, "Run multiple continuous decoding steps to reduce scheduling overhead.",
        no_effect="one decode step per scheduler iteration",
    )
    # --- from upstream's memory fields
    radix_eviction_policy_config: Optional[Dict[str, Any]] = arg(
        None, "JSON options of the eviction policy, e.g. '{\"threshold\": 4096, \"next_prompt_estimate\": 512}' for tlru.",
        type_parser=json_dict,
        no_effect="validated only (tlru rules)",
    )
    hicache_host_memory_fraction: Optional[float] = arg(
        0.8, "Upper bound of the host pool as a fraction of the available host memory; must be in (0, 1].",
        no_effect=_NO_HICACHE,
    )
    hicache_write_policy: str = arg("write_through", "The write policy of hierarchical cache.", choices=C.HICACHE_WRITE_POLICY_CHOICES,
        no_effect=_NO_HICACHE,
    )
    hicache_io_backend: str = arg("kernel", "The IO backend for KV cache transfer between CPU and GPU.", choices=C.HICACHE_IO_BACKEND_CHOICES,
        no_effect=_NO_HICACHE,
    )
    hicache_mem_layout: str = arg("page_first", "The layout of host memory pool for hierarchical cache.", choices=C.HICACHE_MEM_LAYOUT_CHOICES,
        no_effect=_NO_HICACHE,
    )
    hicache_storage_backend: Optional[str] = arg(None, "The storage backend for hierarchical KV cache.", choices=C.HICACHE_STORAGE_BACKEND_CHOICES,
        no_effect=_NO_HICACHE,
    )
    hicache_storage_prefetch_policy: str = arg(
        "timeout", "Control when prefetching from the storage backend should stop.", choices=C.HICACHE_STORAGE_PREFETCH_POLICY_CHOICES,
        no_effect=_NO_HICACHE,
    )
    hicache_storage_backend_extra_config: Optional[str] = arg(None, "A JSON string (or @file) with extra config for the storage backend.",
        no_effect=_NO_HICACHE,
    )
    lmcache_config_file: Optional[str] = arg(None, "Path of the LMCache config file.",
        no_effect="LMCache is not integrated",
    )
    # --- from upstream's disagg fields
    disaggregation_decode_enable_offload_kvcache: bool = arg(False, "Enable async KV cache offloading on decode server (PD mode).",
        no_effect=_NO_HICACHE,
    )
    disaggregation_decode_extra_slots: Optional[int] = arg(None, "Extra request slots preallocated on the decode server.",
        no_effect="pre-allocation is bounded by --max-running-requests",
    )
    disaggregation_decode_polling_interval: int = arg(
        1, "The interval to poll requests in decode server. Can be set to >1 to reduce the overhead of this.",
        no_effect="the decode queues are polled every step",
    )
    disaggregation_enable_kv_checksum: bool = arg(False, "Verify transferred KV pages with an Adler-32 checksum.",
        no_effect="no KV checksums",
    )
    # --- from upstream's parallel fields
    pp_size: int = arg(1, "The pipeline parallelism size.", aliases=("--pipeline-parallel-size",),
        no_effect=_ONE_DEVICE,
    )
    ep_size: int = arg(1, "The expert parallelism size.", aliases=("--expert-parallel-size", "--ep"),
        no_effect=_ONE_DEVICE,
    )
    attn_dp_size: int = arg(1, "The attention data parallelism size.", aliases=("--attention-data-parallel-size",),
        no_effect=_ONE_DEVICE,
    )
    attn_cp_size: int = arg(1, "The attention context parallelism size.", aliases=("--attention-context-parallel-size",),
        no_effect=_ONE_DEVICE,
    )
    dcp_size: int = arg(1, "The decode context parallelism size.", aliases=("--decode-context-parallel-size",),
        no_effect=_ONE_DEVICE,
    )
    # --- from upstream's device fields
    base_gpu_id: int = arg(0, "The base GPU ID to start allocating GPUs from.",
        no_effect=_ONE_DEVICE,
    )
    gpu_id_step: int = arg(1, "The delta between consecutive GPU IDs that are used.",
        no_effect=_ONE_DEVICE,
    )
    # --- from upstream's exec fields
    prefill_attention_backend: Optional[str] = arg(
        None, "Choose the kernels for prefill attention layers (have priority over --attention-backend).", choices=C.ATTENTION_BACKEND_CHOICES,
        no_effect="one attention backend serves prefill and decode (--attention-backend)",
    )
    decode_attention_backend: Optional[str] = arg(
        None, "Choose the kernels for decode attention layers (have priority over --attention-backend).", choices=C.ATTENTION_BACKEND_CHOICES,
        no_effect="one attention backend serves prefill and decode (--attention-backend)",
    )
    sampling_backend: Optional[str] = arg(
        None, "Choose the kernels for sampling layers. Fork default: pytorch.", choices=C.SAMPLING_BACKEND_CHOICES,
        no_effect="the PyTorch sampler",
    )
    triton_attention_reduce_in_fp32: bool = arg(False, "Cast the intermediate attention results to fp32 (triton backend).",
        no_effect="the Triton kernels always reduce in fp32",
    )
    disable_cuda_graph: bool = arg(False, "Disable cuda graph (deprecated upstream spelling; a no-op on CPU).",
        no_effect=_NO_GRAPHS,
    )
    enable_torch_compile: bool = arg(False, "Optimize the model with torch.compile. Experimental feature.",
        no_effect=_NO_GRAPHS,
    )


NO_EFFECT_FIELDS = {f.name: f.metadata["no_effect"] for f in dataclasses.fields(NoEffectFields)}
