"""Linear layers whose weights are filled by `load_weights` (no random init: loading a real
checkpoint should not pay for initialising weights it overwrites).

`MergedLinear` stacks several HF projections into one matmul (q/k/v -> qkv_proj, gate/up ->
gate_up_proj); `weight_loader(param, tensor, shard_id)` copies one HF tensor into its slice.

Tensor parallelism (distributed/parallel_state.py; a group of one changes nothing): a
`ColumnParallelLinear` (and the merged ones) holds this rank's block of output rows, a
`RowParallelLinear` this rank's block of input columns and sums the partial products over the
ranks (all-reduce) before adding its bias once. `QKVParallelLinear` splits the heads: query
heads evenly, KV heads evenly too when there are at least as many as ranks, else each rank keeps
the one KV head its query heads use (replicated). Loading shards at load time: each
`weight_loader` copies only this rank's slice of the checkpoint tensor.

On CPU, `pack_linear_weights(model)` gives every linear layer and the LM head a oneDNN-blocked
copy of its weight (`packed_weight`), which oneDNN multiplies 1.3-2x faster than `F.linear` on
the plain row-major weight at decode batch sizes (benchmark/RESULTS.md). The plain weight stays
(tied embeddings, weight inspection); the copy costs the linear weights' size once more, so the
model runner skips packing when the copies would take over half of the available memory.

Weights go instead into sgl-kernel's panels where it has a panel kernel for their dtype (bf16:
AVX512-BF16 and AVX2 kernel sets; fp32: AVX2; `pack_linear_weights`), a copy as large as the
weight that the kernel multiplies at any rows; where oneDNN multiplies that dtype natively (AMX:
up to 7x the panels' rate on prefill rows) a oneDNN copy beside them takes the rows past
`cpu_ops.panel_max_rows`, measured per machine (layers/linear_crossover.py).
Elsewhere, bf16 on a CPU without native bf16 GEMMs (no AVX-512-BF16/AMX/AVX-NE-CONVERT, where torch
emulates them 4-7x slower than fp32), or with SGLANG_CPU_LINEAR_PANELS=0: the packed copy is the
weight upcast to fp32, and the activation is upcast per call. Both upcasts are exact, the kernel
accumulates in fp32 and the result is rounded to bf16, which is what a native bf16 GEMM computes;
the cost is an fp32-sized copy of the weights.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.distributed.parallel_state import get_tp_rank, get_tp_size, tensor_model_parallel_all_reduce
from sglang.srt.layers import cpu_ops
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.gguf_linear import gguf_linear

_SILU_AND_MUL = SiluAndMul()  # stateless


class ReplicatedLinear(nn.Module):
    packed_weight: Optional[torch.Tensor] = None  # set by pack_linear_weights (CPU)
    int8_weight: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # (q, scale): layers/quantization.py
    onednn_weight: Optional[torch.Tensor] = None  # beside panels, for many rows (pack_linear_weights)
    gguf_weight = None  # GGUF blocks (layers/gguf_linear.py), from a GGUF file; `weight` is then a placeholder

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return module_linear(self, x)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        _copy_checked(param.data, loaded)


def _split(size: int, tp_size: int, what: str) -> int:
    if size % tp_size:
        raise ValueError(f"{what} ({size}) is not divisible by --tp-size {tp_size}")
    return size // tp_size


def _rank_rows(loaded: torch.Tensor, dim: int, start: int, size: int, full: int) -> torch.Tensor:
    """This rank's `size` rows from `start` along `dim` of a checkpoint tensor of `full` rows (a
    tensor of another size goes through whole, so that the copy names the shape mismatch)."""
    if size == full or loaded.dim() <= dim or loaded.shape[dim] != full:
        return loaded
    return loaded.narrow(dim, start, size)


class ColumnParallelLinear(ReplicatedLinear):
    """Output rows split across the TP ranks; returns this rank's part of the output."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        super().__init__(input_size, _split(output_size, self.tp_size, "output size"), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        n = param.data.shape[0]
        _copy_checked(param.data, _rank_rows(loaded, 0, self.tp_rank * n, n, n * self.tp_size))


