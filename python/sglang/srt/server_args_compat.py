"""Flags accepted for compatibility with upstream SGLang that have no effect in this server.

Two kinds, both reported in one warning at start when the user set them (to anything but their
default), and listed in `docs/server_args.md`:

* `NO_EFFECT_FIELDS`: `ServerArgs` fields that are parsed and validated with upstream's rules
  but change nothing here (multi-device parallelism, CUDA graphs, HiCache storage tiers, ...),
  each with the reason;
* `UPSTREAM_ONLY_FLAGS` (`server_args_upstream_flags.py`): upstream flags this fork has no field
  for; the parser accepts them with their upstream argument shape so that upstream launch
  commands and tests start.

Every other field does what its help says; `test/srt/test_server_args_compat.py` walks every
field and fails if one is neither read by the server nor listed here. Importing this is cheap.
"""

from __future__ import annotations

import logging
from typing import List

logger = logging.getLogger(__name__)

NO_EFFECT_WARNING = "accepted for compatibility, has no effect here"

_ONE_DEVICE = "one device per server: no tensor/data/pipeline/expert parallelism"
_NO_HICACHE = "HiCache storage tiers are not implemented (only the host pool of decode retraction backups)"
_NO_GRAPHS = "no CUDA graphs or torch.compile"

NO_EFFECT_FIELDS = {
    "load_format": "weights always load from safetensors (or the packaged default model)",
    "revision": "no model hub: --model-path is a local folder",
    "json_model_override_args": "config.json is read as is",
    "tokenizer_worker_num": "one tokenizer process",
    "file_storage_path": "no file API",
    "enable_streaming_session": "no sessions API",
    "sleep_on_idle": "the scheduler always sleeps on its socket when idle",
    "constrained_json_whitespace_pattern": "outlines only; xgrammar has --constrained-json-max-whitespace-cnt",
    "show_time_cost": "no per-stage timers",
    "disable_priority_preemption": "priority scheduling orders the queue but never preempts",
    "priority_scheduling_preemption_threshold": "priority scheduling never preempts",
    "swa_prefix_tails": "SWA prefix tails are not kept",
    "disable_overlap_schedule": "there is no overlap scheduler (always off)",
    "num_continuous_decode_steps": "one decode step per scheduler iteration",
    "radix_eviction_policy_config": "validated only (tlru rules)",
    "hicache_host_memory_fraction": _NO_HICACHE,
    "hicache_write_policy": _NO_HICACHE,
    "hicache_io_backend": _NO_HICACHE,
    "hicache_mem_layout": _NO_HICACHE,
    "hicache_storage_backend": _NO_HICACHE,
    "hicache_storage_prefetch_policy": _NO_HICACHE,
    "hicache_storage_backend_extra_config": _NO_HICACHE,
    "lmcache_config_file": "LMCache is not integrated",
    "disaggregation_decode_enable_offload_kvcache": _NO_HICACHE,
    "disaggregation_decode_extra_slots": "pre-allocation is bounded by --max-running-requests",
    "disaggregation_decode_polling_interval": "the decode queues are polled every step",
    "disaggregation_enable_kv_checksum": "no KV checksums",
    "tp_size": _ONE_DEVICE,
    "dp_size": _ONE_DEVICE,
    "pp_size": _ONE_DEVICE,
    "ep_size": _ONE_DEVICE,
    "attn_dp_size": _ONE_DEVICE,
    "attn_cp_size": _ONE_DEVICE,
    "dcp_size": _ONE_DEVICE,
    "nnodes": _ONE_DEVICE,
    "node_rank": _ONE_DEVICE,
    "dist_init_addr": _ONE_DEVICE,
    "dist_timeout": _ONE_DEVICE,
    "nccl_port": _ONE_DEVICE,
    "base_gpu_id": _ONE_DEVICE,
    "gpu_id_step": _ONE_DEVICE,
    "prefill_attention_backend": "one attention backend serves prefill and decode (--attention-backend)",
    "decode_attention_backend": "one attention backend serves prefill and decode (--attention-backend)",
    "sampling_backend": "the PyTorch sampler",
    "triton_attention_reduce_in_fp32": "the Triton kernels always reduce in fp32",
    "disable_cuda_graph": _NO_GRAPHS,
    "enable_torch_compile": _NO_GRAPHS,
}


def no_effect_settings(server_args) -> List[str]:
    """The flags the user set that do nothing here, as `--flag` names (sorted)."""
    import dataclasses

    from sglang.srt.server_args_cli import flag_name

    out = []
    defaults = {f.name: f.default for f in dataclasses.fields(server_args)}
    raw = server_args.raw_input()
    for name in NO_EFFECT_FIELDS:
        if name in raw and raw[name] != defaults.get(name):
            out.append(flag_name(name))
    for name in server_args.ignored_upstream_args:
        out.append(flag_name(name))
    return sorted(out)


def warn_no_effect_flags(server_args) -> None:
    flags = no_effect_settings(server_args)
    if flags:
        logger.warning("%s: %s (see docs/server_args.md)", NO_EFFECT_WARNING, ", ".join(flags))
