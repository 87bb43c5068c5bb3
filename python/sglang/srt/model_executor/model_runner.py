"""Owns the model, its KV memory and its attention backend; runs one forward per call.

    runner = ModelRunner(model_config, server_args)          # or keyword overrides
    out = runner.forward(forward_batch)                     # -> LogitsProcessorOutput

Options are read from a `ServerArgs`-like object with defaults for anything it lacks, and any
keyword argument overrides the object's value (tests pass keywords only):

  dtype="auto", kv_cache_dtype="auto", page_size=1, max_total_tokens=None,
  mem_fraction_static=None, max_running_requests=None, context_length=None,
  attention_backend=None (torch_native on CPU, triton elsewhere), device=None (cpu),
  disable_hybrid_swa_memory=False, swa_full_tokens_ratio=None (0.8).

Models mixing sliding-window and full-attention layers get a hybrid `SWAKVPool` (SWA layers in
a pool of `swa_full_tokens_ratio` x the full size) unless `--disable-hybrid-swa-memory`, or the
server is a PD role (transfer and retraction backups move one MHA pool); otherwise one
`MHATokenToKVPool` holds every layer.

KV pool size: `max_total_tokens` when given, else `mem_fraction_static` (default
CPU_DEFAULT_MEM_FRACTION) x host memory available after loading the weights (psutil) divided by
the KV bytes per token, on CPU at most `SGLANG_CPU_KV_CACHE_SPACE` GiB (default 2); rounded down to
whole pages either way.

On CPU the linear weights get oneDNN-packed copies after loading (`linear.pack_linear_weights`),
unless the copies would take over half of the available memory; `SGLANG_CPU_PACK_WEIGHTS=0` keeps
plain `F.linear`.
"""

from __future__ import annotations

import gc
import logging
import os
from typing import Any, Optional

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.attention.registry import create_attention_backend
from sglang.srt.layers.linear import pack_linear_weights
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool, SWATokenToKVPoolAllocator, swa_pool_size
from sglang.srt.model_loader.loader import get_model, load_hf_config, resolve_dtype

logger = logging.getLogger(__name__)

GB = 1 << 30
CPU_DEFAULT_MEM_FRACTION = 0.8  # matches ServerArgs' CPU default (fraction of available host memory)

_DEFAULTS = dict(
    dtype="auto",
    kv_cache_dtype="auto",
    page_size=None,
    max_total_tokens=None,
    mem_fraction_static=None,
    max_running_requests=None,
    context_length=None,
    attention_backend=None,
    device=None,
    disable_tqdm=False,
    swa_full_tokens_ratio=None,
    disable_hybrid_swa_memory=False,
)


def available_host_memory_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def _available_memory_bytes(device: str) -> int:
    if device.startswith("cuda") and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    return available_host_memory_bytes()


class _Options:
    """Attribute view over server_args with defaults and keyword overrides."""

    def __init__(self, server_args: Any, overrides: dict):
        for key, default in _DEFAULTS.items():
            val = getattr(server_args, key, default) if server_args is not None else default
            setattr(self, key, val)
        for key, val in overrides.items():
            setattr(self, key, val)