class RowParallelLinear(ReplicatedLinear):
    """Input columns split across the TP ranks; the partial products are summed over the ranks
    (all-reduce), then the bias is added once."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        super().__init__(_split(input_size, self.tp_size, "input size"), output_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return module_linear(self, x)
        y = linear(x, self.weight, None, self.packed_weight, self.int8_weight, self.onednn_weight)
        y = tensor_model_parallel_all_reduce(y)
        return y if self.bias is None else y + self.bias

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if param.dim() == 1:  # the bias: whole on every rank
            _copy_checked(param.data, loaded)
            return
        n = param.data.shape[1]
        _copy_checked(param.data, _rank_rows(loaded, 1, self.tp_rank * n, n, n * self.tp_size))


class MergedLinear(ReplicatedLinear):
    """Several output blocks in one weight; block `i` has `output_sizes[i]` rows (the whole
    model's). Under TP each block is split by rank (`_rank_block`) and this rank holds its part of
    each block, in the same order."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = False,
                 shard_names: Optional[Sequence[Union[str, int]]] = None):
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        names = list(shard_names) if shard_names is not None else list(range(len(output_sizes)))
        self.full_sizes = dict(zip(names, output_sizes))
        local = [self._rank_block(name, size)[1] for name, size in zip(names, output_sizes)]
        super().__init__(input_size, sum(local), bias)
        self.output_sizes = local
        self._offsets = {}
        acc = 0
        for name, size in zip(names, local):
            self._offsets[name] = (acc, size)
            acc += size

    def _rank_block(self, shard_id, full_size: int) -> Tuple[int, int]:
        """(start row in the checkpoint's block, rows) this rank holds of block `shard_id`."""
        size = _split(full_size, self.tp_size, f"output block {shard_id!r}")
        return self.tp_rank * size, size

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if shard_id is None:
            if self.tp_size == 1:
                _copy_checked(param.data, loaded)
                return
            # A fused checkpoint tensor (Phi-3's qkv_proj): its blocks, each sharded.
            at = 0
            for name, full in self.full_sizes.items():
                self.weight_loader(param, loaded.narrow(0, at, full), name)
                at += full
            return
        start, size = self._offsets[shard_id]
        src_start, src_size = self._rank_block(shard_id, self.full_sizes[shard_id])
        full = self.full_sizes[shard_id]
        _copy_checked(param.data.narrow(0, start, size), _rank_rows(loaded, 0, src_start, src_size, full))


class MergedColumnParallelLinear(MergedLinear):
    """gate_up_proj: shards 0 (gate) and 1 (up)."""

    def __init__(self, input_size: int, output_sizes: List[int], bias: bool = False):
        super().__init__(input_size, output_sizes, bias)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this projection of x (SiluAndMul of its output). Where `linear`
        multiplies a weight in panels, one sgl-kernel pass that never stores the projection
        (bit-identical to the two steps)."""
        if _takes_panels(x, self.packed_weight, self.int8_weight, self.onednn_weight):
            return torch.ops.sgl_kernel.linear_silu_mul(x, self.packed_weight, None, self.bias)
        return _SILU_AND_MUL(self(x))


class QKVParallelLinear(MergedLinear):
    """qkv_proj: shards "q", "k", "v". `num_heads` / `num_kv_heads`: this rank's heads."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: int, bias: bool = False):
        tp = get_tp_size()
        self.head_size = head_size
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = _split(total_num_heads, tp, "the number of attention heads")
        if total_num_kv_heads >= tp:
            self.num_kv_heads = _split(total_num_kv_heads, tp, "the number of KV heads")
        elif tp % total_num_kv_heads:
            raise ValueError(f"--tp-size {tp} is not a multiple of the number of KV heads ({total_num_kv_heads})")
        else:
            self.num_kv_heads = 1  # replicated: tp / total ranks share each KV head
        self.q_size = total_num_heads * head_size
        self.kv_size = total_num_kv_heads * head_size
        super().__init__(hidden_size, [self.q_size, self.kv_size, self.kv_size], bias,
                         shard_names=["q", "k", "v"])

    def _rank_block(self, shard_id, full_size: int) -> Tuple[int, int]:
        if shard_id == "q":
            n = self.num_heads * self.head_size
            return self.tp_rank * n, n
        n = self.num_kv_heads * self.head_size
        if self.total_num_kv_heads >= self.tp_size:
            return self.tp_rank * n, n
        ranks_per_head = self.tp_size // self.total_num_kv_heads
        return (self.tp_rank // ranks_per_head) * n, n


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           packed_weight: Optional[torch.Tensor] = None,
           int8_weight: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
           onednn_weight: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None,
           round_to_x: bool = True) -> torch.Tensor:
    """x @ weight.T + bias: sgl-kernel on a weight packed in panels (any rows, or up to
    `cpu_ops.panel_max_rows` when oneDNN has a copy beside them), else its small-M kernel for few
    rows (it reads bf16 and int8 weights as they are), else the oneDNN-packed copy of the weight
    when there is one.

    `out_dtype` (x's dtype or fp32): the result's dtype. An fp32 result of bf16 x holds the bf16
    result widened (`round_to_x`; sgl-kernel stores it in the same pass), or the fp32 sums
    themselves (`round_to_x=False`: upstream's --enable-fp32-lm-head; off sgl-kernel, the operands
    are upcast per call)."""
    out_dtype = out_dtype or x.dtype
    if _takes_panels(x, packed_weight, int8_weight, onednn_weight):
        return torch.ops.sgl_kernel.linear(x, packed_weight, None, bias, out_dtype, round_to_x)
    if cpu_ops.enabled(x) and x.numel():
        rows = x.numel() // x.shape[-1]
        if int8_weight is not None and rows <= cpu_ops.linear_max_rows(torch.int8):
            return torch.ops.sgl_kernel.linear(x, int8_weight[0], int8_weight[1], bias, out_dtype, round_to_x)
        if onednn_weight is None and x.dtype == weight.dtype and rows <= cpu_ops.linear_max_rows(x.dtype):
            return torch.ops.sgl_kernel.linear(x, weight, None, bias, out_dtype, round_to_x)
    if out_dtype != x.dtype and not round_to_x:
        return F.linear(x.to(out_dtype), weight.to(out_dtype), None if bias is None else bias.to(out_dtype))
    y = _large_m_linear(x, weight, bias, packed_weight if onednn_weight is None else onednn_weight)
    return y.to(out_dtype)


