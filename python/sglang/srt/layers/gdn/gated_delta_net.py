"""The gated DeltaNet linear-attention layer of Qwen3-Next / Qwen3.5, over per-request state slots.

    projections -> (q, k, v) through a causal depthwise conv1d (+ silu), z, b, a
    beta = sigmoid(b),  g = -exp(A_log) * softplus(a + dt_bias)      (per value head, g <= 0)
    o = gated delta rule(l2norm(q), l2norm(k), v, g, beta)   (see torch_ops)
    out_proj(RMSNorm(o) * w * silu(z))                        (per value head of Dv channels)

Two projection layouts, as the checkpoints have them:
* "qkvz" (Qwen3-Next): `in_proj_qkvz` and `in_proj_ba`, grouped per key head: for key head j,
  [q_j (Dk), k_j (Dk), v of its r = Hv/Hk value heads (r*Dv), z of them (r*Dv)] and [b (r), a (r)].
* "split" (Qwen3.5): `in_proj_qkv` ([q | k | v] flat), `in_proj_z`, `in_proj_b`, `in_proj_a`.

State lives in the state pool the Mamba2 models use (`forward_batch.mamba_pool`, row
`state_layer_idx`): the conv state [conv_dim, K - 1] over the concatenated q|k|v channels and
the recurrent state [Hv, Dk, Dv] (float32 unless --mamba-ssm-dtype says otherwise). EXTEND starts
from the slot's state when the request has a prefix (`Mamba2Metadata.has_initial_state`) and
writes the final state back; DECODE advances it in place.

CPU runs the torch ops; CUDA the Triton kernels (`ops/`); `SGLANG_GDN_OPS=torch|triton` forces one.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.mamba.mamba_mixer2 import DepthwiseConvParams, Mamba2Metadata

GDN_OPS_BACKENDS = ("torch", "triton")


def gdn_ops(device: torch.device):
    """(causal_conv1d_fn, causal_conv1d_update, chunk_gated_delta_rule, recurrent update)."""
    choice = os.environ.get("SGLANG_GDN_OPS") or ("triton" if device.type == "cuda" else "torch")
    if choice not in GDN_OPS_BACKENDS:
        raise ValueError(f"SGLANG_GDN_OPS must be one of {GDN_OPS_BACKENDS}, got {choice!r}")
    if choice == "triton":
        # (importing the ops packages sets Triton up: its interpreter when no GPU exists)
        from sglang.srt.layers.gdn.ops.gated_delta_rule import (chunk_gated_delta_rule,
                                                                fused_recurrent_gated_delta_rule_update)
        from sglang.srt.layers.mamba.ops.causal_conv1d import causal_conv1d_fn, causal_conv1d_update
    else:
        from sglang.srt.layers.gdn.torch_ops import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule_update
        from sglang.srt.layers.mamba.torch_ops import causal_conv1d_fn, causal_conv1d_update
    return causal_conv1d_fn, causal_conv1d_update, chunk_gated_delta_rule, fused_recurrent_gated_delta_rule_update


class GatedRMSNormPerHead(nn.Module):
    """HF Qwen3NextRMSNormGated: norm(x) * w (in x's dtype) * silu(z) (fp32), over the last dim."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = F.rms_norm(x.float(), (x.shape[-1],), None, self.variance_epsilon)
        h = self.weight * h.to(dtype)
        return (h * F.silu(z.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, config, state_layer_idx: int, layout: str):
        super().__init__()
        if layout not in ("qkvz", "split"):
            raise ValueError(f"GatedDeltaNet layout must be 'qkvz' or 'split', got {layout!r}")
        act = getattr(config, "hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise NotImplementedError(f"GatedDeltaNet conv activation {act!r} is not supported (silu only)")
        self.layout = layout
        self.state_layer_idx = state_layer_idx
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(f"linear_num_value_heads ({self.num_v_heads}) must be a multiple of "
                             f"linear_num_key_heads ({self.num_k_heads})")
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_kernel_size = config.linear_conv_kernel_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        hidden = config.hidden_size
        if layout == "qkvz":
            self.in_proj_qkvz = ReplicatedLinear(hidden, 2 * self.key_dim + 2 * self.value_dim)
            self.in_proj_ba = ReplicatedLinear(hidden, 2 * self.num_v_heads)
        else:
            self.in_proj_qkv = ReplicatedLinear(hidden, self.conv_dim)
            self.in_proj_z = ReplicatedLinear(hidden, self.value_dim)
            self.in_proj_b = ReplicatedLinear(hidden, self.num_v_heads)
            self.in_proj_a = ReplicatedLinear(hidden, self.num_v_heads)
        self.conv1d = DepthwiseConvParams(self.conv_dim, self.conv_kernel_size, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads), requires_grad=False)
        self.norm = GatedRMSNormPerHead(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = ReplicatedLinear(self.value_dim, hidden)

    # Shapes of this layer's state in one pool slot.
    @property
    def conv_state_shape(self) -> Tuple[int, int]:
        return (self.conv_dim, self.conv_kernel_size - 1)

    @property
    def ssm_state_shape(self) -> Tuple[int, int, int]:
        return (self.num_v_heads, self.head_k_dim, self.head_v_dim)

    def _project(self, x: torch.Tensor):
        """-> (q|k|v channels [T, conv_dim], z [T, Hv, Dv], b [T, Hv], a [T, Hv])."""
        T = x.shape[0]
        Hk, Dk, Dv, r = self.num_k_heads, self.head_k_dim, self.head_v_dim, self.num_v_heads // self.num_k_heads
        if self.layout == "split":
            return (self.in_proj_qkv(x), self.in_proj_z(x).view(T, self.num_v_heads, Dv),
                    self.in_proj_b(x), self.in_proj_a(x))
        qkvz = self.in_proj_qkvz(x).view(T, Hk, 2 * Dk + 2 * r * Dv)
        q, k, v, z = qkvz.split([Dk, Dk, r * Dv, r * Dv], dim=-1)
        b, a = self.in_proj_ba(x).view(T, Hk, 2 * r).split([r, r], dim=-1)
        qkv = torch.cat((q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)), dim=-1)
        return qkv, z.reshape(T, self.num_v_heads, Dv), b.reshape(T, -1), a.reshape(T, -1)

    def forward(self, hidden_states: torch.Tensor, forward_batch, meta: Optional[Mamba2Metadata] = None) -> torch.Tensor:
        if meta is None:
            meta = Mamba2Metadata.from_forward_batch(forward_batch)
        T = hidden_states.shape[0]
        if T == 0:
            return hidden_states.new_zeros((0, self.out_proj.output_size))
        conv_fn, conv_update, chunk_rule, recurrent_update = gdn_ops(hidden_states.device)
        conv_states, rec_states = forward_batch.mamba_pool.layer_states(self.state_layer_idx)
        qkv, z, b, a = self._project(hidden_states)
        weight = self.conv1d.weight.view(self.conv_dim, self.conv_kernel_size)
        if meta.is_decode:
            qkv = conv_update(qkv, conv_states, weight, None, activation="silu", conv_state_indices=meta.slots)
        else:
            qkv = conv_fn(qkv.transpose(0, 1), weight, None, conv_states=conv_states,
                          query_start_loc=meta.query_start_loc, cache_indices=meta.slots,
                          has_initial_state=meta.has_initial_state, activation="silu").transpose(0, 1)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(T, self.num_k_heads, self.head_k_dim)
        k = k.reshape(T, self.num_k_heads, self.head_k_dim)
        v = v.reshape(T, self.num_v_heads, self.head_v_dim)
        beta = torch.sigmoid(b.float())
        g = -torch.exp(self.A_log.float()) * F.softplus(a.float() + self.dt_bias.float())
        if meta.is_decode:
            o = recurrent_update(q, k, v, g, beta, rec_states, meta.slots)
        else:
            o, final = chunk_rule(q, k, v, g, beta, initial_states=meta.initial_states(rec_states),
                                  cu_seqlens=meta.query_start_loc)
            meta.store_final_states(rec_states, final)
        o = self.norm(o.reshape(T, self.num_v_heads, self.head_v_dim).to(hidden_states.dtype), z)
        return self.out_proj(o.reshape(T, self.value_dim))
