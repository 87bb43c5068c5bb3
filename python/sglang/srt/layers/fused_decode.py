"""The CPU decode fast path: one `sgl_kernel.decode_layers` call for all of a Llama-family
model's decoder layers (or one `sgl_kernel.decode_layer` call per layer where not all are
covered; sgl-kernel/csrc/cpu/decode_layer.cpp) instead of the ~25 op calls of each layer's modules.

The op runs the kernels the modules would call, with the same thread splits, so its result is
bit-identical to the per-op path (test/srt/layers/test_fused_decode.py); what it saves is the
Python and dispatch work between them, about a third of a batch-1 step on the default model.

`decode_layer(layer, positions, hidden, forward_batch, residual)` returns `(hidden, residual)`,
or None when the layer or the batch is outside what the op covers, and the layer then runs its
modules. Covered: a decode batch on CPU with sgl-kernel loaded, the torch-native attention
backend over a plain KV pool in the activations' dtype (not a hybrid SWA pool), and rows within
the small-M linear's range (`cpu_ops.linear_max_rows`) for every linear of the layer, with
weights in the activations' dtype or int8 (`--quantization w8a16_int8`); weights packed in panels
(layers/linear.py `pack_linear_weights`) at any rows, or up to `cpu_ops.panel_max_rows` where
oneDNN has a copy beside them.
`SGLANG_CPU_FUSED_DECODE=0` turns it off.
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Tuple

import torch

from sglang.srt.layers import cpu_ops
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend, is_swa_pool_layer
from sglang.srt.layers.linear import panels_take
from sglang.srt.utils import log_once

logger = logging.getLogger(__name__)
USED_MESSAGE = "CPU decode: whole decoder layers in sgl_kernel.decode_layer"


def enabled() -> bool:
    return os.environ.get("SGLANG_CPU_FUSED_DECODE", "1") != "0"


def _linear_args(linear, rows: int, dtype: torch.dtype) -> Optional[tuple]:
    """(weight, scale, bias) as layers/linear.py's `linear` would multiply `rows` rows with the
    small-M kernel, or None when it would take another path (oneDNN, F.linear). The bias is the
    fp32 copy the kernel adds (made once here rather than per call)."""
    if linear.gguf_weight is not None:  # GGUF blocks: the modules run sgl_kernel.gguf_linear
        return None
    bias = None if linear.bias is None else linear.bias.float()
    if linear.int8_weight is not None and rows <= cpu_ops.linear_max_rows(torch.int8):
        return linear.int8_weight[0], linear.int8_weight[1], bias
    if panels_take(linear.packed_weight, linear.onednn_weight, dtype, rows):
        return linear.packed_weight, None, bias
    if linear.onednn_weight is None and linear.weight.dtype == dtype and rows <= cpu_ops.linear_max_rows(dtype):
        return linear.weight, None, bias
    return None


def _layer_args(layer, rows: int, dtype: torch.dtype) -> Optional[tuple]:
    """The op's per-layer arguments for batches of `rows`, built once per (rows, dtype) into the
    layer's `fused_decode_args`."""
    cache = layer.fused_decode_args
    key = (rows, dtype)
    if key not in cache:
        cache[key] = _build_layer_args(layer, rows, dtype)
    return cache[key]


