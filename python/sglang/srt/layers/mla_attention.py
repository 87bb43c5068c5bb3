"""Multi-head latent attention (DeepSeek-V2/V3), as HF transformers computes it, over a KV pool
that keeps one latent per token (`MLATokenToKVPool`), not K and V per head.

Per token (H heads, Dn = qk_nope_head_dim, R = qk_rope_head_dim, Dv = v_head_dim, L = kv_lora_rank):

    q          = q_proj(x)  or  q_b_proj(q_a_layernorm(q_a_proj(x)))        [H, Dn + R]
    c, k_pe    = kv_a_proj_with_mqa(x) split (L, R);  c = kv_a_layernorm(c)  the latent
    q_pe, k_pe = RoPE on the rope parts only (k_pe is one head, shared)
    k_h = [W_UK_h c, k_pe],  v_h = W_UV_h c   with kv_b_proj = [W_UK_h; W_UV_h] per head

The pool stores [c, k_pe] (L + R values per token and layer). Two ways to attend over it:

* expanded (a prefill batch whose requests have no cached prefix): k_h and v_h are built from the
  new tokens' latents through kv_b_proj and attended per head, as HF does;
* absorbed (decode, and extends over a cached prefix or a chunk): W_UK is folded into the query,
  q_lat_h = W_UK_h^T q_nope_h, so q_h . k_h = [q_lat_h, q_pe_h] . [c, k_pe]: one KV head of
  L + R values whose V is its first L (`RadixAttention` with num_kv_heads=1, v_head_dim=L); the
  output o_lat_h is taken back to v_head_dim by W_UV_h (folded into the output). Both are the
  same sums in another order.

RoPE: DeepSeek's checkpoints lay each rope part out as interleaved pairs (x0, x1), (x2, x3), ...
rotated by one frequency each (HF: V2 always, V3 when `rope_interleave`, its default). The pairs
are split into halves first (evens, then odds) and rotated NeoX-style, which gives the same
dot products; HF's V3 does exactly this, its V2 rotates in fp32 (done here for V2 too). Yarn
scaling as DeepSeek's configs use it: cos/sin scaled by mscale(factor, mscale) /
mscale(factor, mscale_all_dim), and the softmax scale by mscale(factor, mscale_all_dim)^2.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import get_rope, get_rope_config


def _cfg(config: Any, key: str, default=None):
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def mla_softmax_scale(config: Any) -> float:
    """HF's `yarn_apply_mscale`: (Dn + R)^-0.5, times mscale(factor, mscale_all_dim)^2 under a scaling."""
    scale = (int(config.qk_nope_head_dim) + int(config.qk_rope_head_dim)) ** -0.5
    _theta, scaling = get_rope_config(config)
    if scaling is not None:
        all_dim = scaling.get("mscale_all_dim") or 0
        if all_dim:
            m = yarn_mscale(float(scaling["factor"]), float(all_dim))
            scale = scale * m * m
    return scale


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (x0, x2, ..., x1, x3, ...) along the last dim."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


