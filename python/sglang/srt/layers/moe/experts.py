"""The routed experts of one layer, stacked in two tensors as HF keeps them in memory:

    gate_up_proj [E, 2 * I, H]   (rows [0, I): gate_proj, [I, 2I): up_proj)
    down_proj    [E, H, I]

and their compute for a batch, y[t] = sum_k w[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t)) with
e = ids[t, k]:

- `fused_experts_torch`, the reference and the fallback: the (token, choice) pairs sorted by
  expert, one GEMM per expert over its contiguous rows (a loop over the experts that got tokens,
  never over tokens), the weighted results added back with one index_add;
- on CPU with sgl-kernel, `torch.ops.sgl_kernel.fused_experts`: the same sort and every expert's
  gate_up + SiLU-and-mul + down in one call, over the weights `pack_expert_weights` put in the
  panel layout of the dense layers (`sgl_kernel.pack_linear_weight` per expert), or over the
  plain stacked weights where the kernel set has no panels for their dtype. The weighted sum is
  added as HF's loop adds them (expert order, in the activations' dtype). With
  `--quantization w8a16_int8` the stacks also get int8 copies with per-row scales, which the op
  reads for decode-sized batches (as the int8 linear layers).
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers import cpu_ops


def fused_experts_torch(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                        topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """The reference: per expert gate_up, SiLU-and-mul, down, weighted and added in x's dtype."""
    T, K = topk_ids.shape
    out = torch.zeros_like(x)
    if T == 0:
        return out
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    rows = order // K  # token of each sorted (token, choice) pair
    counts = torch.bincount(flat, minlength=gate_up_proj.shape[0]).tolist()
    grouped = x.index_select(0, rows)
    expert_out = torch.empty_like(grouped)
    inter = down_proj.shape[-1]
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        seg = grouped[start:start + n]
        gate_up = F.linear(seg, gate_up_proj[e])
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        expert_out[start:start + n] = F.linear(h, down_proj[e])
        start += n
    weights = topk_weights.reshape(-1).index_select(0, order)
    out.index_add_(0, rows, (expert_out * weights[:, None]).to(x.dtype))
    return out


def kernel_takes(x: torch.Tensor, gate_up_proj: torch.Tensor) -> bool:
    """Whether `fused_experts` runs sgl-kernel's op: a CPU fp32/bf16 batch with the library
    loaded, weights of x's dtype, and not switched off (SGLANG_CPU_FUSED_MOE=0)."""
    return (cpu_ops.enabled(x) and gate_up_proj.dtype == x.dtype
            and os.environ.get("SGLANG_CPU_FUSED_MOE", "1") != "0")


def fused_experts(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  packed_gate_up: Optional[torch.Tensor] = None,
                  packed_down: Optional[torch.Tensor] = None,
                  int8_experts: Optional[Tuple[torch.Tensor, ...]] = None) -> torch.Tensor:
    """sum_k w[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t)) with e = ids[t, k]; x [T, H].
    `int8_experts` (q13, scale13, q2, scale2; --quantization w8a16_int8) take batches of up to
    `cpu_ops.linear_max_rows(torch.int8)` rows, as the int8 linear layers do (decode)."""
    if kernel_takes(x, gate_up_proj):
        if int8_experts is not None and x.shape[0] <= cpu_ops.linear_max_rows(torch.int8):
            q13, s13, q2, s2 = int8_experts
            return torch.ops.sgl_kernel.fused_experts(x.contiguous(), q13, q2, topk_weights.float(), topk_ids, s13, s2)
        w13 = packed_gate_up if packed_gate_up is not None and packed_gate_up.dtype == x.dtype else gate_up_proj
        w2 = packed_down if packed_down is not None and packed_down.dtype == x.dtype else down_proj
        return torch.ops.sgl_kernel.fused_experts(x.contiguous(), w13, w2, topk_weights.float(), topk_ids,
                                                  None, None)
    return fused_experts_torch(x, gate_up_proj, down_proj, topk_weights, topk_ids)


class StackedExperts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size),
                                         requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size), requires_grad=False)
        # sgl-kernel panel copies, one stacked tensor each (pack_expert_weights; CPU)
        self.packed_gate_up: Optional[torch.Tensor] = None
        self.packed_down: Optional[torch.Tensor] = None
        # (q13, scale13, q2, scale2) with --quantization w8a16_int8 (layers/quantization.py)
        self.int8_experts: Optional[Tuple[torch.Tensor, ...]] = None

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        return fused_experts(x, self.gate_up_proj, self.down_proj, topk_weights, topk_ids,
                             self.packed_gate_up, self.packed_down, self.int8_experts)

    def load_expert_weight(self, expert: int, which: str, tensor: torch.Tensor) -> str:
        """One expert's gate_proj / up_proj / down_proj weight; returns the key it fills."""
        inter = self.intermediate_size
        if which == "down_proj":
            dst = self.down_proj.data[expert]
        else:
            rows = slice(0, inter) if which == "gate_proj" else slice(inter, 2 * inter)
            dst = self.gate_up_proj.data[expert, rows]
        if tuple(dst.shape) != tuple(tensor.shape):
            raise ValueError(f"Expert {expert} {which}: parameter {tuple(dst.shape)} vs checkpoint {tuple(tensor.shape)}")
        dst.copy_(tensor.to(dtype=dst.dtype, device=dst.device))
        return f"{which}:{expert}"

    def expected_keys(self):
        return {f"{w}:{e}" for e in range(self.num_experts) for w in ("gate_proj", "up_proj", "down_proj")}

    def pack(self) -> bool:
        """Puts both stacks into sgl-kernel's panels (each expert as `pack_linear_weight` packs a
        linear weight) where the kernel set has panels for their dtype and both output sizes are
        multiples of 32; returns whether it did."""
        w13, w2 = self.gate_up_proj.detach(), self.down_proj.detach()
        if (w13.device.type != "cpu" or not cpu_ops.linear_panels_enabled(w13.dtype)
                or w13.shape[1] % 64 or w2.shape[1] % 32):
            return False
        pack = torch.ops.sgl_kernel.pack_linear_weight
        self.packed_gate_up = torch.stack([pack(w13[e]) for e in range(self.num_experts)])
        self.packed_down = torch.stack([pack(w2[e]) for e in range(self.num_experts)])
        return True


def pack_expert_weights(model: nn.Module, max_bytes: Optional[int] = None) -> int:
    """Packs every `StackedExperts` of `model` (see `StackedExperts.pack`); none when the copies
    would exceed `max_bytes` (the op then reads the plain stacks). Returns how many were packed."""
    targets = [m for m in model.modules() if isinstance(m, StackedExperts)]
    size = sum(m.gate_up_proj.numel() * m.gate_up_proj.element_size() + m.down_proj.numel() * m.down_proj.element_size()
               for m in targets)
    if not targets or (max_bytes is not None and size > max_bytes) or not cpu_ops.available():
        return 0
    return sum(m.pack() for m in targets)
