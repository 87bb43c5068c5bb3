"""The Mamba2 mixer of hybrid models (NemotronH, Falcon-H1), over per-request state slots.

    in_proj -> split (z, xBC, dt) -> causal depthwise conv1d over xBC (+ silu) -> split (x, B, C)
    -> SSD: h_t = exp(dt_t * A) h_{t-1} + dt_t B_t x_t,  y_t = C_t h_t + D x_t
    -> gated RMSNorm (per group of n_groups) or plain silu(z) gating -> out_proj

dt gets `dt_bias` and softplus; A = -exp(A_log); B/C are shared by the heads of a group.

State: each request's conv state (its last d_conv-1 xBC inputs) and SSM state `h` live in the
`MambaPool` slot `forward_batch.mamba_pool_indices[i]` (row `mamba_layer_idx` of the pool).
EXTEND (prefill or a chunk of it) starts from the slot's state when
`extend_prefix_lens_cpu[i] > 0`, from zeros otherwise, and writes the final state back; DECODE
advances the state one token in place. The scheduler zeroes a fresh request's slot; a request
without a prefix does not read it anyway.

dt clamping follows HF (and mamba_ssm's kernels) exactly: the chunked scan clamps dt to
`prefill_dt_limit`; the single-step update does not clamp (`decode_dt_limit=None`).

CPU runs the plain-torch ops (`torch_ops`); CUDA runs the Triton kernels (`ops`), same signatures
(`SGLANG_MAMBA_OPS` overrides the choice).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.mamba.torch_ops import PAD_SLOT_ID


@dataclass
class Mamba2Metadata:
    """Per-forward index tensors every Mamba2 layer of the batch shares."""

    is_decode: bool
    slots: torch.Tensor  # [B] int64: MambaPool slot of each request
    query_start_loc: Optional[torch.Tensor] = None  # [B + 1] int64 (extend)
    has_initial_state: Optional[torch.Tensor] = None  # [B] bool (extend): prefix_len > 0
    has_initial_state_cpu: Optional[List[bool]] = None
    # Rows whose slot is PAD_SLOT_ID (-1: padding requests) neither read nor write state.
    all_slots_valid: bool = True

    @classmethod
    def from_forward_batch(cls, forward_batch) -> "Mamba2Metadata":
        idx = getattr(forward_batch, "mamba_pool_indices", None)
        if idx is None or getattr(forward_batch, "mamba_pool", None) is None:
            raise ValueError(
                "This model has Mamba2 layers: the forward batch needs `mamba_pool` (set by the model "
                "runner) and `mamba_pool_indices` (one MambaPool slot per request)."
            )
        device = forward_batch.input_ids.device
        slots = torch.as_tensor(idx, dtype=torch.int64, device=device).reshape(-1)
        if slots.numel() != forward_batch.batch_size:
            raise ValueError(f"mamba_pool_indices has {slots.numel()} entries for a batch of {forward_batch.batch_size}")
        slot_list = slots.tolist()
        all_valid = PAD_SLOT_ID not in slot_list
        if forward_batch.forward_mode.is_decode():
            return cls(True, slots, all_slots_valid=all_valid)
        lens = [int(n) for n in forward_batch.extend_seq_lens_cpu]
        qsl = [0]
        for n in lens:
            qsl.append(qsl[-1] + n)
        init = [int(p) > 0 and s != PAD_SLOT_ID for p, s in zip(forward_batch.extend_prefix_lens_cpu, slot_list)]
        return cls(False, slots, torch.tensor(qsl, dtype=torch.int64, device=device),
                   torch.tensor(init, dtype=torch.bool, device=device), init, all_valid)

    def initial_states(self, states: torch.Tensor) -> torch.Tensor:
        """EXTEND: each request's state from its slot (fp32), zeros for requests without a prefix
        whatever their slot holds."""
        init = states[self.slots].float()
        if not all(self.has_initial_state_cpu):
            init = torch.where(self.has_initial_state[:, None, None, None], init, torch.zeros_like(init))
        return init

    def store_final_states(self, states: torch.Tensor, final: torch.Tensor) -> None:
        """EXTEND: the final states back into the requests' slots (padding rows write nothing)."""
        if self.all_slots_valid:
            states[self.slots] = final.to(states.dtype)
        else:
            valid = self.slots != PAD_SLOT_ID
            states[self.slots[valid]] = final[valid].to(states.dtype)


