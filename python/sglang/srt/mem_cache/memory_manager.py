"""(Scheduler process.) The memory of one scheduler, owned in one place: the one door to it.

`build_memory(spec, memory_config, cache_config, retraction)` makes all of it in one call, from
typed config: the request-to-token pool, the KV pool and its allocator (one MHA pool, one MLA
latent pool for DeepSeek models, or the hybrid SWA pair), the Mamba state pool of hybrid SSM
models, the radix tree over them and, on a PD decode server, the retraction backup store. The
pools, the allocator and the tree are private to `mem_cache/` (`python -m sglang.check_layering`
checks it); the rest of the server uses these operations:

  match_prefix(req) / lock_prefix(req)  the longest cached prefix of a request, then locked so
  match_and_lock(req) / unlock(req)     that allocating cannot evict it (and the lock given back)
  admissible_tokens(reserved)           the admission budget: free + evictable KV tokens
  free_request_rows() / state_slots_admissible(n)   rows and Mamba slots left for admission
  reserve(reqs, prefix_lens, seq_lens)  request rows, Mamba slots and KV slots for tokens
                                        [prefix_len, seq_len) of each request, in one go, with
                                        eviction from the tree when short and a full rollback
                                        of what this call took when it still fails
  reserve_decode(reqs)                  one KV slot each for the next token
  verify_fits / reserve_verify          speculative decoding: KV slots for the next token and
                                        the drafted ones of each request
  trim_kv(req, kv_len)                  gives back the slots of rejected drafted tokens
  release(req, insert)                  a request's KV into the radix tree (or back to the pool)
  cache_unfinished(req)                 a running request's prompt KV into the tree (shared)
  backup_for_retraction / restore       a retracted PD decode request's KV (and Mamba state)
  kv_slots(req, start, end)             a request's KV slots (what a PD transfer sends)
  stats()                               accounting for /server_info and /metrics

The pools leave `mem_cache/` only as `DevicePools` (`device_pools()`), for those that read and
write their bytes: the model runner's attention backends and the PD transfer engines.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from sglang.srt.configs.runtime_config import CacheConfig, MemoryConfig, RetractionConfig
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.state_slots import StateSlots
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool, SWATokenToKVPoolAllocator, swa_pool_size

logger = logging.getLogger(__name__)

GB = 1 << 30
CPU_DEFAULT_MEM_FRACTION = 0.8  # matches ServerArgs' CPU default (fraction of available host memory)


@dataclasses.dataclass(frozen=True)
class MambaLayout:
    """What a hybrid SSM model needs of the state pool (the model runner reads it off the model)."""

    layer_ids: Tuple[int, ...]
    conv_shape: Tuple[int, ...]
    ssm_shape: Tuple[int, ...]
    hf_config: Any = None  # the checkpoint's config (its mamba_ssm_cache_dtype, if any)
    state_dtype: Optional[torch.dtype] = None  # the model's default for the recurrent state, if any


@dataclasses.dataclass(frozen=True)
class ModelMemorySpec:
    """What a loaded model needs of memory (`ModelWorker.memory_spec`)."""

    model_config: Any
    kv_dtype: torch.dtype
    model_dtype: torch.dtype
    device: str = "cpu"
    mamba_layout: Optional[MambaLayout] = None
    # Tensor parallelism: the KV token count every rank agreed on (each rank's pool holds its
    # heads of the same slots, so the slot count must be one; None: sized from this process).
    max_total_tokens: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class RetractionPlan:
    """A PD decode server's retraction backup as decided before the pools exist: the backend (and
    why), and whether the host pool is sized from the device pool (`derive_hicache_ratio`: the
    user set neither --hicache-ratio nor --hicache-size); `build_memory` resolves it into the
    `RetractionConfig` the store is built from (`MemoryManager.retraction_config`)."""

    backend: str
    reason: str = ""
    hicache_ratio: Optional[float] = None
    derive_hicache_ratio: bool = False
    hicache_size: int = 0
    mamba_host_pool_slots: Optional[int] = None
    host_receive_threshold: Optional[float] = None
    enable_mamba_host_pool_backup: bool = False


@dataclasses.dataclass(frozen=True)
class DevicePools:
    """The pools for those that move their bytes: the forward (attention backends, Mamba layers)
    and the PD transfer engines. Never the allocator or the tree."""

    req_to_token_pool: Any
    token_to_kv_pool: Any
    mamba_pool: Any = None


def build_memory(spec: ModelMemorySpec, memory: MemoryConfig, cache: Optional[CacheConfig] = None,
                 retraction: Optional[RetractionPlan] = None, plugin_server_args: Any = None) -> "MemoryManager":
    """All the memory of one scheduler, in one call: the pools for the model (`memory`), then the
    radix tree over them (the registry picks it from `cache`; None: no tree, for tools and model
    tests) and, with a `retraction` plan (PD decode servers), the store that keeps retracted
    requests' KV. `plugin_server_args` is handed, unread, to a registered tree backend (as upstream)."""
    from sglang.srt.mem_cache.host_pool import decode_retraction_hicache_ratio
    from sglang.srt.mem_cache.registry import (
        TreeCacheBuildContext,
        create_tree_cache,
        validate_host_pool_retraction,
    )
    from sglang.srt.mem_cache.retraction_backup import build_retraction_store

    if spec.max_total_tokens is not None and memory.max_total_tokens is None:
        memory = dataclasses.replace(memory, max_total_tokens=spec.max_total_tokens)
    mm = MemoryManager(spec.model_config, memory, kv_dtype=spec.kv_dtype, model_dtype=spec.model_dtype,
                       device=spec.device, mamba_layout=spec.mamba_layout)
    if cache is None:
        return mm
    mc, resolved = spec.model_config, None
    if retraction is not None:  # resolved first (it needs the pool sizes): the tree's builder sees it
        validate_host_pool_retraction(retraction.backend, mc.is_hybrid_ssm, mc.is_pure_swa,
                                      retraction.enable_mamba_host_pool_backup)
        ratio = retraction.hicache_ratio
        if retraction.backend == "host_pool" and retraction.derive_hicache_ratio:
            ratio = decode_retraction_hicache_ratio(mm.req_to_token_pool.max_context_len, mm.token_to_kv_pool.size,
                                                    mm.token_to_kv_pool.page_size, retraction.host_receive_threshold)
        resolved = RetractionConfig(backend=retraction.backend, reason=retraction.reason, hicache_ratio=ratio,
                                    hicache_size=retraction.hicache_size,
                                    mamba_host_pool_slots=retraction.mamba_host_pool_slots)
    mm.tree_cache = create_tree_cache(TreeCacheBuildContext(
        req_to_token_pool=mm.req_to_token_pool,
        token_to_kv_pool_allocator=mm.allocator,
        cache_config=cache,
        server_args=plugin_server_args,
        page_size=mm.page_size,
        is_hybrid_swa=mm.is_hybrid_swa,
        sliding_window_size=mc.sliding_window_size,
        is_hybrid_ssm=mc.is_hybrid_ssm,
        disable_radix_cache=cache.disable_radix_cache,
        enable_hierarchical_cache=cache.enable_hierarchical_cache,
        eviction_policy=cache.radix_eviction_policy,
        retraction_backup=resolved.backend if resolved else cache.disaggregation_decode_retraction_backup,
        model_config=mc,
        mamba_pool=mm.mamba_pool,
        state_slots=mm.state_slots,
    ))
    if mm.state_slots is not None and mm.tree_cache.has_mamba_component:
        from sglang.srt.mem_cache.unified_radix_cache import EvictParams

        mm.state_slots.evict_one = lambda: mm.tree_cache.evict(EvictParams(mamba_num=1))
    if resolved is not None:
        mm.retraction_config = resolved
        mm.retraction_store = build_retraction_store(resolved, mm.token_to_kv_pool, mm.allocator,
                                                     mamba_pool=mm.mamba_pool)
    return mm


