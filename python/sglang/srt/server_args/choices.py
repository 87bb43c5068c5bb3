"""Choice lists of the CLI flags, with upstream SGLang's (0.5.23) names.

Kept in one place so that flag definitions, validations and other modules (e.g. the attention
backend registry) agree on the spelling. Upstream has `add_*_choices()` hooks for plugins; a
fork module that registers a backend appends to these lists before the parser is built.
"""

ATTENTION_BACKEND_CHOICES = [
    "triton",
    "torch_native",
    "flex_attention",
    "dsa",
    "nsa",
    "qsa",
    "dsv4",
    "compressed",
    "fa3",
    "fa4",
    "flashinfer",
    "llada2_cfg_flashinfer",
    "flashmla",
    "trtllm_mla",
    "cutedsl_mla",
    "tokenspeed_mla",
    "trtllm_mha",
    "hpc_ops",
    "minicpm_flashattn",
    "minicpm_flashinfer",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "intel_xpu",
]

SAMPLING_BACKEND_CHOICES = ["flashinfer", "pytorch", "ascend"]

# `mooncake_tcp` is an input-only spelling: resolution rewrites it to `mooncake` + MC_FORCE_TCP=1.
DISAGG_TRANSFER_BACKEND_CHOICES = ["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"]

DISAGG_MODE_CHOICES = ["null", "prefill", "decode"]

# Fork: weight-only int8 for CPU (upstream has no weight-only int8 method for dense checkpoints; its
# w8a8_int8 also quantizes activations). Upstream's other methods are refused at the parser.
QUANTIZATION_CHOICES = ["w8a16_int8"]

DECODE_RETRACTION_BACKUP_CHOICES = ["cpu_tensor", "host_pool", "none"]

DECODE_ALLOCATION_POLICY_CHOICES = ["early", "prefill_complete"]

RADIX_EVICTION_POLICY_CHOICES = ["lru", "lfu", "slru", "priority", "tlru"]

SCHEDULE_POLICY_CHOICES = [
    "lpm",
    "random",
    "fcfs",
    "dfs-weight",
    "lof",
    "priority",
    "routing-key",
    "hrrn",
    "shortest-prefill-first",
]

RETRACTION_POLICY_CHOICES = ["length", "priority"]

DTYPE_CHOICES = ["auto", "half", "float16", "bfloat16", "float", "float32"]

KV_CACHE_DTYPE_CHOICES = ["auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"]

LOAD_FORMAT_CHOICES = [
    "auto",
    "pt",
    "safetensors",
    "npcache",
    "dummy",
    "sharded_state",
    "gguf",
    "bitsandbytes",
    "layered",
    "remote",
    "remote_instance",
]

TOKENIZER_MODE_CHOICES = ["auto", "slow"]

LOAD_BALANCE_METHOD_CHOICES = ["auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens"]

HICACHE_HOST_MEMORY_MODE_CHOICES = ["cache", "buffer_only"]
HICACHE_WRITE_POLICY_CHOICES = ["write_back", "write_through", "write_through_selective"]
HICACHE_IO_BACKEND_CHOICES = ["direct", "kernel", "kernel_ascend"]
HICACHE_MEM_LAYOUT_CHOICES = ["layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"]
HICACHE_STORAGE_BACKEND_CHOICES = [
    "file",
    "sim",
    "mooncake",
    "npu_memcache",
    "hf3fs",
    "nixl",
    "aibrix",
    "dynamic",
    "eic",
    "simm",
    "mori",
    "shm",
    "tensorcast",
    "seaweedfs",
]
HICACHE_STORAGE_PREFETCH_POLICY_CHOICES = ["best_effort", "wait_complete", "timeout"]

MAMBA_SSM_DTYPE_CHOICES = ["float32", "bfloat16", "float16"]

LOG_REQUESTS_LEVEL_CHOICES = [0, 1, 2, 3]

GRAMMAR_BACKEND_CHOICES = ["xgrammar", "outlines", "llguidance", "none"]
# Upstream: ["auto"] + the parsers it has; these are the ones this fork implements.
TOOL_CALL_PARSER_CHOICES = ["auto", "qwen25", "qwen", "hermes", "llama3", "pythonic", "mistral"]
REASONING_PARSER_CHOICES = ["auto", "deepseek-r1", "qwen3", "qwen3-thinking"]