def _ops(device: torch.device):
    """The op set: Triton on CUDA, plain torch elsewhere; `SGLANG_MAMBA_OPS=triton|torch` forces
    one (Triton on CPU runs in its interpreter: slow, for checking the kernels' wiring)."""
    choice = os.environ.get("SGLANG_MAMBA_OPS") or ("triton" if device.type == "cuda" else "torch")
    if choice not in ("triton", "torch"):
        raise ValueError(f"SGLANG_MAMBA_OPS must be 'triton' or 'torch', got {choice!r}")
    if choice == "triton":
        from sglang.srt.layers.mamba import ops  # noqa: F401  (sets up Triton)
        from sglang.srt.layers.mamba.ops.causal_conv1d import causal_conv1d_fn, causal_conv1d_update
        from sglang.srt.layers.mamba.ops.selective_state_update import selective_state_update
        from sglang.srt.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined
    else:
        from sglang.srt.layers.mamba.torch_ops import (causal_conv1d_fn, causal_conv1d_update,
                                                       mamba_chunk_scan_combined, selective_state_update)
    return causal_conv1d_fn, causal_conv1d_update, selective_state_update, mamba_chunk_scan_combined


class GatedRMSNorm(nn.Module):
    """RMSNorm over groups of `group_size` channels, gated by silu(z).

    norm_before_gate=False (NemotronH, mamba_ssm default): norm(x * silu(z)) * w;
    norm_before_gate=True (Falcon-H1's default): norm(x) * w * silu(z). Math in fp32.
    """

    def __init__(self, hidden_size: int, group_size: int, eps: float = 1e-6, norm_before_gate: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.group_size = group_size
        self.variance_epsilon = eps
        self.norm_before_gate = norm_before_gate

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        g = F.silu(z.float())
        if not self.norm_before_gate:
            h = h * g
        shape = h.shape
        hg = h.view(*shape[:-1], shape[-1] // self.group_size, self.group_size)
        hg = hg * torch.rsqrt(hg.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        h = hg.view(shape) * self.weight.float()
        if self.norm_before_gate:
            h = h * g
        return h.to(dtype)


class MambaMixer2(nn.Module):
    """Parameter names follow HF (`in_proj`, `conv1d`, `dt_bias`, `A_log`, `D`, `norm`, `out_proj`)."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        ssm_state_size: int,
        conv_kernel_size: int,
        n_groups: int,
        mamba_layer_idx: int,
        chunk_size: int,
        intermediate_size: Optional[int] = None,
        use_conv_bias: bool = True,
        in_proj_bias: bool = False,
        out_proj_bias: bool = False,
        activation: str = "silu",
        rms_norm: bool = True,
        norm_before_gate: bool = False,
        norm_eps: float = 1e-5,
        prefill_dt_limit: Tuple[float, float] = (0.0, float("inf")),
        decode_dt_limit: Optional[Tuple[float, float]] = None,
        zxbcdt_multipliers: Optional[torch.Tensor] = None,
    ):
        super().__init__()
        if activation not in ("silu", "swish"):
            raise NotImplementedError(f"Mamba2 conv activation {activation!r} is not supported (silu only)")
        if num_heads % n_groups:
            raise ValueError(f"mamba num_heads ({num_heads}) must be a multiple of n_groups ({n_groups})")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.intermediate_size = intermediate_size or num_heads * head_dim
        if self.intermediate_size != num_heads * head_dim:
            raise ValueError(f"mamba intermediate size {self.intermediate_size} != heads {num_heads} x head_dim {head_dim}")
        self.ssm_state_size = ssm_state_size
        self.conv_kernel_size = conv_kernel_size
        self.n_groups = n_groups
        self.mamba_layer_idx = mamba_layer_idx
        self.chunk_size = chunk_size
        self.activation = activation
        self.prefill_dt_limit = tuple(float(x) for x in prefill_dt_limit)
        self.decode_dt_limit = decode_dt_limit
        self.conv_dim = self.intermediate_size + 2 * n_groups * ssm_state_size
        proj = self.intermediate_size + self.conv_dim + num_heads
        self.in_proj = ReplicatedLinear(hidden_size, proj, bias=in_proj_bias)
        # HF's nn.Conv1d weight layout [conv_dim, 1, kernel]; depthwise.
        self.conv1d = DepthwiseConvParams(self.conv_dim, conv_kernel_size, use_conv_bias)
        self.dt_bias = nn.Parameter(torch.empty(num_heads), requires_grad=False)
        self.A_log = nn.Parameter(torch.empty(num_heads), requires_grad=False)
        self.D = nn.Parameter(torch.empty(num_heads), requires_grad=False)
        self.norm = (GatedRMSNorm(self.intermediate_size, self.intermediate_size // n_groups, norm_eps, norm_before_gate)
                     if rms_norm else None)
        self.out_proj = ReplicatedLinear(self.intermediate_size, hidden_size, bias=out_proj_bias)
        if zxbcdt_multipliers is not None:
            self.register_buffer("zxbcdt_multipliers", zxbcdt_multipliers.reshape(-1).clone(), persistent=False)
        else:
            self.zxbcdt_multipliers = None

    # Shapes of this layer's state in one pool slot.
    @property
    def conv_state_shape(self) -> Tuple[int, int]:
        return (self.conv_dim, self.conv_kernel_size - 1)

    @property
    def ssm_state_shape(self) -> Tuple[int, int, int]:
        return (self.num_heads, self.head_dim, self.ssm_state_size)

    def forward(self, hidden_states: torch.Tensor, forward_batch, meta: Optional[Mamba2Metadata] = None) -> torch.Tensor:
        if meta is None:
            meta = Mamba2Metadata.from_forward_batch(forward_batch)
        T = hidden_states.shape[0]
        if T == 0:
            return hidden_states.new_zeros((0, self.out_proj.output_size))
        conv_fn, conv_update, ssu, chunk_scan = _ops(hidden_states.device)
        conv_states, ssm_states = forward_batch.mamba_pool.layer_states(self.mamba_layer_idx)

        projected = self.in_proj(hidden_states)
        if self.zxbcdt_multipliers is not None:
            projected = projected * self.zxbcdt_multipliers.to(projected.dtype)
        gate, xBC, dt = projected.split([self.intermediate_size, self.conv_dim, self.num_heads], dim=-1)
        A = -torch.exp(self.A_log.float())
        weight = self.conv1d.weight.view(self.conv_dim, self.conv_kernel_size)
        G, N, H, P = self.n_groups, self.ssm_state_size, self.num_heads, self.head_dim

        if meta.is_decode:
            xBC = conv_update(xBC, conv_states, weight, self.conv1d.bias, activation=self.activation,
                              conv_state_indices=meta.slots)
            x, B, C = xBC.split([self.intermediate_size, G * N, G * N], dim=-1)
            y = ssu(
                ssm_states,
                x.reshape(T, H, P),
                dt[:, :, None].expand(T, H, P),
                A[:, None, None].expand(H, P, N),
                B.reshape(T, G, N),
                C.reshape(T, G, N),
                D=self.D[:, None].expand(H, P),
                z=None,
                dt_bias=self.dt_bias[:, None].expand(H, P),
                dt_softplus=True,
                state_batch_indices=meta.slots,
                dt_limit=self.decode_dt_limit,
            )
        else:
            xBC = conv_fn(xBC.transpose(0, 1), weight, self.conv1d.bias, conv_states=conv_states,
                          query_start_loc=meta.query_start_loc, cache_indices=meta.slots,
                          has_initial_state=meta.has_initial_state, activation=self.activation).transpose(0, 1)
            x, B, C = xBC.split([self.intermediate_size, G * N, G * N], dim=-1)
            init = meta.initial_states(ssm_states)
            y, final = chunk_scan(
                x.reshape(T, H, P), dt, A, B.reshape(T, G, N), C.reshape(T, G, N), self.chunk_size,
                D=self.D, z=None, dt_bias=self.dt_bias, initial_states=init, cu_seqlens=meta.query_start_loc,
                dt_softplus=True, dt_limit=self.prefill_dt_limit, return_varlen_states=True,
                state_dtype=ssm_states.dtype,
            )
            meta.store_final_states(ssm_states, final)

        y = y.reshape(T, self.intermediate_size)
        if self.norm is not None:
            y = self.norm(y, gate)
        else:
            y = (y.float() * F.silu(gate.float())).to(y.dtype)
        return self.out_proj(y.to(hidden_states.dtype))


class DepthwiseConvParams(nn.Module):
    """Holds `weight` [dim, 1, kernel] and `bias` [dim] under the names `conv1d.weight/bias`."""

    def __init__(self, dim: int, kernel: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, 1, kernel), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(dim), requires_grad=False) if bias else None
