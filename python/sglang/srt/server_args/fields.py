"""The fields of `ServerArgs`, grouped like upstream's `arg_groups/fields/*.py` namespaces.

Each group is a plain dataclass; `ServerArgs` inherits all of them, so a field is declared once
with its default, its CLI help, choices and aliases (in `metadata`), and the CLI parser is built
from these declarations (`cli.add_cli_args_from_fields`). Flag name = `--` + field
name with `_` -> `-`. Upstream field names, defaults and choices are kept; fork-only differences
are said in the help text. Every field here acts; the upstream fields that are accepted but change
nothing in this server live apart, in `compat/no_effect_fields.py`.

No `from __future__ import annotations` here: the CLI builder reads the real types.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional

import sglang.srt.server_args.choices as C
from sglang.srt.utils import human_readable_int

_NO_FALLBACK = object()


def json_dict(value: str) -> Dict[str, Any]:
    import json

    return json.loads(value)


def arg(
    default: Any,
    help: str,
    *,
    choices: Optional[List[Any]] = None,
    aliases: tuple = (),
    type_parser: Optional[Callable[[str], Any]] = None,
    no_cli: bool = False,
    fallback: Any = _NO_FALLBACK,
    nargs: Optional[str] = None,
    no_effect: Optional[str] = None,
):
    """A dataclass field with the CLI metadata upstream keeps in `Arg(...)`.

    `fallback` is the value a field takes when neither the user nor any resolution rule gave
    one (upstream `Arg(fallback=...)`, e.g. `swa_full_tokens_ratio` 0.8). `no_effect` is the
    reason an upstream field is accepted but changes nothing here; such fields are declared only in
    `compat/no_effect_fields.py`, apart from the fields that act.
    """
    metadata = {
        "help": help,
        "choices": choices,
        "aliases": tuple(aliases),
        "type_parser": type_parser,
        "no_cli": no_cli,
        "nargs": nargs,
    }
    if no_effect is not None:
        metadata["no_effect"] = no_effect
    if fallback is not _NO_FALLBACK:
        metadata["fallback"] = fallback
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass
class ModelFields:
    model_path: str = arg(
        "default",
        "The path of the model weights. This can be a local folder or a Hugging Face repo ID. "
        "Fork: optional; 'default' serves the packaged SmolLM2-135M-Instruct.",
        aliases=("--model",),
    )
    tokenizer_path: Optional[str] = arg(None, "The path of the tokenizer. Defaults to --model-path.")
    tokenizer_mode: str = arg(
        "auto",
        "Tokenizer mode. 'auto' uses the fast tokenizer if available, 'slow' always uses the slow tokenizer.",
        choices=C.TOKENIZER_MODE_CHOICES,
    )
    skip_tokenizer_init: bool = arg(
        False, "If set, skip init tokenizer and pass input_ids in generate request."
    )
    load_format: str = arg(
        "auto",
        "The format of the model weights to load. 'dummy' initializes the weights randomly (for profiling). "
        "Fork: auto (a GGUF file as --model-path is read as GGUF, a folder as safetensors), safetensors and "
        "gguf act; the others are refused.",
        choices=C.LOAD_FORMAT_CHOICES,
    )
    trust_remote_code: bool = arg(False, "Whether or not to allow custom models defined on the Hub in their own modeling files.")
    context_length: Optional[int] = arg(
        None,
        "The model's maximum context length. Defaults to None (will use the value from the model's config.json instead).",
        type_parser=human_readable_int,
    )
    is_embedding: bool = arg(False, "Whether to use a CausalLM as an embedding model.")
    dtype: str = arg(
        "auto",
        "Data type for model weights and activations. 'auto' uses FP16 for FP32 and FP16 models, "
        "and BF16 for BF16 models; 'half'/'float16', 'bfloat16', 'float'/'float32'.",
        choices=C.DTYPE_CHOICES,
    )
    kv_cache_dtype: str = arg(
        "auto",
        "Data type for kv cache storage. 'auto' will use model data type.",
        choices=C.KV_CACHE_DTYPE_CHOICES,
    )
    quantization: Optional[str] = arg(
        None,
        "The quantization method. Fork: w8a16_int8 (CPU, needs sgl-kernel): linear weights become int8 with "
        "per-output-channel scales computed at load time from the checkpoint's weights; activations stay in "
        "--dtype and the kernel dequantizes in registers.",
        choices=C.QUANTIZATION_CHOICES,
    )
    served_model_name: Optional[str] = arg(
        None, "Override the model name returned by the v1/models endpoint in OpenAI API server. Defaults to --model-path."
    )
    chat_template: Optional[str] = arg(None, "The builtin chat template name or the path of the chat template file.")


@dataclasses.dataclass
class ServingFields:
    host: str = arg("127.0.0.1", "The host of the HTTP server.")
    port: int = arg(30000, "The port of the HTTP server.")
    api_key: Optional[str] = arg(
        None,
        "Set API key of the server. It is also used in the OpenAI API compatible server. Fork: also read from "
        "SGLANG_API_KEY when the flag is not given (so that the key need not appear in the process list).",
    )
    admin_api_key: Optional[str] = arg(
        None,
        "Set admin API key for administrative/control endpoints (e.g., weights update, cache flush, abort). "
        "Endpoints marked as admin-only require Authorization: Bearer <admin_api_key> when this is set. Fork: "
        "also read from SGLANG_ADMIN_API_KEY; it is also needed for custom_logit_processor requests.",
    )
    allowed_origins: Optional[List[str]] = arg(
        None,
        "Fork: the browser origins (scheme://host[:port]) allowed to call the API cross-origin (CORS). Default: "
        "none, so a web page on another site cannot call the server; '*' allows every origin.",
    )
    allowed_hosts: Optional[List[str]] = arg(
        None,
        "Fork: Host header names the server answers besides localhost, 127.0.0.1, ::1 and --host (against DNS "
        "rebinding); other Host headers get a 400. With a wildcard --host (0.0.0.0, ::) every Host is allowed "
        "unless this is given; '*' allows every Host.",
    )
    skip_server_warmup: bool = arg(False, "If set, skip warmup.")
    stream_interval: int = arg(
        1, "The interval (or buffer size) for streaming in terms of the token length. A smaller value makes streaming smoother."
    )
    enable_cache_report: bool = arg(
        False, "Return number of cached tokens in usage.prompt_tokens_details for each openai request."
    )
    weight_version: str = arg("default", "Version identifier for the model weights, reported in meta_info.")
    allow_auto_truncate: bool = arg(False, "Allow automatically truncating requests that exceed the maximum input length.")
    watchdog_timeout: float = arg(
        300, "Set watchdog timeout in seconds. If a forward batch takes longer than this, the server will crash to prevent hanging."
    )
    grammar_backend: Optional[str] = arg(
        None,
        "Choose the backend for grammar-guided decoding (json_schema, regex, ebnf, structural_tag). Defaults "
        "to xgrammar. Fork: outlines and llguidance are not installed; they warn at start and use xgrammar.",
        choices=C.GRAMMAR_BACKEND_CHOICES,
    )
    constrained_json_disable_any_whitespace: bool = arg(
        False, "(xgrammar backend only) Enforce compact representation in JSON constrained output."
    )
    constrained_json_max_whitespace_cnt: Optional[int] = arg(
        None, "(xgrammar backend only) Maximum number of consecutive whitespace characters allowed in JSON constrained output."
    )
    tool_call_parser: Optional[str] = arg(
        None,
        "Specify the parser for handling tool-call interactions. 'auto' picks one from the model's architecture.",
        choices=C.TOOL_CALL_PARSER_CHOICES,
    )
    reasoning_parser: Optional[str] = arg(
        None,
        "Specify the parser for reasoning models (splits <think> sections into reasoning_content). 'auto' picks "
        "one from the model's architecture.",
        choices=C.REASONING_PARSER_CHOICES,
    )
    enable_custom_logit_processor: bool = arg(
        False,
        "Enable users to pass custom logit processors to the server (disabled by default for security).",
    )
    trust_request_chat_template: bool = arg(
        False,
        "Accept a chat template sent in a request's chat_template_kwargs (refused with a 400 by default: a "
        "template is code the server runs, and a client's can run for as long as it likes).",
    )


@dataclasses.dataclass
class ObservabilityFields:
    log_level: str = arg("info", "The logging level of all loggers.")
    log_level_http: Optional[str] = arg(None, "The logging level of HTTP server. If not set, reuse --log-level by default.")
    log_requests: bool = arg(False, "Log metadata, inputs, outputs of all requests.")
    log_requests_level: int = arg(
        2, "0: metadata. 1: metadata and sampling params. 2: and partial input/output. 3: every input/output.",
        choices=C.LOG_REQUESTS_LEVEL_CHOICES,
    )
    enable_metrics: bool = arg(False, "Enable log prometheus metrics (serves /metrics).")
    decode_log_interval: int = arg(40, "The log interval of decode batch.")


@dataclasses.dataclass
class ScheduleFields:
    mem_fraction_static: Optional[float] = arg(
        None,
        "The fraction of the memory used for static allocation (model weights and KV cache memory pool). "
        "Use a smaller value if you see out-of-memory errors. Fork, on --device cpu: the fraction of the "
        "host memory available at start that the KV cache pool may take (default 0.8).",
    )
    max_running_requests: Optional[int] = arg(None, "The maximum number of running requests.")
    max_queued_requests: Optional[int] = arg(None, "The maximum number of queued requests. Ignored with PD disaggregation.")
    max_total_tokens: Optional[int] = arg(
        None,
        "The maximum number of tokens in the memory pool. If not specified, it will be automatically calculated "
        "based on the memory usage fraction. This option is typically used for development and debugging purposes.",
        type_parser=human_readable_int,
    )
    chunked_prefill_size: Optional[int] = arg(
        None,
        "The maximum number of tokens in a chunk for the chunked prefill. Setting this to -1 means disabling chunked prefill.",
    )
    max_prefill_tokens: int = arg(
        16384,
        "The maximum number of tokens in a prefill batch. The real bound will be the maximum of this value and the model's maximum context length.",
        type_parser=human_readable_int,
    )
    schedule_policy: str = arg("fcfs", "The scheduling policy of the requests.", choices=C.SCHEDULE_POLICY_CHOICES)
    enable_priority_scheduling: bool = arg(False, "Enable priority scheduling. Requests with higher priority integer values will be scheduled first by default.")
    default_priority_value: Optional[int] = arg(None, "Default priority for requests without a priority.")
    abort_on_priority_when_disabled: bool = arg(False, "Abort requests that specify a priority when priority scheduling is disabled.")
    schedule_low_priority_values_first: bool = arg(False, "If specified with --enable-priority-scheduling, the scheduler will schedule requests with lower priority integer values first.")
    retraction_policy: str = arg(
        "length", "Which decode requests are retracted first when the KV pool is full.", choices=C.RETRACTION_POLICY_CHOICES
    )
    schedule_conservativeness: float = arg(
        1.0, "How conservative the schedule policy is. A larger value means more conservative scheduling."
    )
    page_size: Optional[int] = arg(None, "The number of tokens in a page. Defaults to 1.")
    swa_full_tokens_ratio: Optional[float] = arg(
        None,
        "The ratio of SWA layer KV tokens / full layer KV tokens, regardless of the number of swa:full layers. It should be between 0 and 1. Defaults to 0.8.",
        fallback=0.8,
    )
    _swa_full_tokens_ratio_explicitly_set: Optional[bool] = arg(None, "Whether --swa-full-tokens-ratio was given.", no_cli=True)
    disable_hybrid_swa_memory: bool = arg(False, "Disable the hybrid SWA memory pool (size SWA layers like full layers).")
    enable_mixed_chunk: bool = arg(False, "Enabling mixing prefill and decode in a batch when using chunked prefill.")
    max_mamba_cache_size: Optional[int] = arg(None, "The maximum size of the mamba cache.")
    mamba_full_memory_ratio: Optional[float] = arg(
        None, "The ratio of mamba state memory to full kv cache memory. Defaults to 0.9.", fallback=0.9
    )
    mamba_ssm_dtype: Optional[str] = arg(
        None, "The data type of the SSM states in mamba cache.", choices=C.MAMBA_SSM_DTYPE_CHOICES
    )


@dataclasses.dataclass
class MemoryFields:
    radix_eviction_policy: str = arg("lru", "The eviction policy of radix trees.", choices=C.RADIX_EVICTION_POLICY_CHOICES)
    _radix_eviction_policy_explicitly_set: bool = arg(False, "Whether --radix-eviction-policy was given.", no_cli=True)
    disable_radix_cache: bool = arg(False, "Disable RadixAttention for prefix caching.")
    enable_session_radix_cache: bool = arg(False, "Enable the session-aware radix cache.")
    radix_cache_backend: Optional[str] = arg(None, "Name of a registered radix cache backend to use instead of the default.")
    enable_hierarchical_cache: bool = arg(False, "Enable hierarchical cache", aliases=("--enable-hicache",))
    hicache_host_memory_mode: str = arg(
        "cache", "Host memory mode of the hierarchical cache.", choices=C.HICACHE_HOST_MEMORY_MODE_CHOICES
    )
    hicache_ratio: Optional[float] = arg(
        None,
        "The ratio of the size of host KV cache memory pool to the size of device pool. "
        "Defaults to 2.0 in cache mode, 1.2 in buffer_only mode, or 0.2 for backup-only host-pool decode retraction.",
    )
    hicache_size: int = arg(0, "The size of host KV cache memory pool in gigabytes, which will override the hicache_ratio if set.")
    enable_unified_cache_external_linker: bool = arg(False, "Link the unified radix cache to an external KV store.")
    enable_lmcache: bool = arg(False, "Use LMCache as an alternative hierarchical cache solution.")


@dataclasses.dataclass
class DisaggFields:
    disaggregation_mode: str = arg(
        "null",
        "Only used for PD disaggregation. 'prefill' for prefill-only server, and 'decode' for decode-only server. "
        "If not specified, it is not PD disaggregated.",
        choices=C.DISAGG_MODE_CHOICES,
    )
    disaggregation_transfer_backend: str = arg(
        "mooncake",
        "The backend for disaggregation transfer. 'mooncake_tcp' is 'mooncake' forced onto TCP (MC_FORCE_TCP=1); "
        "'fake' sends nothing (decode-side benchmarking).",
        choices=C.DISAGG_TRANSFER_BACKEND_CHOICES,
    )
    disaggregation_bootstrap_port: int = arg(8998, "Bootstrap server port on the prefill server.")
    disaggregation_ib_device: Optional[str] = arg(
        None,
        "The InfiniBand devices for disaggregation transfer: a single device, a comma list, a JSON object "
        "mapping GPU ids to devices, or the path of such a JSON file.",
    )
    disaggregation_decode_retraction_backup: Optional[str] = arg(
        None,
        "Storage backend for KV preserved across PD decode retraction. 'cpu_tensor' uses per-request CPU tensors. "
        "'host_pool' uses a reserved HiCache pool and does not fall back on exhaustion. 'none' keeps no backup: "
        "a retracted request is aborted with 503 for the client to retry. If omitted, the backend is inferred "
        "from the decode KV pool.",
        choices=C.DECODE_RETRACTION_BACKUP_CHOICES,
    )
    enable_mamba_host_pool_backup: bool = arg(
        False,
        "Fork (beyond upstream): let --disaggregation-decode-retraction-backup host_pool back up hybrid SSM "
        "(Mamba) models: a retracted request's Mamba state goes to a host state pool beside its KV pages. "
        "Without it such models keep upstream's error.",
    )
    mamba_host_pool_slots: Optional[int] = arg(
        None,
        "Fork: slots of the host Mamba-state pool for host_pool retraction backups. Default: one per page the "
        "host KV pool holds, at most the device Mamba pool's slot count.",
    )
    disaggregation_decode_enable_radix_cache: bool = arg(
        False, "Enable the radix cache on the decode server (experimental; the decode server disables it by default)."
    )
    disaggregation_decode_host_receive_threshold: float = arg(
        1.0, "Pool usage above which new transfers land in the decode host pool; in [0, 1]; below 1 requires host_pool retraction."
    )
    disaggregation_decode_allocation_policy: str = arg(
        "early", "When the decode server allocates KV for an incoming transfer.", choices=C.DECODE_ALLOCATION_POLICY_CHOICES
    )
    num_reserved_decode_tokens: int = arg(512, "Number of decode tokens that will have memory reserved when adding new request to the running batch.")
    optimistic_prefill_attempts: int = arg(
        0, "Number of optimistic prefill attempts (prefill_complete allocation policy). Here any value > 0 lets a prefill "
        "server compute a prompt before the decode server's KV slots arrive (the KV is kept, not recomputed)."
    )


@dataclasses.dataclass
class ParallelFields:
    # Tensor parallelism and multi-node (docs/parallelism.md; managers/tp_group_worker.py).
    tp_size: int = arg(1, "The tensor parallelism size.", aliases=("--tensor-parallel-size",))
    nnodes: int = arg(1, "The number of nodes.")
    node_rank: int = arg(0, "The node rank.")
    dist_init_addr: Optional[str] = arg(
        None, "The host address for initializing distributed backend (e.g., `192.168.0.2:25000`).", aliases=("--nccl-init-addr",)
    )
    dist_timeout: Optional[int] = arg(None, "Set timeout for torch.distributed initialization.")
    nccl_port: Optional[int] = arg(None, "The port for NCCL distributed environment setup. Defaults to a random port.")
    dp_size: int = arg(
        1, "The data parallelism size: scheduler replicas (each its own process, model copy, pools and cache, "
        "and on CPU its own cores) behind one HTTP/tokenizer front.", aliases=("--data-parallel-size",),
    )
    load_balance_method: str = arg(
        "auto",
        "The load balancing strategy for data parallelism. 'auto' picks follow_bootstrap_room on a PD prefill server, "
        "else round_robin; total_requests sends each request to the replica with the shortest queue, total_tokens to "
        "the one with the fewest tokens queued. A PD prefill server with --dp-size > 1 needs follow_bootstrap_room.",
        choices=C.LOAD_BALANCE_METHOD_CHOICES,
    )


@dataclasses.dataclass
class SpeculativeFields:
    speculative_algorithm: Optional[str] = arg(
        None,
        "Speculative algorithm: NGRAM (drafts from the request's own tokens). Upstream's STANDALONE, EAGLE "
        "and EAGLE3 (and NEXTN, an alias of EAGLE) are refused at start: this server does not run them yet.",
    )
    speculative_draft_model_path: Optional[str] = arg(
        None, "The path of the draft model weights (STANDALONE/EAGLE; refused here).",
        aliases=("--speculative-draft-model",),
    )
    speculative_num_steps: Optional[int] = arg(
        None, "The number of steps sampled from draft model in Speculative Decoding. NGRAM: num_draft_tokens // topk.")
    speculative_eagle_topk: Optional[int] = arg(
        None, "The number of tokens sampled from the draft model in eagle2 each step. NGRAM sets it to "
              "--speculative-ngram-max-bfs-breadth, as upstream; this server verifies one chain per request.")
    speculative_num_draft_tokens: Optional[int] = arg(
        None, "The number of tokens verified per request and step: the next token plus up to this many minus "
              "one drafted ones (NGRAM default 12).")
    speculative_ngram_min_bfs_breadth: int = arg(
        1, "The minimum breadth for BFS (Breadth-First Search) in ngram speculative decoding (one chain here).")
    speculative_ngram_max_bfs_breadth: int = arg(
        10, "The maximum breadth for BFS (Breadth-First Search) in ngram speculative decoding (one chain here).")
    speculative_ngram_match_type: str = arg(
        "BFS", "The match type for cache tree (one chain from the latest match here, whichever is chosen).",
        choices=["BFS", "PROB"])
    speculative_ngram_max_trie_depth: int = arg(
        18, "The max trie depth for ngram speculative decoding: the longest match plus draft considered.")
    speculative_ngram_capacity: int = arg(
        10 * 1000 * 1000, "The cache capacity for ngram speculative decoding (per-request indexes here: unused).")
    speculative_ngram_external_corpus_path: Optional[str] = arg(
        None, "Path to an external corpus for ngram speculative decoding (refused here).")
    speculative_ngram_external_sam_budget: int = arg(
        0, "Draft tokens reserved for the external corpus suffix automaton (with --speculative-ngram-external-corpus-path).")
    speculative_ngram_external_corpus_max_tokens: int = arg(
        10000000, "Maximum tokens loaded from the external ngram corpus.")


@dataclasses.dataclass
class DeviceFields:
    device: Optional[str] = arg(None, "The device to use ('cuda', 'cpu', ...). Defaults to cuda if available, else cpu.")
    random_seed: Optional[int] = arg(None, "The random seed. Defaults to a random value.")


@dataclasses.dataclass
class ExecFields:
    attention_backend: Optional[str] = arg(
        None,
        "Choose the kernels for attention layers. Fork defaults: torch_native on --device cpu, triton on cuda.",
        choices=C.ATTENTION_BACKEND_CHOICES,
    )
    triton_attention_num_kv_splits: int = arg(8, "The number of KV splits in flash decoding Triton kernel.")
    enable_fp32_lm_head: bool = arg(False, "If set, the LM head outputs (logits) are in FP32: the LM head's sums "
                                           "in fp32, not rounded to the model dtype first.")
