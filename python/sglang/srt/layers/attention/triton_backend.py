"""`--attention-backend triton`: the Triton kernels of `triton_ops` behind `AttentionBackend`.

Per forward, `init_forward_metadata` flattens each request's KV slots out of `req_to_token`
into `kv_indices` (by a Triton kernel): the whole sequence for decode, the cached prefix for
extend (the new tokens' own K/V are passed to the extend kernel directly). Every layer of the
forward then reuses those index tensors. New K/V are written to the pool through
`token_to_kv_pool.set_kv_buffer` before the kernel runs, as in upstream. With a hybrid SWA
pool (`SWAKVPool`), sliding-window layers read through the indices translated to SWA slots.

On a GPU this is the default backend; on CPU it runs only through Triton's interpreter
(TRITON_INTERPRET=1, slow: for tests). MLA pools (DeepSeek) are refused at start: the kernels
here read V as a dense buffer of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.attention.triton_ops.decode_attention import decode_attention_fwd, get_num_kv_splits
from sglang.srt.layers.attention.triton_ops.extend_attention import extend_attention_fwd
from sglang.srt.layers.attention.triton_ops.kv_utils import build_kv_indices

# Upstream's default for --triton-attention-num-kv-splits.
DEFAULT_MAX_KV_SPLITS = 8


@dataclass
class TritonForwardMetadata:
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    # extend only
    qo_indptr: Optional[torch.Tensor] = None
    max_extend_len: int = 0
    # decode only: lengths of the full sequences, splits per sliding window (-1 = full attention)
    seq_lens: Optional[torch.Tensor] = None
    num_kv_splits: Dict[int, torch.Tensor] = field(default_factory=dict)
    scratch: Dict[Tuple[int, int], Tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # kv_indices translated to SWA-pool slots (hybrid SWA pools), built on first use
    swa_kv_indices: Optional[torch.Tensor] = None


class TritonAttnBackend(AttentionBackend):
    def __init__(self, inputs, max_kv_splits: Optional[int] = None):
        """`inputs`: an `AttentionInputs` (the pools it reads and writes, and the shapes)."""
        if getattr(inputs.token_to_kv_pool, "is_mla", False):
            raise ValueError("--attention-backend triton does not run MLA models (DeepSeek-V2/V3) on this build; "
                             "use --attention-backend torch_native")
        self.device = inputs.device
        self.req_to_token = inputs.req_to_token_pool.req_to_token
        self.token_to_kv_pool = inputs.token_to_kv_pool
        self.num_head = inputs.num_heads
        self.num_kv_head = inputs.num_kv_heads
        self.head_dim = inputs.head_dim
        self.max_kv_splits = int(max_kv_splits or inputs.max_kv_splits or DEFAULT_MAX_KV_SPLITS)
        # About one KV split per this many visible tokens of a decode request.
        self.min_tokens_per_split = 256
        self.forward_metadata: Optional[TritonForwardMetadata] = None

    # ---- metadata -----------------------------------------------------------------------
    def init_forward_metadata(self, forward_batch) -> None:
        dev = self.req_to_token.device
        rpi = forward_batch.req_pool_indices.to(dev)
        if forward_batch.forward_mode.is_decode():
            seq_lens = forward_batch.seq_lens.to(dev)
            kv_indptr, kv_indices = build_kv_indices(self.req_to_token, rpi, seq_lens)
            self.forward_metadata = TritonForwardMetadata(kv_indptr, kv_indices, seq_lens=seq_lens)
            return
        prefix = torch.tensor(forward_batch.extend_prefix_lens_cpu, dtype=torch.int64, device=dev)
        kv_indptr, kv_indices = build_kv_indices(self.req_to_token, rpi, prefix)
        ext = forward_batch.extend_seq_lens_cpu
        qo_indptr = torch.zeros(len(ext) + 1, dtype=torch.int32, device=dev)
        qo_indptr[1:] = torch.cumsum(torch.tensor(ext, dtype=torch.int32, device=dev), dim=0)
        self.forward_metadata = TritonForwardMetadata(
            kv_indptr, kv_indices, qo_indptr=qo_indptr, max_extend_len=max(ext) if ext else 0
        )

    def _decode_splits(self, window: int) -> torch.Tensor:
        md = self.forward_metadata
        if window not in md.num_kv_splits:
            md.num_kv_splits[window] = get_num_kv_splits(md.seq_lens, self.max_kv_splits, window,
                                                             self.min_tokens_per_split)
        return md.num_kv_splits[window]

    def _decode_scratch(self, bs: int, heads: int, v_dim: int):
        md = self.forward_metadata
        key = (heads, v_dim)
        if key not in md.scratch:
            md.scratch[key] = (
                torch.empty((bs, heads, self.max_kv_splits, v_dim), dtype=torch.float32, device=self.device),
                torch.empty((bs, heads, self.max_kv_splits), dtype=torch.float32, device=self.device),
            )
        return md.scratch[key]

    def _kv_indices(self, pool, layer) -> torch.Tensor:
        """Full-pool slots, or for a sliding-window layer of an SWA pool its SWA-pool slots
        (out-of-window positions may map to the padding slot: the kernels never read them)."""
        md = self.forward_metadata
        is_swa = getattr(pool, "is_swa_layer", None)
        if is_swa is None or not is_swa(layer.layer_id):
            return md.kv_indices
        if md.swa_kv_indices is None:
            md.swa_kv_indices = pool.translate_loc_from_full_to_swa(md.kv_indices)
        return md.swa_kv_indices

    # ---- forward ------------------------------------------------------------------------
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        pool = forward_batch.token_to_kv_pool or self.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        k_buf, v_buf = pool.get_kv_buffer(layer.layer_id)
        md = self.forward_metadata
        T = q.shape[0]
        hq, hkv = layer.tp_q_head_num, layer.tp_k_head_num
        o = q.new_empty((T, hq, layer.v_head_dim))
        extend_attention_fwd(
            q.reshape(T, hq, layer.qk_head_dim),
            k.reshape(T, hkv, layer.qk_head_dim),
            v.reshape(T, hkv, layer.v_head_dim),
            o, k_buf, v_buf, md.qo_indptr, md.kv_indptr, self._kv_indices(pool, layer), md.max_extend_len,
            sm_scale=layer.scaling, logit_cap=layer.logit_cap or 0.0,
            sliding_window_size=layer.sliding_window_size,
        )
        return o.view(T, hq * layer.v_head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        pool = forward_batch.token_to_kv_pool or self.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        k_buf, v_buf = pool.get_kv_buffer(layer.layer_id)
        md = self.forward_metadata
        bs = q.shape[0]
        hq = layer.tp_q_head_num
        window = layer.sliding_window_size if layer.sliding_window_size > 0 else -1
        o = q.new_empty((bs, hq, layer.v_head_dim))
        attn_logits, attn_lse = self._decode_scratch(bs, hq, layer.v_head_dim)
        decode_attention_fwd(
            q.reshape(bs, hq, layer.qk_head_dim), k_buf, v_buf, o, md.kv_indptr, self._kv_indices(pool, layer),
            attn_logits, attn_lse, self._decode_splits(window), self.max_kv_splits,
            layer.scaling, logit_cap=layer.logit_cap or 0.0, sliding_window_size=window,
        )
        return o.view(bs, hq * layer.v_head_dim)
