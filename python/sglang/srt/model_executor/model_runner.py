"""(Scheduler process.) Owns the model and its attention backend; runs one forward per call.

    runner = ModelRunner(model_config, server_args, build_memory=False)  # loads the weights
    memory = build_memory(runner.memory_spec(), ...)  # the scheduler builds (and owns) memory ...
    runner.attach_memory(memory)  # ... and hands the pools to the runner
    out = runner.forward(forward_batch)                               # -> LogitsProcessorOutput

With `build_memory=True` (the default, for tests and tools) the runner builds the pools itself
with the same call (no radix tree). Settings come from the `RunnerConfig` / `MemoryConfig` slices of
`server_args` (defaults without one); any keyword argument overrides a field of either slice
(tests pass keywords only), e.g. page_size=16, max_total_tokens=4096, attention_backend="triton".

Memory sizing, hybrid-SWA pools and the Mamba state pool: `mem_cache/memory_manager.py`. On CPU
the linear weights get oneDNN-packed copies after loading (`linear.pack_linear_weights`),
unless the copies would take over half of the available memory; `SGLANG_CPU_PACK_WEIGHTS=0`
keeps plain `F.linear`. Under tensor parallelism (the process joined its group first, see
managers/tp_worker.py) the model loads this rank's shards and `model_config` holds this rank's
heads, which size its KV pool and attention backend.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
from typing import Any, Optional

import torch

from sglang.srt.configs.gguf_file import is_gguf_file
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.runtime_config import MemoryConfig, RunnerConfig
from sglang.srt.distributed.parallel_state import get_tp_size
from sglang.srt.layers.attention.base_attn_backend import AttentionInputs
from sglang.srt.layers.attention.registry import create_attention_backend
from sglang.srt.layers import cpu_ops, quantization
from sglang.srt.layers.linear import cpu_linear_modules, is_panel_weight, pack_linear_weights, weights_into_huge_pages
from sglang.srt.layers.linear_crossover import measure_panel_rows, measure_small_m_rows
from sglang.srt.layers.moe import pack_expert_weights
from sglang.srt.layers.pooler import read_pooling_config
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.mem_cache.memory_manager import (
    MemoryManager,
    ModelMemorySpec,
    available_memory_bytes,
    build_memory as build_memory_for,
    mamba_layout_of,
)
from sglang.srt.utils.host_memory import return_freed_memory
from sglang.srt.model_loader.loader import get_model, load_hf_config, resolve_dtype

logger = logging.getLogger(__name__)

GB = 1 << 30


def _slice(cls, server_args: Any, overrides: dict):
    base = cls.from_server_args(server_args) if server_args is not None else cls()
    names = {f.name for f in dataclasses.fields(cls)}
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if k in names})


def rank_model_config(model_config: ModelConfig) -> ModelConfig:
    """The model's shape on this tensor-parallel rank: its query heads and KV heads (the model
    itself unless TP splits it; layers/linear.py QKVParallelLinear splits them the same way)."""
    tp = get_tp_size()
    if tp == 1:
        return model_config
    kv = model_config.num_key_value_heads
    return dataclasses.replace(model_config, num_attention_heads=model_config.num_attention_heads // tp,
                               num_key_value_heads=kv // tp if kv >= tp else 1)


class ModelRunner:
    def __init__(self, model_config, server_args: Any = None, build_memory: bool = True, disable_tqdm: bool = False,
                 **overrides):
        known = {f.name for cls in (RunnerConfig, MemoryConfig) for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"ModelRunner got unknown options: {unknown}")
        self.server_args = server_args
        self.config = _slice(RunnerConfig, server_args, overrides)
        self.memory_config = _slice(MemoryConfig, server_args, overrides)
        self.disable_tqdm = disable_tqdm
        context_length = self.config.context_length
        if isinstance(model_config, str):
            from sglang.srt.model_loader.default_model import resolve_model_path

            model_config = ModelConfig.from_path(resolve_model_path(model_config, self.config.load_format),
                                                context_length)
        elif context_length is not None and model_config.context_len != int(context_length):
            model_config.context_len = int(context_length)
        self.model_config: ModelConfig = model_config
        self.device = str(self.config.device or "cpu")
        self.hf_config = load_hf_config(model_config.model_path)
        # How embeddings are pooled (used by the scheduler of an --is-embedding server).
        self.pooling_config = read_pooling_config(model_config.model_path, model_config.architecture,
                                                  model_config.hf_config)
        self.dtype = resolve_dtype(self.config.dtype, self.hf_config, self.device)
        self.kv_cache_dtype = self._resolve_kv_cache_dtype(self.config.kv_cache_dtype)
        self.memory: Optional[MemoryManager] = None
        self.pools = None  # DevicePools, from attach_memory
        self.attn_backend = None
        self.load_model()
        self.model_config = rank_model_config(self.model_config)  # TP: this rank's heads size its pools
        if build_memory:
            self.attach_memory(build_memory_for(self.memory_spec(), self.memory_config))

    # ---- setup --------------------------------------------------------------------------
    def _resolve_kv_cache_dtype(self, name: Optional[str]) -> torch.dtype:
        if name in (None, "auto"):
            return self.dtype
        if name in ("bf16", "bfloat16"):
            return torch.bfloat16
        raise ValueError(f"--kv-cache-dtype {name} is not supported on this build; use auto or bfloat16")

    def load_model(self) -> None:
        before = available_memory_bytes(self.device)
        logger.info(f"Load weight begin. avail mem={before / GB:.2f} GB")
        self.model = get_model(self.model_config, self.dtype, self.device, hf_config=self.hf_config,
                               show_progress=not self.disable_tqdm)
        if self.device == "cpu":
            logger.info(cpu_ops.describe())
        if self.config.enable_fp32_lm_head:
            for module in self.model.modules():
                if isinstance(module, LogitsProcessor):
                    module.fp32_lm_head = True
        if self.config.quantization == quantization.METHOD:
            if is_gguf_file(self.model_config.model_path):
                raise ValueError(f"--quantization {quantization.METHOD} quantizes float weights; the weights of "
                                 f"{self.model_config.model_path} are GGUF-quantized already (serve it without it)")
            if self.device != "cpu" or not cpu_ops.available():
                raise ValueError(f"--quantization {quantization.METHOD} runs on CPU with sgl-kernel built; "
                                 f"here: device {self.device}, {cpu_ops.describe()}")
            n = quantization.quantize_linear_weights_int8(self.model)
            logger.info(f"{quantization.METHOD}: {n} linear weights quantized to int8 (per-channel scales)")
        if self.device == "cpu" and os.environ.get("SGLANG_CPU_PACK_WEIGHTS", "1") != "0":
            # The packed copies come on top of the weights: leave most of the memory to the KV cache.
            packed = pack_linear_weights(self.model, max_bytes=available_memory_bytes(self.device) // 2)
            mods = cpu_linear_modules(self.model)
            panels = sum(is_panel_weight(m.packed_weight) for m in mods)
            beside = sum(getattr(m, "onednn_weight", None) is not None for m in mods)
            logger.info(f"packed {packed} linear weights ({panels} in sgl_kernel panels, {beside} of them with a "
                        f"oneDNN copy too; {packed - panels} for oneDNN)" if packed else
                        "linear weights not packed (no oneDNN, or the copies would take over half of the "
                        "available memory): using F.linear")
            experts = pack_expert_weights(self.model, max_bytes=available_memory_bytes(self.device) // 2)
            if experts:
                logger.info(f"packed the experts of {experts} MoE layers in sgl_kernel panels")
        panel_rows, source = measure_panel_rows(self.model)  # first: it may drop the oneDNN copies
        if source:
            logger.info(f"sgl_kernel panels up to {panel_rows} rows, oneDNN beyond ({source})" if panel_rows is not None
                        else f"sgl_kernel panels at every row; their oneDNN copies dropped ({source})")
        rows, source = measure_small_m_rows(self.model)  # {} unless CPU with sgl-kernel and no fixed rows
        if rows:
            logger.info("sgl_kernel.linear up to " + ", ".join(
                f"{n} row{'' if n == 1 else 's'} ({str(d).split('.')[1]})" for d, n in rows.items())
                + f"; oneDNN beyond ({source})")
        if self.device == "cpu":
            moved = weights_into_huge_pages(self.model)
            if moved:
                logger.info(f"{moved / 2**20:.0f} MiB of packed weights in transparent huge pages")
        gc.collect()
        if self.device == "cpu":
            return_freed_memory()  # the weights' packed temporaries and moved copies
        after = available_memory_bytes(self.device)
        logger.info(
            f"Load weight end. type={type(self.model).__name__}, dtype={self.dtype}, "
            f"avail mem={after / GB:.2f} GB, mem usage={max(before - after, 0) / GB:.2f} GB."
        )

    def memory_spec(self) -> ModelMemorySpec:
        """What this model needs of memory (ask after loading: the KV budget is what is left)."""
        return ModelMemorySpec(self.model_config, kv_dtype=self.kv_cache_dtype, model_dtype=self.dtype,
                               device=self.device, mamba_layout=mamba_layout_of(self.model, self.hf_config))

    def attach_memory(self, memory: MemoryManager) -> None:
        """Receives the pools; the attention backend is built from them (pools and shapes only)."""
        self.memory = memory
        self.pools = pools = memory.device_pools()
        cfg = self.model_config
        inputs = AttentionInputs(device=self.device, req_to_token_pool=pools.req_to_token_pool,
                                 token_to_kv_pool=pools.token_to_kv_pool, num_heads=cfg.num_attention_heads,
                                 num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                                 max_kv_splits=self.config.triton_attention_num_kv_splits)
        # MLA pools: the triton kernels here do not read a latent pool (the backend refuses it)
        default = "torch_native" if self.device == "cpu" or cfg.is_mla else "triton"
        backend_name = self.config.attention_backend or default
        self.attention_backend_name = backend_name
        self.attn_backend = create_attention_backend(backend_name, inputs)

    def kv_bytes_per_token(self) -> int:
        return self.memory.kv_bytes_per_token()

    # ---- forward ------------------------------------------------------------------------
    def forward(self, forward_batch) -> LogitsProcessorOutput:
        pools = self.pools
        forward_batch.req_to_token_pool = pools.req_to_token_pool
        forward_batch.token_to_kv_pool = pools.token_to_kv_pool
        forward_batch.attn_backend = self.attn_backend
        forward_batch.mamba_pool = pools.mamba_pool
        if forward_batch.batch_size == 0 or forward_batch.num_tokens == 0:  # IDLE: nothing to run
            empty = torch.empty((0, self.model_config.vocab_size), dtype=torch.float32, device=self.device)
            return LogitsProcessorOutput(next_token_logits=empty,
                                         full_logits=empty if forward_batch.return_full_logits else None)
        with torch.inference_mode():
            self.attn_backend.init_forward_metadata(forward_batch)
            return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
