"""Rotary embedding vs HF's LlamaRotaryEmbedding + apply_rotary_pos_emb for each rope type,
and reading rope parameters from both config formats (transformers 5 `rope_parameters`,
older `rope_theta` + `rope_scaling`)."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from sglang.srt.layers.rotary_embedding import get_rope, get_rope_config

HEAD, NQ, NKV = 16, 4, 2
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
}


def _hf(config, positions, q, k):
    rope = LlamaRotaryEmbedding(config)
    cos, sin = rope(q, positions[None, :])
    qh = q.view(1, -1, NQ, HEAD).transpose(1, 2)
    kh = k.view(1, -1, NKV, HEAD).transpose(1, 2)
    qo, ko = apply_rotary_pos_emb(qh, kh, cos, sin)
    return qo.transpose(1, 2).reshape(q.shape), ko.transpose(1, 2).reshape(k.shape)


def _config(scaling, max_pos=128):
    kw = dict(hidden_size=NQ * HEAD, num_attention_heads=NQ, num_key_value_heads=NKV, head_dim=HEAD,
              max_position_embeddings=max_pos, rope_theta=10000.0)
    if scaling:
        kw["rope_scaling"] = scaling
    return LlamaConfig(**kw)


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_matches_hf(kind):
    config = _config(SCALINGS[kind])
    theta, scaling = get_rope_config(config)
    rope = get_rope(HEAD, HEAD, 128, theta, scaling)
    g = torch.Generator().manual_seed(0)
    positions = torch.randperm(128, generator=g)[:50]
    q, k = torch.randn(50, NQ * HEAD, generator=g), torch.randn(50, NKV * HEAD, generator=g)
    oq, ok = rope(positions, q, k)
    hq, hk = _hf(config, positions, q, k)
    torch.testing.assert_close(oq, hq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ok, hk, atol=1e-5, rtol=1e-5)
    if kind in ("linear", "llama3"):  # the scaling really changes something (dynamic: only beyond the context)
        plain = get_rope(HEAD, HEAD, 128, theta, None)(positions, q, k)[0]
        assert (plain - oq).abs().max() > 1e-3


def test_dynamic_beyond_original_context_matches_hf_at_the_last_position():
    # HF rescales the base with the current sequence length; our per-position table equals it
    # for the newest token (the one a decode step computes).
    config = _config(SCALINGS["dynamic"], max_pos=32)
    theta, scaling = get_rope_config(config)
    rope = get_rope(HEAD, HEAD, 32, theta, scaling)
    rope_long = get_rope(HEAD, HEAD, 64, theta, dict(scaling, original_max_position_embeddings=32))
    g = torch.Generator().manual_seed(1)
    L = 48
    q, k = torch.randn(L, NQ * HEAD, generator=g), torch.randn(L, NKV * HEAD, generator=g)
    hq, _ = _hf(config, torch.arange(L), q, k)
    oq, _ = rope_long(torch.arange(L), q, k)
    torch.testing.assert_close(oq[-1], hq[-1], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="exceeds the rotary table"):
        rope(torch.tensor([40]), q[:1], k[:1])


def test_rope_config_formats():
    from sglang.srt.layers.rotary_embedding import check_rope_config

    assert get_rope_config({"rope_theta": 5.0}) == (5.0, None)
    assert get_rope_config({}) == (10000.0, None)
    old = {"rope_theta": 7.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert get_rope_config(old) == (7.0, {"type": "linear", "factor": 2.0, "rope_type": "linear"})
    new = {"rope_parameters": {"rope_theta": 9.0, "rope_type": "llama3", "factor": 8.0}}
    theta, scaling = get_rope_config(new)
    assert theta == 9.0 and scaling["rope_type"] == "llama3" and scaling["factor"] == 8.0
    assert get_rope_config({"rope_parameters": {"rope_theta": 3.0, "rope_type": "default"}}) == (3.0, None)
    # Phi-3's first checkpoints called longrope "su" (HF reads it as longrope)
    su = get_rope_config({"rope_scaling": {"type": "su", "short_factor": [1.0], "long_factor": [2.0]}})[1]
    assert su["rope_type"] == "longrope"
    with pytest.raises(ValueError, match=r"rope_scaling.rope_type='ntk_by_parts' is not supported"):
        get_rope(HEAD, HEAD, 16, 10000.0, {"rope_type": "ntk_by_parts"})
    with pytest.raises(ValueError, match=r"^config.json rope_scaling.rope_type='ntk_by_parts' is not supported"):
        check_rope_config({"rope_scaling": {"rope_type": "ntk_by_parts", "factor": 2.0}})


def test_equal_settings_share_one_instance_and_cos_sin_per_positions():
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding, get_rope

    a = get_rope(16, 16, 128, 10000.0)
    assert get_rope(16, 16, 128, 10000.0) is a
    assert get_rope(16, 16, 128, 500000.0) is not a
    pos = torch.tensor([0, 5, 9])
    q, k = torch.randn(3, 32), torch.randn(3, 16)
    first = a(pos, q, k)
    # A new positions tensor with other values must not reuse the previous rows.
    pos2 = torch.tensor([1, 2, 3])
    fresh = RotaryEmbedding(16, 16, 128, 10000.0)  # not shared: nothing cached
    for got, want in zip(a(pos2, q, k), fresh(pos2, q, k)):
        torch.testing.assert_close(got, want)
    assert not torch.equal(a(pos2, q, k)[0], first[0])
    torch.testing.assert_close(a(pos, q, k)[0], first[0])