def kv_bytes_per_token(model_config, kv_dtype: torch.dtype) -> int:
    cfg = model_config
    elem = torch.tensor([], dtype=kv_dtype).element_size()
    if getattr(cfg, "is_mla", False):  # one latent per token and layer, shared by the heads
        return len(cfg.attention_layer_ids) * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * elem
    return len(cfg.attention_layer_ids) * cfg.num_key_value_heads * cfg.head_dim * 2 * elem


def profile_max_num_tokens(model_config, kv_dtype: torch.dtype, config: MemoryConfig, device: str) -> int:
    """How many KV tokens fit the memory budget of this process (before any pool is built)."""
    frac = config.mem_fraction_static
    budget = (CPU_DEFAULT_MEM_FRACTION if frac is None else float(frac)) * available_memory_bytes(device)
    if not device.startswith("cuda"):
        # Host RAM is shared with everything else on the machine (and with the other PD role):
        # cap the KV cache like vLLM-CPU's VLLM_CPU_KVCACHE_SPACE does.
        budget = min(budget, float(os.environ.get("SGLANG_CPU_KV_CACHE_SPACE", "2")) * GB)
    # Data-parallel replicas (--dp-size) size their pools at the same time from the same memory
    # (host RAM, or the one device they share here): each takes its share, so that together
    # they keep to the budget.
    budget /= max(int(config.dp_size or 1), 1)
    return int(budget // kv_bytes_per_token(model_config, kv_dtype))


def available_memory_bytes(device: str) -> int:
    if device.startswith("cuda") and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


class MemoryManager:
    def __init__(self, model_config, config: MemoryConfig, *, kv_dtype: torch.dtype, model_dtype: torch.dtype,
                 device: str = "cpu", mamba_layout: Optional[MambaLayout] = None):
        self.model_config = model_config
        self.config = config
        self.device = device
        self.kv_dtype = kv_dtype
        self.page_size = int(config.page_size or 1)
        self._build_kv_pools()
        self.mamba_pool = self._build_mamba_pool(mamba_layout, model_dtype) if mamba_layout else None
        self.state_slots = StateSlots(self.mamba_pool) if self.mamba_pool is not None else None
        if self.mamba_pool is not None and self.max_running_requests > self.mamba_pool.size:
            self.max_running_requests = self.mamba_pool.size  # a running request holds a state slot
        self.tree_cache = None  # build_memory, when the server caches prefixes
        self.retraction_store = None  # build_memory, on PD decode servers
        self.retraction_config: Optional[RetractionConfig] = None  # what the store was built from
        self.init_free_kv = self.allocator.available_size()

    # --- sizing ------------------------------------------------------------------------------
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.model_config, self.kv_dtype)

    def _profile_max_num_token(self) -> int:
        return profile_max_num_tokens(self.model_config, self.kv_dtype, self.config, self.device)

    def _build_kv_pools(self) -> None:
        cfg, c = self.model_config, self.config
        tokens = int(c.max_total_tokens) if c.max_total_tokens is not None else self._profile_max_num_token()
        tokens = tokens // self.page_size * self.page_size
        if tokens <= 0:
            raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")
        self.max_total_num_tokens = tokens
        mrr = c.max_running_requests
        if mrr is None:
            mrr = min(max(int(tokens / cfg.context_len * 512), 2048), 4096)
        self.max_running_requests = max(1, min(int(mrr), tokens))
        self.req_to_token_pool = ReqToTokenPool(size=self.max_running_requests, max_context_len=cfg.context_len + 4,
                                                device=self.device)
        # PD transfer and retraction backups move a single MHA pool: PD roles keep one.
        self.is_hybrid_swa = bool(cfg.is_hybrid_swa and cfg.full_attention_layer_ids
                                  and not c.disable_hybrid_swa_memory and c.disaggregation_mode == "null")
        kw = dict(page_size=self.page_size, dtype=self.kv_dtype, head_num=cfg.num_key_value_heads,
                  head_dim=cfg.head_dim, device=self.device)
        if self.is_hybrid_swa:
            ratio = 0.8 if c.swa_full_tokens_ratio is None else float(c.swa_full_tokens_ratio)
            self.swa_max_total_num_tokens = swa_pool_size(tokens, ratio, self.page_size)
            self.token_to_kv_pool = SWAKVPool(size=tokens, size_swa=self.swa_max_total_num_tokens,
                                              swa_layer_ids=cfg.swa_layer_ids,
                                              full_layer_ids=cfg.full_attention_layer_ids, **kw)
            self.allocator = SWATokenToKVPoolAllocator(tokens, self.swa_max_total_num_tokens, self.page_size,
                                                       kvcache=self.token_to_kv_pool, device=self.device)
            pools = [("full", tokens, self.token_to_kv_pool.full_kv_pool),
                     ("swa", self.swa_max_total_num_tokens, self.token_to_kv_pool.swa_kv_pool)]
        elif getattr(cfg, "is_mla", False):
            self.swa_max_total_num_tokens = None
            self.token_to_kv_pool = MLATokenToKVPool(size=tokens, page_size=self.page_size, dtype=self.kv_dtype,
                                                     kv_lora_rank=cfg.kv_lora_rank,
                                                     qk_rope_head_dim=cfg.qk_rope_head_dim,
                                                     layer_ids=cfg.attention_layer_ids, device=self.device)
            self.allocator = TokenToKVPoolAllocator(tokens, self.page_size, kvcache=self.token_to_kv_pool,
                                                    device=self.device)
            pools = [(None, tokens, self.token_to_kv_pool)]
        else:
            self.swa_max_total_num_tokens = None
            self.token_to_kv_pool = MHATokenToKVPool(size=tokens, layer_ids=cfg.attention_layer_ids, **kw)
            self.allocator = TokenToKVPoolAllocator(tokens, self.page_size, kvcache=self.token_to_kv_pool,
                                                    device=self.device)
            pools = [(None, tokens, self.token_to_kv_pool)]
        for kind, n, pool in pools:
            kv_bytes = pool.get_kv_size_bytes()
            prefix = "" if kind is None else f"[{kind}] "
            if getattr(pool, "is_mla", False):  # upstream's MLA line: one latent, no separate V
                logger.info(f"{prefix}KV Cache is allocated. #tokens: {n}, KV size: {kv_bytes / GB:.2f} GB")
                continue
            k_bytes = kv_bytes // 2  # K and V have the same head_dim here
            logger.info(f"{prefix}KV Cache is allocated. #tokens: {n}, K size: {k_bytes / GB:.2f} GB, "
                        f"V size: {(kv_bytes - k_bytes) / GB:.2f} GB")
        logger.info(f"Memory pool end. #tokens in KV pool: {tokens}, max_running_requests={self.max_running_requests}, "
                    f"context_len={cfg.context_len}, page_size={self.page_size}, "
                    f"avail mem={available_memory_bytes(self.device) / GB:.2f} GB")

    def _build_mamba_pool(self, layout: MambaLayout, model_dtype: torch.dtype):
        from sglang.srt.mem_cache.mamba_pool import (
            DEFAULT_MAX_MAMBA_CACHE_SIZE,
            MambaPool,
            mamba_cache_size,
            resolve_mamba_ssm_dtype,
        )

        c = self.config
        ssm_dtype = resolve_mamba_ssm_dtype(c.mamba_ssm_dtype, layout.hf_config, model_dtype, layout.state_dtype)
        per_slot = MambaPool.bytes_per_slot_for(len(layout.layer_ids), layout.conv_shape, layout.ssm_shape,
                                                model_dtype, ssm_dtype)
        # A slot per running request unless the user sets the size; the radix cache's MAMBA
        # component keeps prefix states in the slots requests leave free and evicts them when a
        # request needs one. Without --max-running-requests upstream takes 512 slots.
        mrr = c.max_running_requests
        size = mamba_cache_size(
            c.max_mamba_cache_size,
            mrr if mrr is not None else min(DEFAULT_MAX_MAMBA_CACHE_SIZE, self.max_running_requests),
            state_prefix_caching=False,
            memory_budget_bytes=self.max_total_num_tokens * self.kv_bytes_per_token(),
            bytes_per_slot=per_slot,
            mamba_full_memory_ratio=c.mamba_full_memory_ratio,
        )
        if size <= 0:
            raise RuntimeError("Not enough memory for the Mamba state pool. Please set --max-mamba-cache-size.")
        pool = MambaPool(size, len(layout.layer_ids), layout.conv_shape, layout.ssm_shape, model_dtype, ssm_dtype,
                         device=self.device)
        logger.info(f"Mamba Cache is allocated. max_mamba_cache_size: {size}, conv_state size: "
                    f"{pool.conv_state.nbytes / GB:.2f}GB, ssm_state size: {pool.ssm_state.nbytes / GB:.2f}GB")
        return pool

    # --- what leaves mem_cache/ ------------------------------------------------------------------
    def device_pools(self) -> DevicePools:
        return DevicePools(self.req_to_token_pool, self.token_to_kv_pool, self.mamba_pool)

    @property
    def has_state_slots(self) -> bool:
        """Hybrid SSM models: every running request holds a Mamba state slot."""
        return self.mamba_pool is not None

    def kv_slots(self, req, start: int, end: int) -> torch.Tensor:
        """The KV slots of a request's tokens [start, end)."""
        return self.req_to_token_pool.req_to_token[req.kv.req_pool_idx, start:end]

    def retraction_abort_reason(self):
        """Why a retracted request could not be backed up (the store is full)."""
        return self.retraction_store.abort_reason()

    # --- admission ------------------------------------------------------------------------------
    def admissible_tokens(self, reserved: float = 0.0) -> float:
        """The admission budget: KV tokens free now or freed by evicting unlocked tree nodes, less
        what the caller reserves (e.g. what running requests will still decode)."""
        return self.allocator.available_size() + self.tree_cache.evictable_size() - reserved

    def free_request_rows(self) -> int:
        return self.req_to_token_pool.available_size()

    def state_slots_admissible(self, need: int, anchor_match=None) -> bool:
        """Whether `need` more requests can get a Mamba slot (free, or freed by evicting an unlocked
        tree state). `anchor_match`: the match one of them will lock, whose state then cannot be
        evicted for its slot. Always True on models without state slots."""
        if self.mamba_pool is None:
            return True
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

        evictable = self.tree_cache.component_evictable_size(ComponentType.MAMBA)
        anchor = anchor_match.last_device_node if anchor_match is not None else None
        if anchor is not None and not anchor.is_root:
            d = anchor.data(ComponentType.MAMBA)
            if d.value is not None and d.lock_ref == 0:
                evictable -= 1
        return self.mamba_pool.available_size() + evictable >= need

    def match_prefix(self, req, with_state: bool = True, empty: bool = False) -> None:
        """Sets `req.kv.prefix_match` / `req.kv.prefix_indices`: the longest cached prefix of
        `req.fill_ids[:req.max_prefix_len()]` (no lock taken). `with_state=False`: the request's
        recurrent state comes from elsewhere (PD decode); `empty`: no prefix (the root's match)."""
        from sglang.srt.mem_cache.radix_key import RadixKey
        from sglang.srt.mem_cache.unified_radix_cache import MatchPrefixParams

        tokens = [] if empty else req.fill_ids[: req.max_prefix_len()]
        req.kv.prefix_match = self.tree_cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens, req.extra_key),
                                                                          with_state=with_state))
        req.kv.prefix_indices = req.kv.prefix_match.device_indices

    def lock_prefix(self, req) -> None:
        """Locks the prefix `match_prefix` found, so that allocating this batch cannot evict it."""
        self.tree_cache.assign_prefix(req, req.kv.prefix_match)
        req.kv.prefix_match = None

    def match_and_lock(self, req, with_state: bool = True) -> int:
        """Matches and locks `req`'s longest cached prefix; returns its length (0 without a tree).
        Without state, a state at the prefix end is not kept locked (the request never reads it)."""
        if self.tree_cache.disable:
            return 0
        self.match_prefix(req, with_state=with_state)
        self.lock_prefix(req)
        if not with_state:
            self.tree_cache.release_prefix_state_lock(req)
        return len(req.kv.prefix_indices)

    def unlock(self, req) -> None:
        """Undoes `match_and_lock` for a request that holds nothing else yet (it matches again later)."""
        if req.kv.last_node is not None:
            self.release(req)
        req.kv.prefix_indices = torch.empty(0, dtype=torch.int64)
        req.kv.cache_protected_len = 0

    # --- operations ----------------------------------------------------------------------------
    def _evict(self, num_tokens: int) -> None:
        from sglang.srt.mem_cache.unified_radix_cache import EvictParams

        # Hybrid-SWA pools: each new token also needs an SWA slot, so free as many of those.
        self.tree_cache.evict(EvictParams(num_tokens=num_tokens, swa_num_tokens=num_tokens))

    def _alloc_kv(self, prefix_lens: Sequence[int], seq_lens: Sequence[int], last_locs: Sequence[int]):
        out = self.allocator.alloc_extend(prefix_lens, seq_lens, last_locs)
        if out is None and self.tree_cache is not None:
            need = sum(s - p for s, p in zip(seq_lens, prefix_lens)) + self.page_size * len(seq_lens)
            self._evict(need)
            out = self.allocator.alloc_extend(prefix_lens, seq_lens, last_locs)
        return out

    def _last_locs(self, rows: torch.Tensor, prefix_lens: Sequence[int]) -> List[int]:
        """Each request's slot of its token at prefix_len - 1 (0 without a prefix), in one gather."""
        cols = torch.tensor([max(p - 1, 0) for p in prefix_lens], dtype=torch.int64)
        locs = self.req_to_token_pool.req_to_token[rows, cols].tolist()
        return [loc if p else 0 for loc, p in zip(locs, prefix_lens)]

    def _write_rows(self, rows: torch.Tensor, prefix_lens: Sequence[int], seq_lens: Sequence[int],
                    slots: torch.Tensor) -> None:
        """req_to_token[row, prefix_len:seq_len] = each request's share of `slots`, in one scatter.

        The indices are built with numpy: torch's repeat_interleave runs an OpenMP region even for
        a decode batch's 16 rows, and between forwards that region waits for a worker thread the
        HTTP/detokenizer processes hold, ~1 ms a step on 2 cores (benchmark/RESULTS.md)."""
        starts = np.asarray(prefix_lens, dtype=np.int64)
        counts = np.asarray(seq_lens, dtype=np.int64) - starts
        firsts = np.cumsum(counts) - counts  # each request's first index into `slots`
        row_idx = torch.from_numpy(np.repeat(rows.numpy(), counts))
        cols = torch.from_numpy(np.arange(len(slots), dtype=np.int64) + np.repeat(starts - firsts, counts))
        self.req_to_token_pool.req_to_token[row_idx, cols] = slots

    def reserve(self, reqs: Sequence[Any], prefix_lens: Sequence[int], seq_lens: Sequence[int],
                init_mamba_state: bool = True) -> Optional[torch.Tensor]:
        """The one reservation routine (prefill batches, PD pre-allocation, retraction resume).

        Requests without a row get one (with `req.kv.prefix_indices` written into it) and, on a
        hybrid SSM model, a Mamba slot (its state copied from the matched prefix, or zeroed, when
        `init_mamba_state`; a PD transfer or a restore fills it otherwise); then one KV
        allocation covers every request's new tokens, evicting unlocked tree nodes when short.
        Sets `req.kv.kv_len = seq_len`. Returns the new tokens' slots, concatenated; None when
        memory does not suffice, with everything this call took given back."""
        taken_rows, taken_slots = [], []

        def rollback() -> None:
            for req in taken_slots:
                self.state_slots.free_request_slot(req)
            for req in taken_rows:
                self.req_to_token_pool.free(req.kv.req_pool_idx)
                req.kv.req_pool_idx = None

        for req in reqs:
            if req.kv.req_pool_idx is None:
                rows = self.req_to_token_pool.alloc(1)
                if rows is None:
                    rollback()
                    return None
                req.kv.req_pool_idx = rows[0]
                taken_rows.append(req)
                if len(req.kv.prefix_indices):
                    self.req_to_token_pool.write(req.kv.req_pool_idx, 0, req.kv.prefix_indices)
            if self.mamba_pool is not None and req.kv.mamba_pool_idx is None:
                slot = self.state_slots.alloc()  # evicts a tree state when none is free
                if slot is None:
                    rollback()
                    return None
                req.kv.mamba_pool_idx = slot
                taken_slots.append(req)
                if init_mamba_state:
                    self.tree_cache.init_req_mamba_state(req)  # copy-on-write of the prefix state, or zeros
        rows = torch.tensor([r.kv.req_pool_idx for r in reqs], dtype=torch.int64)
        out = self._alloc_kv(prefix_lens, seq_lens, self._last_locs(rows, prefix_lens))
        if out is None:
            rollback()
            return None
        self._write_rows(rows, prefix_lens, seq_lens, out)
        for req, s in zip(reqs, seq_lens):
            req.kv.kv_len = s
        return out

    def new_pages_for_decode(self, reqs: Sequence[Any]) -> int:
        return sum(1 for r in reqs if r.kv.kv_len % self.page_size == 0) * self.page_size

    def decode_fits(self, reqs: Sequence[Any]) -> bool:
        """Whether the next token of every request fits (evicting unlocked tree nodes if needed)."""
        need = self.new_pages_for_decode(reqs)
        if self.allocator.available_size() >= need:
            return True
        if self.tree_cache is not None:
            self._evict(need)
        return self.allocator.available_size() >= need

    def reserve_decode(self, reqs: Sequence[Any]) -> Optional[torch.Tensor]:
        """One KV slot per request for its next token (`decode_fits` was checked)."""
        return self.reserve(reqs, [r.kv.kv_len for r in reqs], [r.kv.kv_len + 1 for r in reqs], init_mamba_state=False)

    def verify_fits(self, reqs: Sequence[Any], num_new: Sequence[int]) -> bool:
        """Whether `num_new[i]` more tokens of every request fit (speculative verification: the
        next token plus the drafted ones), evicting unlocked tree nodes if needed."""
        need = sum(self.allocator.pages_needed(r.kv.kv_len, r.kv.kv_len + n) for r, n in zip(reqs, num_new))
        need *= self.page_size
        if self.allocator.available_size() >= need:
            return True
        if self.tree_cache is not None:
            self._evict(need)
        return self.allocator.available_size() >= need

    def reserve_verify(self, reqs: Sequence[Any], num_new: Sequence[int]) -> Optional[torch.Tensor]:
        """KV slots for `num_new[i]` tokens after each request's KV (`verify_fits` was checked);
        `trim_kv` gives back those of the drafted tokens the target rejects."""
        return self.reserve(reqs, [r.kv.kv_len for r in reqs], [r.kv.kv_len + n for r, n in zip(reqs, num_new)],
                            init_mamba_state=False)

    def trim_kv(self, req, kv_len: int) -> None:
        """Shrinks a request's KV to its first `kv_len` tokens: the pages past the one holding
        token kv_len-1 go back to the allocator (that page stays: its free tail is where the
        next token goes, as after any reservation). Only the request's own tokens are trimmed,
        never what the radix tree holds."""
        old = req.kv.kv_len
        assert req.kv.cache_protected_len <= kv_len <= old, (req.kv.cache_protected_len, kv_len, old)
        keep = -(-kv_len // self.page_size) * self.page_size  # whole pages still in use
        if keep < old:
            self.allocator.free(self.req_to_token_pool.req_to_token[req.kv.req_pool_idx, keep:old].clone())
        req.kv.kv_len = kv_len

    def release(self, req, insert: bool = False) -> None:
        """Gives back a request's memory: its KV into the radix tree (`insert`: finished requests
        whose KV is complete) or to the pool, its row, its Mamba slot and its prefix lock."""
        if req.kv.req_pool_idx is None:  # admitted (prefix locked) but never allocated
            if req.kv.last_node is not None:
                self.tree_cache.dec_lock_ref(req.kv.last_node, req.kv.lock_receipt)
            req.kv.last_node, req.kv.lock_receipt = None, None
            if self.state_slots is not None:
                self.state_slots.free_request_slot(req)
            return
        self.tree_cache.cache_finished_req(req, is_insert=insert)  # may take the state slot over
        req.kv.req_pool_idx = None
        if self.state_slots is not None:
            self.state_slots.free_request_slot(req)

    def cache_unfinished(self, req, chunked: bool = False) -> None:
        """A request that keeps running shares its prompt's KV through the radix tree."""
        self.tree_cache.cache_unfinished_req(req, chunked=chunked)

    def free_swa_out_of_window(self, req, window: int) -> None:
        """Hybrid-SWA pool: give back SWA slots of whole pages no future token can attend to
        (only the request's own pages, past cache_protected_len; the tree keeps its own)."""
        end = (req.kv.kv_len - window) // self.page_size * self.page_size
        start = max(req.kv.swa_freed_len, req.kv.cache_protected_len)
        if end > start:
            self.allocator.free_swa(self.req_to_token_pool.req_to_token[req.kv.req_pool_idx, start:end].clone())
            req.kv.swa_freed_len = end

    # --- retraction backups (PD decode) --------------------------------------------------------
    def backup_for_retraction(self, req) -> Optional[Any]:
        """Copies a running request's KV (and Mamba state) into the retraction store; None when
        the store cannot keep it. The caller then releases the request's memory."""
        indices = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx, : req.kv.kv_len].clone()
        return self.retraction_store.backup(indices, req.kv.mamba_pool_idx)

    def restore(self, req) -> bool:
        """Reserves fresh slots for a retracted request and copies its backup into them (no
        recomputation). False: memory does not suffice yet (nothing was taken)."""
        backup = req.kv.retraction_backup
        n = backup.kv_len
        slots = self.reserve([req], [0], [n], init_mamba_state=False)
        if slots is None:
            return False
        self.retraction_store.restore(backup, slots, req.kv.mamba_pool_idx)
        req.kv.retraction_backup = None
        return True

    def discard_backup(self, req) -> None:
        if req.kv.retraction_backup is not None:
            self.retraction_store.discard(req.kv.retraction_backup)
            req.kv.retraction_backup = None

    # --- accounting -------------------------------------------------------------------------------
    def flush(self) -> None:
        self.tree_cache.reset()
        self.req_to_token_pool.clear()
        self.allocator.clear()
        if self.mamba_pool is not None:
            self.mamba_pool.clear()

    def stats(self) -> Dict[str, Any]:
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

        mamba = self.mamba_pool
        return {
            "max_total_num_tokens": self.max_total_num_tokens,
            "available_kv_tokens": self.allocator.available_size(),
            "evictable_kv_tokens": self.tree_cache.evictable_size(),
            "protected_kv_tokens": self.tree_cache.protected_size(),
            "available_req_slots": self.req_to_token_pool.available_size(),
            "req_pool_size": self.req_to_token_pool.size,
            "available_mamba_slots": mamba.available_size() if mamba is not None else None,
            "mamba_pool_size": mamba.size if mamba is not None else None,
            "evictable_mamba_slots": (self.tree_cache.component_evictable_size(ComponentType.MAMBA)
                                      if mamba is not None else None),
            "retraction_backup": self.retraction_store.stats() if self.retraction_store else None,
        }

    def token_usage(self) -> Tuple[int, float]:
        used = self.max_total_num_tokens - (self.allocator.available_size() + self.tree_cache.evictable_size())
        return used, used / self.max_total_num_tokens if self.max_total_num_tokens else 0.0


def mamba_layout_of(model, hf_config) -> Optional[MambaLayout]:
    """The state-pool layout of a loaded model with Mamba2 layers (None for other models)."""
    layer_ids = tuple(getattr(model, "mamba_layer_ids", None) or ())
    if not layer_ids:
        return None
    conv_shape, ssm_shape = model.mamba_state_shapes()
    return MambaLayout(layer_ids, tuple(conv_shape), tuple(ssm_shape), hf_config,
                       getattr(model, "mamba_state_dtype", None))
