"""Rotary position embedding (HF "rotate_half" / NeoX layout), with HF's rope scalings.

cos/sin are precomputed in fp32 for every position up to `max_position` (computed exactly as
HF computes them: fp32 inverse frequencies times fp32 positions) and indexed by the flat
`positions` tensor of the batch, so prefill, chunked prefill and decode share one table.

Supported `rope_type`s: "default", "linear", "llama3", "dynamic" (HF's dynamic NTK applied per
position: positions inside the original context use the plain frequencies, as HF does).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from sglang.srt.layers import cpu_ops


def _cfg_get(config: Any, key: str, default=None):
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def get_rope_config(config: Any) -> Tuple[float, Optional[Dict[str, Any]]]:
    """(rope_theta, scaling dict or None) from an HF config object or dict.

    transformers 5 keeps everything in `rope_parameters` (with `rope_theta` inside); older
    configs have top-level `rope_theta` and `rope_scaling`. Both are read.
    """
    params = _cfg_get(config, "rope_parameters")
    scaling = _cfg_get(config, "rope_scaling")
    theta = _cfg_get(config, "rope_theta")
    if isinstance(params, dict) and params:
        if "rope_theta" in params:
            theta = params["rope_theta"]
        if params.get("rope_type", params.get("type", "default")) != "default":
            scaling = params
    if theta is None:
        theta = 10000.0
    if isinstance(scaling, dict):
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        scaling = None if rope_type == "default" else dict(scaling, rope_type=rope_type)
    else:
        scaling = None
    return float(theta), scaling


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: Dict[str, Any]) -> torch.Tensor:
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 rope_scaling: Optional[Dict[str, Any]] = None, original_max_position: Optional[int] = None):
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.base = base
        self.rope_scaling = rope_scaling
        self.max_position = max_position
        rope_type = (rope_scaling or {}).get("rope_type", "default")
        inv_freq = _base_inv_freq(base, rotary_dim)
        t = torch.arange(max_position, dtype=torch.int64).to(torch.float)
        if rope_type == "default":
            freqs = t[:, None] * inv_freq[None, :]
        elif rope_type == "linear":
            freqs = t[:, None] * (inv_freq / float(rope_scaling["factor"]))[None, :]
        elif rope_type == "llama3":
            freqs = t[:, None] * _llama3_inv_freq(inv_freq, rope_scaling)[None, :]
        elif rope_type == "dynamic":
            freqs = self._dynamic_freqs(t, rope_scaling, original_max_position or max_position)
        else:
            raise NotImplementedError(
                f"rope_type {rope_type!r} is not supported; supported: default, linear, llama3, dynamic"
            )
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)
        self._last = None  # (positions tensor, dtype, (cos, sin)) of the latest call
        self._checked = None  # the latest positions tensor found inside the table

    def _dynamic_freqs(self, t: torch.Tensor, scaling: Dict[str, Any], orig_max: int) -> torch.Tensor:
        factor = float(scaling["factor"])
        dim = self.rotary_dim
        freqs = t[:, None] * _base_inv_freq(self.base, dim)[None, :]
        long = t >= orig_max
        if long.any():
            seq_len = t[long] + 1
            bases = self.base * ((factor * seq_len / orig_max) - (factor - 1)) ** (dim / (dim - 2))
            exps = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim
            inv = 1.0 / (bases[:, None] ** exps[None, :])
            freqs[long] = t[long][:, None] * inv
        return freqs

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos/sin rows of `positions` ([T, 1, rotary_dim]); one instance serves every layer
        (see get_rope), so the rows are gathered once per forward and reused."""
        if self._last is not None and self._last[0] is positions and self._last[1] == dtype:
            return self._last[2]
        self.check_positions(positions)
        cos = self.cos_cached.index_select(0, positions).to(dtype)[:, None, :]
        sin = self.sin_cached.index_select(0, positions).to(dtype)[:, None, :]
        self._last = (positions, dtype, (cos, sin))
        return cos, sin

    def check_positions(self, positions: torch.Tensor) -> None:
        """Once per positions tensor (one instance serves every layer of a forward)."""
        if self._checked is positions:
            return
        if positions.numel() and int(positions.max()) >= self.cos_cached.shape[0]:
            raise ValueError(
                f"position {int(positions.max())} exceeds the rotary table ({self.cos_cached.shape[0]} positions)"
            )
        self._checked = positions

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        """query: [T, n_q * head_size], key: [T, n_kv * head_size] -> rotated, same shapes."""
        if (cpu_ops.enabled(query) and query.dim() == 2 and key.dim() == 2 and key.dtype == query.dtype
                and query.stride(-1) == 1 and key.stride(-1) == 1 and positions.dtype == torch.int64):
            self.check_positions(positions)
            return torch.ops.sgl_kernel.rotary_embedding(positions.contiguous(), query, key, self.head_size,
                                                         self.cos_cached, self.sin_cached)
        cos, sin = self._cos_sin(positions, query.dtype)
        T = positions.shape[0]
        q = query.view(T, -1, self.head_size)
        k = key.view(T, -1, self.head_size)
        rd = self.rotary_dim
        q_rot, k_rot = q[..., :rd], k[..., :rd]
        q_out = q_rot * cos + self._rotate_half(q_rot) * sin
        k_out = k_rot * cos + self._rotate_half(k_rot) * sin
        if rd < self.head_size:
            q_out = torch.cat((q_out, q[..., rd:]), dim=-1)
            k_out = torch.cat((k_out, k[..., rd:]), dim=-1)
        return q_out.reshape(query.shape), k_out.reshape(key.shape)


_ROPE_CACHE: Dict[str, RotaryEmbedding] = {}


def get_rope(head_size: int, rotary_dim: int, max_position: int, base: float,
             rope_scaling: Optional[Dict[str, Any]] = None) -> RotaryEmbedding:
    """The rotary embedding for these settings; equal settings share one instance (one table,
    and cos/sin gathered once per forward for all layers)."""
    key = repr((head_size, rotary_dim, max_position, base, sorted((rope_scaling or {}).items()),
                str(torch.get_default_device())))
    if key not in _ROPE_CACHE:
        _ROPE_CACHE[key] = _new_rope(head_size, rotary_dim, max_position, base, rope_scaling)
    return _ROPE_CACHE[key]


def _new_rope(head_size: int, rotary_dim: int, max_position: int, base: float,
              rope_scaling: Optional[Dict[str, Any]]) -> RotaryEmbedding:
    original = None
    if rope_scaling:
        original = rope_scaling.get("original_max_position_embeddings")
    table = max_position
    if rope_scaling and rope_scaling.get("rope_type") == "dynamic" and original is None:
        original = max_position
    return RotaryEmbedding(head_size, rotary_dim, table, base, rope_scaling, original)
