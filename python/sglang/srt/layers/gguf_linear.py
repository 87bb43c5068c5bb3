"""Linear layers and embeddings whose weights stay in GGUF blocks (llama.cpp's quantized formats).

A module's `gguf_weight` (a `GGUFWeight`) holds its output rows as one or more segments, each a
uint8 tensor [rows, bytes per row] of one GGUF type: a merged projection whose parts a file
quantized differently (a Q4_K_M file's q/k in Q4_K and v in Q6_K) keeps one segment per type.
`sgl_kernel.gguf_linear` multiplies a segment in its blocks (sgl-kernel/csrc/cpu/gguf_impl.h;
docs/gguf.md says which path runs per ISA); without sgl-kernel (or off CPU) the segment is
dequantized once, kept, and multiplied by F.linear: the reference the kernel is tested against.
Embedding rows are gathered in their blocks and dequantized per lookup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from sglang.srt.layers import cpu_ops


@dataclass
class GGUFSegment:
    start: int  # first output row
    qtype: int  # ggml type id (configs/gguf_file.py GGML_TYPES)
    data: torch.Tensor  # uint8 [rows, bytes per row]

    @property
    def rows(self) -> int:
        return self.data.shape[0]


@dataclass
class GGUFWeight:
    out_features: int
    in_features: int
    segments: List[GGUFSegment] = field(default_factory=list)
    _dequantized: Dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False)

    def add(self, start: int, qtype: int, data: torch.Tensor) -> None:
        self.segments.append(GGUFSegment(start, qtype, data))

    def finish(self, name: str) -> None:
        """Sorts the segments, joins neighbours of one type (one kernel call for q/k/v of one
        type) and checks that they cover every output row once."""
        self.segments.sort(key=lambda s: s.start)
        joined: List[GGUFSegment] = []
        at = 0
        for seg in self.segments:
            if seg.start != at:
                raise ValueError(f"GGUF weights for {name} do not cover output rows {at}..{seg.start}")
            if joined and joined[-1].qtype == seg.qtype:
                joined[-1] = GGUFSegment(joined[-1].start, seg.qtype, torch.cat([joined[-1].data, seg.data]))
            else:
                joined.append(seg)
            at = seg.start + seg.rows
        if at != self.out_features:
            raise ValueError(f"GGUF weights for {name} cover {at} of {self.out_features} output rows")
        self.segments = joined

    def nbytes(self) -> int:
        return sum(s.data.numel() for s in self.segments)

    def type_names(self) -> List[str]:
        from sglang.srt.configs.gguf_file import GGML_TYPES

        return [GGML_TYPES[s.qtype][0] for s in self.segments]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole weight [out, in] as `dtype` (computed once per dtype and kept)."""
        if dtype not in self._dequantized:
            parts = [dequantize_blocks(s.data, s.qtype, self.in_features) for s in self.segments]
            self._dequantized[dtype] = torch.cat(parts).to(dtype)
        return self._dequantized[dtype]


def dequantize_blocks(data: torch.Tensor, qtype: int, in_features: int) -> torch.Tensor:
    """fp32 [rows, in_features] of GGUF blocks: sgl-kernel's op, else gguf-py's (numpy) reference."""
    if cpu_ops.available() and data.device.type == "cpu":
        return torch.ops.sgl_kernel.gguf_dequantize(data, qtype, in_features)
    from gguf.quants import dequantize

    values = dequantize(data.cpu().numpy(), qtype)
    return torch.from_numpy(values.reshape(data.shape[0], in_features).astype("float32")).to(data.device)


def _kernel_takes(x: torch.Tensor) -> bool:
    return cpu_ops.enabled(x) and x.numel() > 0


def gguf_linear(x: torch.Tensor, weight: GGUFWeight, bias: Optional[torch.Tensor] = None,
                out_dtype: Optional[torch.dtype] = None, round_to_x: bool = True) -> torch.Tensor:
    """x @ W.T + bias for W in GGUF blocks; `out_dtype` and `round_to_x` as layers/linear.py `linear`."""
    out_dtype = out_dtype or x.dtype
    if not _kernel_takes(x):
        w = weight.dequantize(torch.float32 if (out_dtype != x.dtype and not round_to_x) else x.dtype)
        xx = x.to(w.dtype)
        return F.linear(xx, w, None if bias is None else bias.to(w.dtype)).to(out_dtype)
    outs = []
    for seg in weight.segments:
        b = None if bias is None else bias[seg.start:seg.start + seg.rows]
        outs.append(torch.ops.sgl_kernel.gguf_linear(x, seg.data, seg.qtype, weight.in_features, b, out_dtype,
                                                     round_to_x))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


def gguf_embedding(ids: torch.Tensor, weight: GGUFWeight, dtype: torch.dtype) -> torch.Tensor:
    """Rows `ids` of W (an embedding table in GGUF blocks) as `dtype`."""
    if len(weight.segments) != 1:
        return F.embedding(ids, weight.dequantize(dtype))
    seg = weight.segments[0]
    rows = seg.data.index_select(0, ids.reshape(-1))
    return dequantize_blocks(rows, seg.qtype, weight.in_features).to(dtype).reshape(*ids.shape, weight.in_features)