class MLAAttention(nn.Module):
    def __init__(self, config: Any, layer_id: int, model_config=None, rope_interleaved: bool = True,
                 rope_in_fp32: bool = False):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = H = int(config.num_attention_heads)
        self.qk_nope_head_dim = Dn = int(config.qk_nope_head_dim)
        self.qk_rope_head_dim = R = int(config.qk_rope_head_dim)
        self.v_head_dim = Dv = int(config.v_head_dim)
        self.kv_lora_rank = L = int(config.kv_lora_rank)
        self.q_lora_rank = _cfg(config, "q_lora_rank")
        hidden = int(config.hidden_size)
        bias = bool(_cfg(config, "attention_bias", False))
        eps = float(_cfg(config, "rms_norm_eps", 1e-6))
        if self.q_lora_rank is None:
            self.q_proj = ReplicatedLinear(hidden, H * (Dn + R))
        else:
            self.q_a_proj = ReplicatedLinear(hidden, int(self.q_lora_rank), bias=bias)
            self.q_a_layernorm = RMSNorm(int(self.q_lora_rank), eps=eps)
            self.q_b_proj = ReplicatedLinear(int(self.q_lora_rank), H * (Dn + R))
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden, L + R, bias=bias)
        self.kv_a_layernorm = RMSNorm(L, eps=eps)
        self.kv_b_proj = ReplicatedLinear(L, H * (Dn + Dv))
        self.o_proj = ReplicatedLinear(H * Dv, hidden, bias=bias)
        theta, scaling = get_rope_config(config)
        max_pos = int(_cfg(config, "max_position_embeddings", 2048))
        table = max(max_pos, int(model_config.context_len)) if model_config is not None else max_pos
        self.rotary_emb = get_rope(R, R, table, theta, scaling, max_pos)
        self.rope_interleaved = rope_interleaved
        self.rope_in_fp32 = rope_in_fp32
        self.scaling = mla_softmax_scale(config)
        # absorbed: one KV head (the latent) whose V is its first L values
        self.attn_mqa = RadixAttention(H, L + R, self.scaling, 1, layer_id=layer_id, v_head_dim=L)
        # expanded: per-head K [Dn + R] and V [Dv], attended without the pool (no prefix)
        self.attn_mha = RadixAttention(H, Dn + R, self.scaling, H, layer_id=layer_id, v_head_dim=Dv)
        self.w_kc = None  # [H, Dn, L]: W_UK per head (absorbed into the query), after loading
        self.w_vc = None  # [H, L, Dv]: W_UV^T per head (absorbed into the output)

    def post_load_weights(self) -> None:
        """Splits kv_b_proj's weight into the per-head up-projections the absorbed form uses."""
        H, Dn, Dv, L = self.num_heads, self.qk_nope_head_dim, self.v_head_dim, self.kv_lora_rank
        w = self.kv_b_proj.weight.detach().view(H, Dn + Dv, L)
        self.w_kc = w[:, :Dn].contiguous()
        self.w_vc = w[:, Dn:].transpose(1, 2).contiguous()

    def _rope(self, positions: torch.Tensor, q_pe: torch.Tensor, k_pe: torch.Tensor):
        """q_pe [T, H, R], k_pe [T, R] -> rotated (halves layout), in their dtype."""
        T, H, R = q_pe.shape
        dtype = q_pe.dtype
        if self.rope_interleaved:
            q_pe, k_pe = deinterleave(q_pe), deinterleave(k_pe)
        if self.rope_in_fp32:
            q_pe, k_pe = q_pe.float(), k_pe.float()
        q, k = self.rotary_emb(positions, q_pe.reshape(T, H * R).contiguous(), k_pe.reshape(T, R).contiguous())
        return q.view(T, H, R).to(dtype), k.view(T, R).to(dtype)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, forward_batch) -> torch.Tensor:
        T, H, Dn, R, L = x.shape[0], self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank
        if self.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(T, H, Dn + R)
        latent = self.kv_a_proj_with_mqa(x)
        c = self.kv_a_layernorm(latent[:, :L].contiguous())
        q_pe, k_pe = self._rope(positions, q[..., Dn:], latent[:, L:])
        kv_latent = torch.cat((c, k_pe), dim=-1)  # what the pool keeps
        if self._expand(forward_batch):
            kv = self.kv_b_proj(c).view(T, H, Dn + self.v_head_dim)
            k = torch.cat((kv[..., :Dn], k_pe[:, None, :].expand(T, H, R)), dim=-1)
            forward_batch.token_to_kv_pool.set_kv_buffer(self.layer_id, forward_batch.out_cache_loc, kv_latent)
            q_full = torch.cat((q[..., :Dn], q_pe), dim=-1)
            o = self.attn_mha(q_full.reshape(T, -1), k.reshape(T, -1), kv[..., Dn:].reshape(T, -1), forward_batch,
                              save_kv_cache=False)
            return self.o_proj(o)
        q_lat = torch.bmm(q[..., :Dn].transpose(0, 1), self.w_kc).transpose(0, 1)  # [T, H, L]
        q_abs = torch.cat((q_lat, q_pe), dim=-1).reshape(T, H * (L + R))
        o_lat = self.attn_mqa(q_abs, kv_latent, kv_latent[:, :L], forward_batch)  # [T, H * L]
        o = torch.bmm(o_lat.view(T, H, L).transpose(0, 1), self.w_vc).transpose(0, 1)  # [T, H, Dv]
        return self.o_proj(o.reshape(T, H * self.v_head_dim))

    @staticmethod
    def _expand(forward_batch) -> bool:
        """A prefill batch with no cached prefix: per-head K/V of the new tokens are all it reads."""
        return forward_batch.forward_mode.is_extend() and not any(forward_batch.extend_prefix_lens_cpu)