class ModelRunner:
    def __init__(self, model_config, server_args: Any = None, **overrides):
        opts = _Options(server_args, overrides)
        self.server_args = server_args
        self.options = opts
        if isinstance(model_config, str):
            from sglang.srt.model_loader.default_model import resolve_model_path

            model_config = ModelConfig.from_path(resolve_model_path(model_config), opts.context_length)
        elif opts.context_length is not None and model_config.context_len != int(opts.context_length):
            model_config.context_len = int(opts.context_length)
        self.model_config: ModelConfig = model_config
        self.device = str(opts.device or "cpu")
        self.page_size = int(opts.page_size or 1)
        self.hf_config = load_hf_config(model_config.model_path)
        self.dtype = resolve_dtype(opts.dtype, self.hf_config, self.device)
        self.kv_cache_dtype = self._resolve_kv_cache_dtype(opts.kv_cache_dtype)

        self.load_model()
        self.init_memory_pool(opts.max_total_tokens, opts.mem_fraction_static, opts.max_running_requests)
        # Mamba2 hybrids (NemotronH, Falcon-H1): per-request state slots next to the KV pool;
        # None for other models. Sizing: --max-mamba-cache-size / --mamba-ssm-dtype (mamba_pool.py).
        from sglang.srt.mem_cache.mamba_pool import init_mamba_pool_for_runner

        self.mamba_pool = init_mamba_pool_for_runner(self)
        backend_name = opts.attention_backend or ("torch_native" if self.device == "cpu" else "triton")
        self.attention_backend_name = backend_name
        self.attn_backend = create_attention_backend(backend_name, self)

    # ---- setup --------------------------------------------------------------------------
    def _resolve_kv_cache_dtype(self, name: Optional[str]) -> torch.dtype:
        if name in (None, "auto"):
            return self.dtype
        if name in ("bf16", "bfloat16"):
            return torch.bfloat16
        raise ValueError(f"--kv-cache-dtype {name} is not supported on this build; use auto or bfloat16")

    def load_model(self) -> None:
        before = _available_memory_bytes(self.device)
        logger.info(f"Load weight begin. avail mem={before / GB:.2f} GB")
        self.model = get_model(self.model_config, self.dtype, self.device, hf_config=self.hf_config,
                               show_progress=not self.options.disable_tqdm)
        if self.device == "cpu" and os.environ.get("SGLANG_CPU_PACK_WEIGHTS", "1") != "0":
            # The packed copies come on top of the weights: leave most of the memory to the KV cache.
            packed = pack_linear_weights(self.model, max_bytes=available_host_memory_bytes() // 2)
            logger.info(f"oneDNN-packed {packed} linear weights" if packed else
                        "linear weights not packed (no oneDNN, or the copies would take over half of the "
                        "available memory): using F.linear")
        gc.collect()
        after = _available_memory_bytes(self.device)
        logger.info(
            f"Load weight end. type={type(self.model).__name__}, dtype={self.dtype}, "
            f"avail mem={after / GB:.2f} GB, mem usage={max(before - after, 0) / GB:.2f} GB."
        )

    def kv_bytes_per_token(self) -> int:
        cfg = self.model_config
        elem = torch.tensor([], dtype=self.kv_cache_dtype).element_size()
        return len(cfg.attention_layer_ids) * cfg.num_key_value_heads * cfg.head_dim * 2 * elem

    def profile_max_num_token(self, mem_fraction_static: Optional[float]) -> int:
        frac = CPU_DEFAULT_MEM_FRACTION if mem_fraction_static is None else float(mem_fraction_static)
        budget = frac * _available_memory_bytes(self.device)
        if not self.device.startswith("cuda"):
            # Host RAM is shared with everything else on the machine (and with the other PD role):
            # cap the KV cache like vLLM-CPU's VLLM_CPU_KVCACHE_SPACE does.
            budget = min(budget, float(os.environ.get("SGLANG_CPU_KV_CACHE_SPACE", "2")) * (1 << 30))
        return int(budget // self.kv_bytes_per_token())

    def init_memory_pool(self, max_total_tokens: Optional[int], mem_fraction_static: Optional[float],
                         max_running_requests: Optional[int]) -> None:
        cfg = self.model_config
        if max_total_tokens is not None:
            tokens = int(max_total_tokens)
        else:
            tokens = self.profile_max_num_token(mem_fraction_static)
        tokens = tokens // self.page_size * self.page_size
        if tokens <= 0:
            raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")
        self.max_total_num_tokens = tokens

        if max_running_requests is None:
            max_running_requests = min(max(int(tokens / cfg.context_len * 512), 2048), 4096)
        self.max_running_requests = max(1, min(int(max_running_requests), tokens))

        self.req_to_token_pool = ReqToTokenPool(
            size=self.max_running_requests, max_context_len=cfg.context_len + 4, device=self.device
        )
        opts = self.options
        self.is_hybrid_swa = bool(
            cfg.is_hybrid_swa and cfg.full_attention_layer_ids
            and not opts.disable_hybrid_swa_memory
            # PD transfer and retraction backups move a single MHA pool; PD roles keep one.
            and getattr(self.server_args, "disaggregation_mode", "null") == "null"
        )
        kw = dict(page_size=self.page_size, dtype=self.kv_cache_dtype, head_num=cfg.num_key_value_heads,
                  head_dim=cfg.head_dim, device=self.device)
        if self.is_hybrid_swa:
            ratio = 0.8 if opts.swa_full_tokens_ratio is None else float(opts.swa_full_tokens_ratio)
            self.swa_max_total_num_tokens = swa_pool_size(tokens, ratio, self.page_size)
            self.token_to_kv_pool = SWAKVPool(size=tokens, size_swa=self.swa_max_total_num_tokens,
                                              swa_layer_ids=cfg.swa_layer_ids,
                                              full_layer_ids=cfg.full_attention_layer_ids, **kw)
            self.token_to_kv_pool_allocator = SWATokenToKVPoolAllocator(
                tokens, self.swa_max_total_num_tokens, self.page_size, kvcache=self.token_to_kv_pool,
                device=self.device)
            pools = [("full", tokens, self.token_to_kv_pool.full_kv_pool),
                     ("swa", self.swa_max_total_num_tokens, self.token_to_kv_pool.swa_kv_pool)]
        else:
            self.swa_max_total_num_tokens = None
            self.token_to_kv_pool = MHATokenToKVPool(size=tokens, layer_ids=cfg.attention_layer_ids, **kw)
            self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(
                tokens, self.page_size, kvcache=self.token_to_kv_pool, device=self.device
            )
            pools = [(None, tokens, self.token_to_kv_pool)]
        for kind, n, pool in pools:
            kv_bytes = pool.get_kv_size_bytes()
            k_bytes = kv_bytes // 2  # K and V have the same head_dim here
            prefix = "" if kind is None else f"[{kind}] "
            logger.info(
                f"{prefix}KV Cache is allocated. #tokens: {n}, K size: {k_bytes / GB:.2f} GB, "
                f"V size: {(kv_bytes - k_bytes) / GB:.2f} GB"
            )
        logger.info(
            f"Memory pool end. #tokens in KV pool: {tokens}, max_running_requests={self.max_running_requests}, "
            f"context_len={cfg.context_len}, page_size={self.page_size}, "
            f"avail mem={_available_memory_bytes(self.device) / GB:.2f} GB"
        )

    # ---- forward ------------------------------------------------------------------------
    def forward(self, forward_batch) -> LogitsProcessorOutput:
        forward_batch.req_to_token_pool = self.req_to_token_pool
        forward_batch.token_to_kv_pool = self.token_to_kv_pool
        forward_batch.attn_backend = self.attn_backend
        forward_batch.mamba_pool = self.mamba_pool
        if forward_batch.batch_size == 0 or forward_batch.num_tokens == 0:  # IDLE: nothing to run
            empty = torch.empty((0, self.model_config.vocab_size), dtype=torch.float32, device=self.device)
            return LogitsProcessorOutput(next_token_logits=empty,
                                         full_logits=empty if forward_batch.return_full_logits else None)
        with torch.inference_mode():
            self.attn_backend.init_forward_metadata(forward_batch)
            return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