def module_linear(module: nn.Module, x: torch.Tensor, out_dtype: Optional[torch.dtype] = None,
                  round_to_x: bool = True) -> torch.Tensor:
    """`linear` with a linear layer's (or the LM head's) weights and their packed copies."""
    gguf_weight = getattr(module, "gguf_weight", None)
    if gguf_weight is not None:
        return gguf_linear(x, gguf_weight, getattr(module, "bias", None), out_dtype, round_to_x)
    return linear(x, module.weight, getattr(module, "bias", None), getattr(module, "packed_weight", None),
                  getattr(module, "int8_weight", None), getattr(module, "onednn_weight", None), out_dtype, round_to_x)


def module_linear_argmax(module: nn.Module, x: torch.Tensor, round_to_x: bool = True) -> Optional[torch.Tensor]:
    """torch.argmax(module_linear(module, x, torch.float32, round_to_x), dim=-1) without the
    products stored (`sgl_kernel.linear_argmax`: greedy sampling's LM head), where `linear` would
    multiply x by the module's panels; None otherwise (the caller computes the logits)."""
    if not _takes_panels(x, getattr(module, "packed_weight", None), getattr(module, "int8_weight", None),
                         getattr(module, "onednn_weight", None)):
        return None
    return torch.ops.sgl_kernel.linear_argmax(x, module.packed_weight, getattr(module, "bias", None), round_to_x)


def panels_take(packed_weight: Optional[torch.Tensor], onednn_weight: Optional[torch.Tensor],
                dtype: torch.dtype, rows: int) -> bool:
    """Whether `linear` multiplies `rows` rows of `dtype` by this weight's panels (before the
    int8 kernel's claim on few rows): panels of that dtype, and no oneDNN copy beside them or
    rows within `cpu_ops.panel_max_rows`."""
    return (is_panel_weight(packed_weight) and packed_weight.dtype == dtype
            and (onednn_weight is None or rows <= cpu_ops.panel_max_rows(dtype)))


def _takes_panels(x: torch.Tensor, packed_weight: Optional[torch.Tensor],
                  int8_weight: Optional[Tuple[torch.Tensor, torch.Tensor]],
                  onednn_weight: Optional[torch.Tensor]) -> bool:
    """Whether `linear` multiplies x by the weight's panels (int8 weights go first, for few rows)."""
    if not (cpu_ops.enabled(x) and x.numel()):
        return False
    rows = x.numel() // x.shape[-1]
    return (panels_take(packed_weight, onednn_weight, x.dtype, rows)
            and (int8_weight is None or rows > cpu_ops.linear_max_rows(torch.int8)))


def _large_m_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                    packed_weight: Optional[torch.Tensor]) -> torch.Tensor:
    """The path beyond the small-M kernel's rows: oneDNN on the packed copy, else F.linear."""
    if packed_weight is not None and x.numel() and not is_panel_weight(packed_weight):
        if packed_weight.dtype == x.dtype:
            return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")
        # An fp32 copy of a bf16 weight (see the module docstring). For a single row, torch's own
        # bf16 GEMV is faster (it streams half the bytes): 20 vs 31 ms per SmolLM2 decode step.
        if x.numel() == x.shape[-1]:
            return F.linear(x, weight, bias)
        bias = None if bias is None else bias.float()
        return torch.ops.mkldnn._linear_pointwise(x.float(), packed_weight, bias, "none", [], "").to(x.dtype)
    return F.linear(x, weight, bias)