def _build_layer_args(layer, rows: int, dtype: torch.dtype) -> Optional[tuple]:
    if not getattr(layer, "fused_decode_ok", True):  # models/decoder.py: not a Llama-shaped layer
        return None
    attn, mlp = layer.self_attn, layer.mlp
    linears = [_linear_args(m, rows, dtype) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
    norms = [layer.input_layernorm, layer.post_attention_layernorm]
    if attn.qk_norm:
        norms += [attn.q_norm, attn.k_norm]
    radix = attn.attn
    if (any(a is None for a in linears) or any(n.weight.dtype != dtype for n in norms)
            or len({n.variance_epsilon for n in norms}) != 1 or radix.v_head_dim != radix.qk_head_dim
            or attn.rotary_emb.head_size != attn.head_dim):
        return None
    qkv, o, gate_up, down = linears
    head = (norms[0].weight, norms[1].weight, norms[0].variance_epsilon, *qkv, *o, *gate_up, *down,
            attn.q_norm.weight if attn.qk_norm else None, attn.k_norm.weight if attn.qk_norm else None,
            attn.num_heads, attn.num_kv_heads, attn.head_dim)
    tail = (radix.scaling, radix.sliding_window_size, float(radix.logit_cap or 0.0))
    return head, tail


def _batch_covered(positions: torch.Tensor, hidden: torch.Tensor, fb) -> bool:
    return (fb.forward_mode.is_decode() and cpu_ops.enabled(hidden) and enabled()
            and type(fb.attn_backend) is TorchNativeAttnBackend and positions.dtype == torch.int64)


def decode_layers(layers, positions: torch.Tensor, hidden: torch.Tensor, forward_batch
                  ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """All of a model's decoder `layers` (from the first, residual None) in one
    `sgl_kernel.decode_layers` call, bit-identical to `decode_layer` for each in turn; None when
    any layer is not covered (a hybrid SWA pool's sliding layers, weights outside the kernel's
    rows, rotary tables that differ between layers), and the caller goes layer by layer."""
    fb = forward_batch
    if not layers or not _batch_covered(positions, hidden, fb):
        return None
    pool = fb.token_to_kv_pool
    key = ("all layers", hidden.shape[0], hidden.dtype)
    cache = layers[0].fused_decode_args
    if key not in cache or cache[key][0] is not pool:  # the lists hold the pool's K/V buffers
        cache[key] = pool, _build_model_args(layers, pool, hidden.shape[0], hidden.dtype)
    args = cache[key][1]
    if args is None:
        return None
    rope = layers[0].self_attn.rotary_emb
    rope.check_positions(positions)
    lists, shared = args
    out = torch.ops.sgl_kernel.decode_layers(
        hidden, *lists[:17], *shared, positions, rope.cos_cached, rope.sin_cached, *lists[17:19], fb.out_cache_loc,
        fb.req_to_token_pool.req_to_token, fb.req_pool_indices, fb.seq_lens, *lists[19:])
    log_once(logger, USED_MESSAGE)
    return out


def _build_model_args(layers, pool, rows: int, dtype: torch.dtype) -> Optional[tuple]:
    """`decode_layers`' per-layer lists (the 17 of `_build_layer_args`' head before the head
    counts, then the K and V caches, then scale, window and logit cap) and the head counts the
    layers share; None when a layer is not covered."""
    columns, heads = [], None
    rope = layers[0].self_attn.rotary_emb
    for layer in layers:
        args = _layer_args(layer, rows, dtype)
        layer_id = layer.self_attn.attn.layer_id
        if (args is None or is_swa_pool_layer(pool, layer_id)
                or layer.self_attn.rotary_emb.cos_cached is not rope.cos_cached):
            return None
        head, tail = args
        if heads is not None and head[17:] != heads:
            return None
        heads = head[17:]
        k_buf, v_buf = pool.get_kv_buffer(layer_id)
        if k_buf.dtype != dtype:
            return None
        columns.append((*head[:17], k_buf, v_buf, *tail))
    return [list(column) for column in zip(*columns)], heads


def decode_layer(layer, positions: torch.Tensor, hidden: torch.Tensor, forward_batch,
                 residual: Optional[torch.Tensor]) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    fb = forward_batch
    if not _batch_covered(positions, hidden, fb):
        return None
    args = _layer_args(layer, hidden.shape[0], hidden.dtype)
    if args is None:
        return None
    pool = fb.token_to_kv_pool
    layer_id = layer.self_attn.attn.layer_id
    if is_swa_pool_layer(pool, layer_id):
        return None
    k_buf, v_buf = pool.get_kv_buffer(layer_id)
    if k_buf.dtype != hidden.dtype:
        return None
    rope = layer.self_attn.rotary_emb
    rope.check_positions(positions)
    head, tail = args
    out = torch.ops.sgl_kernel.decode_layer(
        hidden, residual, *head, positions, rope.cos_cached, rope.sin_cached, k_buf, v_buf, fb.out_cache_loc,
        fb.req_to_token_pool.req_to_token, fb.req_pool_indices, fb.seq_lens, *tail)
    log_once(logger, USED_MESSAGE)
    return out
