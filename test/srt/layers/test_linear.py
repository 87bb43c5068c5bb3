"""Merged projections: each HF tensor lands in its own slice; shape mismatches are rejected."""

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear


def test_qkv_shards_equal_separate_projections():
    g = torch.Generator().manual_seed(0)
    wq, wk, wv = (torch.randn(n, 8, generator=g) for n in (12, 6, 6))
    bq, bk, bv = (torch.randn(n, generator=g) for n in (12, 6, 6))
    layer = QKVParallelLinear(8, 3, 4, 2, bias=True)
    for shard, w, b in (("q", wq, bq), ("k", wk, bk), ("v", wv, bv)):
        layer.weight_loader(layer.weight, w, shard)
        layer.weight_loader(layer.bias, b, shard)
    x = torch.randn(5, 8, generator=g)
    q, k, v = layer(x).split([12, 6, 6], dim=-1)
    torch.testing.assert_close(q, F.linear(x, wq, bq))
    torch.testing.assert_close(k, F.linear(x, wk, bk))
    torch.testing.assert_close(v, F.linear(x, wv, bv))
    with pytest.raises(ValueError, match="Weight shape mismatch"):
        layer.weight_loader(layer.weight, torch.zeros(5, 8), "k")


def test_gate_up_and_silu_and_mul():
    g = torch.Generator().manual_seed(1)
    wg, wu = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    layer = MergedColumnParallelLinear(3, [4, 4])
    layer.weight_loader(layer.weight, wg, 0)
    layer.weight_loader(layer.weight, wu, 1)
    x = torch.randn(2, 3, generator=g)
    torch.testing.assert_close(SiluAndMul()(layer(x)), F.silu(x @ wg.T) * (x @ wu.T))