def cpu_linear_modules(model: nn.Module) -> List[nn.Module]:
    """The modules `linear` multiplies on CPU: those with a `packed_weight` slot (linear layers,
    the LM head) and a 2-D CPU weight (not those whose weight stays in GGUF blocks)."""
    return [m for m in model.modules()
            if hasattr(m, "packed_weight") and getattr(m, "gguf_weight", None) is None
            and isinstance(getattr(m, "weight", None), torch.Tensor)
            and m.weight.dim() == 2 and m.weight.device.type == "cpu"]


def is_panel_weight(packed_weight: Optional[torch.Tensor]) -> bool:
    """Whether a `packed_weight` is sgl-kernel's panel layout (`pack_linear_weights`) rather
    than a oneDNN-blocked copy."""
    return packed_weight is not None and packed_weight.layout == torch.strided and packed_weight.dim() == 3


def pack_linear_weights(model: nn.Module, max_bytes: Optional[int] = None) -> int:
    """Gives each module with a `packed_weight` slot a packed copy of its 2-D weight: where
    sgl-kernel has a panel kernel for the weight's dtype (`cpu_ops.linear_panels_enabled`: bf16 on
    the AMX, AVX512-BF16 and AVX2 kernel sets, fp32 on those and AVX-512), a weight whose rows are a multiple of 32
    goes into its panels (`sgl_kernel.pack_linear_weight`; the kernel then takes every batch size,
    as fast as oneDNN from 64 rows and faster below), any other weight into a oneDNN-blocked copy.

    A weight in panels also gets a oneDNN copy (`onednn_weight`) where oneDNN multiplies its dtype
    natively and the memory allows (both copies within `max_bytes`): `linear` then sends rows past
    `cpu_ops.panel_max_rows` to oneDNN, and `linear_crossover.measure_panel_rows` measures those
    rows (dropping the copies where the panels win throughout).

    Returns how many were packed (0 when the copies, counted at fp32 size, would exceed
    `max_bytes`: the layers keep using their plain weights). A bf16 weight that oneDNN cannot
    multiply natively on this CPU is packed as its fp32 upcast.
    """
    targets = cpu_linear_modules(model)
    fp32_bytes = sum(4 * m.weight.numel() for m in targets)
    if max_bytes is not None and fp32_bytes > max_bytes:
        return 0
    panels = {dtype for dtype in (torch.bfloat16, torch.float32) if cpu_ops.linear_panels_enabled(dtype)}
    both_fit = max_bytes is None or 2 * sum(m.weight.numel() * m.weight.element_size() for m in targets) <= max_bytes
    count = 0
    for module in targets:
        weight = module.weight.detach()
        if weight.dtype in panels and weight.shape[0] % 32 == 0:
            module.packed_weight = torch.ops.sgl_kernel.pack_linear_weight(weight)
            if both_fit and torch.backends.mkldnn.is_available():
                try:
                    module.onednn_weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
                except RuntimeError:  # no native oneDNN GEMM for this dtype: the panels take every row
                    pass
            count += 1
            continue
        if not torch.backends.mkldnn.is_available():
            continue
        try:
            module.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        except RuntimeError:  # bf16 without native support (AVX2): pack the exact fp32 upcast
            if weight.dtype != torch.bfloat16:
                continue
            module.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.float(), None)
        count += 1
    return count


def weights_into_huge_pages(model: nn.Module) -> int:
    """Moves the weights decode streams every step (panel-packed weights and int8 weights) into
    one mapping of transparent huge pages (utils/host_memory.py `huge_page_views`), one weight at a
    time, so that each old copy is freed before the next is made; returns the bytes moved, 0 where
    huge pages are off or unavailable."""
    from sglang.srt.utils.host_memory import huge_page_views, huge_pages_wanted

    if not huge_pages_wanted():
        return 0
    slots = []  # (module, attribute, index in a (q, scale) pair or None)
    for module in cpu_linear_modules(model):
        if is_panel_weight(module.packed_weight):
            slots.append((module, "packed_weight", None))
        if getattr(module, "int8_weight", None) is not None:
            slots.append((module, "int8_weight", 0))

    def current(module, attr, i):
        return getattr(module, attr) if i is None else getattr(module, attr)[i]

    views = huge_page_views([(t.shape, t.dtype) for t in (current(*slot) for slot in slots)]) if slots else None
    if views is None:
        return 0
    for (module, attr, i), view in zip(slots, views):
        view.copy_(current(module, attr, i))
        setattr(module, attr, view if i is None else (view, *getattr(module, attr)[1:]))
    return sum(v.numel() * v.element_size() for v in views)


def _copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"Weight shape mismatch: parameter {tuple(dst.shape)} vs checkpoint {tuple(src.shape)}")
    dst.copy_(src.to(dtype=dst.dtype, device=dst.device))


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    _copy_checked(param.data, loaded)
