"""Rotary position embedding (HF "rotate_half" / NeoX layout), with HF's rope scalings.

cos/sin are precomputed in fp32 for every position up to `max_position` (computed exactly as
HF computes them: fp32 inverse frequencies times fp32 positions) and indexed by the flat
`positions` tensor of the batch, so prefill, chunked prefill and decode share one table.

Supported `rope_type`s: "default", "linear", "llama3", "dynamic" (HF's dynamic NTK applied per
position: positions inside the original context use the plain frequencies, as HF does), "yarn"
(HF's ramp between interpolated and extrapolated frequencies, cos/sin scaled by its attention
factor) and "longrope" (Phi-3: short factors, or the long ones for a forward whose last position
is past `original_max_position_embeddings`, as HF picks them per forward; cos/sin scaled by the
attention factor). Anything else is refused by `check_rope_config` with one line naming it.
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


SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "dynamic", "yarn", "longrope")


def get_rope_config(config: Any, layer_type: Optional[str] = None) -> Tuple[float, Optional[Dict[str, Any]]]:
    """(rope_theta, scaling dict or None) from an HF config object or dict.

    transformers 5 keeps everything in `rope_parameters` (with `rope_theta` inside); older
    configs have top-level `rope_theta` and `rope_scaling`. Both are read. Models whose layer
    kinds have their own RoPE (Gemma 3: "sliding_attention" / "full_attention") keep one dict
    per kind in `rope_parameters`; `layer_type` picks one (default: the full-attention one).
    """
    params = _cfg_get(config, "rope_parameters")
    scaling = _cfg_get(config, "rope_scaling")
    theta = _cfg_get(config, "rope_theta")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        params = params.get(layer_type or "full_attention") or params.get("full_attention") or {}
    if isinstance(params, dict) and params:
        if "rope_theta" in params:
            theta = params["rope_theta"]
        if params.get("rope_type", params.get("type", "default")) != "default":
            scaling = params
    if theta is None:
        theta = 10000.0
    if isinstance(scaling, dict):
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type == "su":  # Phi-3's first name for longrope (HF reads it so)
            rope_type = "longrope"
        scaling = None if rope_type == "default" else dict(scaling, rope_type=rope_type)
    else:
        scaling = None
    if scaling is not None and "original_max_position_embeddings" not in scaling:
        orig = _cfg_get(config, "original_max_position_embeddings")
        if orig is not None:  # Phi-3 keeps it at the top level
            scaling["original_max_position_embeddings"] = orig
    return float(theta), scaling


def check_rope_config(config: Any) -> None:
    """Refuses a RoPE scaling this module cannot compute, with one line naming the field."""
    for layer_type in (None, "sliding_attention"):
        _theta, scaling = get_rope_config(config, layer_type)
        rope_type = (scaling or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"config.json rope_scaling.rope_type={rope_type!r} is not supported; "
                             f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")


def partial_rotary_factor(config: Any) -> float:
    """The rotated fraction of each head (`partial_rotary_factor`, top level or in rope_parameters)."""
    params = _cfg_get(config, "rope_parameters") or {}
    value = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    if value is None:
        value = _cfg_get(config, "partial_rotary_factor", 1.0)
    return float(value if value is not None else 1.0)


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


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(base: float, dim: int, scaling: Dict[str, Any], max_position: int) -> Tuple[torch.Tensor, float]:
    """HF `_compute_yarn_parameters`: (inverse frequencies, attention factor)."""
    factor = float(scaling["factor"])
    orig = int(scaling.get("original_max_position_embeddings") or max_position)
    attention_factor = scaling.get("attention_factor")
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def _longrope_attention_factor(scaling: Dict[str, Any], max_position: int) -> float:
    factor = scaling.get("factor")
    orig = int(scaling["original_max_position_embeddings"])
    if factor is None:
        factor = max_position / orig
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))


class RotaryEmbedding(nn.Module):
    # longrope: cos/sin differ by forward (short or long factors), so the fused decode stack,
    # which reads `cos_cached` directly, does not take these layers
    per_forward_tables = False

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 rope_scaling: Optional[Dict[str, Any]] = None, original_max_position: Optional[int] = None,
                 config_max_position: Optional[int] = None, is_neox_style: bool = True):
        super().__init__()
        # False: GLM's interleaved layout (pairs 2i, 2i+1 rotate with frequency i; torch ops only)
        self.is_neox_style = is_neox_style
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.base = base
        self.rope_scaling = rope_scaling
        self.max_position = max_position
        rope_type = (rope_scaling or {}).get("rope_type", "default")
        inv_freq = _base_inv_freq(base, rotary_dim)
        t = torch.arange(max_position, dtype=torch.int64).to(torch.float)
        scale = 1.0  # HF's attention_scaling, applied to cos and sin
        self.long_tables = None
        if rope_type == "default":
            freqs = t[:, None] * inv_freq[None, :]
        elif rope_type == "linear":
            freqs = t[:, None] * (inv_freq / float(rope_scaling["factor"]))[None, :]
        elif rope_type == "llama3":
            freqs = t[:, None] * _llama3_inv_freq(inv_freq, rope_scaling)[None, :]
        elif rope_type == "dynamic":
            freqs = self._dynamic_freqs(t, rope_scaling, original_max_position or max_position)
        elif rope_type == "yarn":
            inv, scale = _yarn_inv_freq(base, rotary_dim, rope_scaling, config_max_position or max_position)
            freqs = t[:, None] * inv[None, :]
        elif rope_type == "longrope":
            scale = _longrope_attention_factor(rope_scaling, config_max_position or max_position)
            exps = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
            short = 1.0 / (torch.tensor(rope_scaling["short_factor"], dtype=torch.float32) * base ** exps)
            long = 1.0 / (torch.tensor(rope_scaling["long_factor"], dtype=torch.float32) * base ** exps)
            freqs = t[:, None] * short[None, :]
            long_emb = torch.cat((t[:, None] * long[None, :],) * 2, dim=-1)
            self.long_tables = ((long_emb.cos() * scale).contiguous(), (long_emb.sin() * scale).contiguous())
            self.original_max_position = int(rope_scaling["original_max_position_embeddings"])
            self.per_forward_tables = True
        else:
            raise ValueError(f"config.json rope_scaling.rope_type={rope_type!r} is not supported; "
                             f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if scale != 1.0:
            cos, sin = cos * scale, sin * scale
        self.register_buffer("cos_cached", cos, persistent=False)
        self.register_buffer("sin_cached", sin, persistent=False)
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

    def tables(self, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The fp32 cos/sin tables this forward uses: for longrope, the long factors' when the
        forward's last position is past the original context (HF decides per forward: seq_len =
        max position + 1 > original), else the short ones."""
        if self.long_tables is not None and positions.numel() and int(positions.max()) + 1 > self.original_max_position:
            return self.long_tables
        return self.cos_cached, self.sin_cached

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos/sin rows of `positions` ([T, 1, rotary_dim]); one instance serves every layer
        (see get_rope), so the rows are gathered once per forward and reused."""
        if self._last is not None and self._last[0] is positions and self._last[1] == dtype:
            return self._last[2]
        self.check_positions(positions)
        cos_t, sin_t = self.tables(positions)
        cos = cos_t.index_select(0, positions).to(dtype)[:, None, :]
        sin = sin_t.index_select(0, positions).to(dtype)[:, None, :]
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

    def _forward_interleaved(self, positions, query, key, cos, sin):
        """HF GLM: cos/sin of frequency i on dims 2i and 2i+1, rotate (x0, x1) -> (-x1, x0)."""
        T, rd = positions.shape[0], self.rotary_dim
        cos = cos[..., : rd // 2].repeat_interleave(2, dim=-1)
        sin = sin[..., : rd // 2].repeat_interleave(2, dim=-1)

        def rotate(x):
            x = x.view(T, -1, self.head_size)
            x_rot = x[..., :rd]
            pairs = torch.stack((-x_rot[..., 1::2], x_rot[..., 0::2]), dim=-1).flatten(-2)
            out = x_rot * cos + pairs * sin
            if rd < self.head_size:
                out = torch.cat((out, x[..., rd:]), dim=-1)
            return out

        return rotate(query).reshape(query.shape), rotate(key).reshape(key.shape)

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        """query: [T, n_q * head_size], key: [T, n_kv * head_size] -> rotated, same shapes."""
        if (self.is_neox_style and cpu_ops.enabled(query) and query.dim() == 2 and key.dim() == 2 and key.dtype == query.dtype
                and query.stride(-1) == 1 and key.stride(-1) == 1 and positions.dtype == torch.int64):
            self.check_positions(positions)
            cos_t, sin_t = self.tables(positions)
            return torch.ops.sgl_kernel.rotary_embedding(positions.contiguous(), query, key, self.head_size,
                                                         cos_t, sin_t)
        cos, sin = self._cos_sin(positions, query.dtype)
        if not self.is_neox_style:
            return self._forward_interleaved(positions, query, key, cos, sin)
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
             rope_scaling: Optional[Dict[str, Any]] = None,
             config_max_position: Optional[int] = None, is_neox_style: bool = True) -> RotaryEmbedding:
    """The rotary embedding for these settings; equal settings share one instance (one table,
    and cos/sin gathered once per forward for all layers). `config_max_position`: the config's
    `max_position_embeddings` (yarn/longrope derive their default factors from it; `max_position`
    is the table's length, which may be longer)."""
    key = repr((head_size, rotary_dim, max_position, base, sorted((rope_scaling or {}).items()),
                config_max_position, is_neox_style, str(torch.get_default_device())))
    if key not in _ROPE_CACHE:
        _ROPE_CACHE[key] = _new_rope(head_size, rotary_dim, max_position, base, rope_scaling, config_max_position,
                                     is_neox_style)
    return _ROPE_CACHE[key]


def _new_rope(head_size: int, rotary_dim: int, max_position: int, base: float,
              rope_scaling: Optional[Dict[str, Any]], config_max_position: Optional[int] = None,
              is_neox_style: bool = True) -> RotaryEmbedding:
    original = None
    if rope_scaling:
        original = rope_scaling.get("original_max_position_embeddings")
    table = max_position
    if rope_scaling and rope_scaling.get("rope_type") == "dynamic" and original is None:
        original = max_position
    return RotaryEmbedding(head_size, rotary_dim, table, base, rope_scaling, original, config_max_position,
                           is_neox_style)
