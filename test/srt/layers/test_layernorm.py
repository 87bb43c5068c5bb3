"""RMSNorm vs HF's LlamaRMSNorm (fp32 and bf16), and the fused residual form.

The torch path is bitwise HF's; sgl-kernel's fused op sums the squares in another order, so it
is held to one rounding step of the dtype instead."""

import contextlib

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from sglang.srt.layers import cpu_ops
from sglang.srt.layers.layernorm import RMSNorm

PATHS = ["torch"] + (["sgl-kernel"] if cpu_ops.available() else [])
ONE_ROUNDING = {torch.float32: dict(atol=1e-6, rtol=3e-7), torch.bfloat16: dict(atol=1e-2, rtol=8e-3)}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_hf(dtype, path):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, generator=g)
    ours, ref = RMSNorm(64, eps=1e-5), LlamaRMSNorm(64, eps=1e-5)
    ours.weight.data.copy_(w)
    ref.weight.data.copy_(w)
    ours, ref = ours.to(dtype), ref.to(dtype)
    x = (torch.randn(7, 64, generator=g) * 3).to(dtype)
    with cpu_ops.torch_fallbacks() if path == "torch" else contextlib.nullcontext():
        got = ours(x)
    tol = dict(atol=0, rtol=0) if path == "torch" else ONE_ROUNDING[dtype]
    torch.testing.assert_close(got, ref(x), **tol)


def test_fused_residual():
    g = torch.Generator().manual_seed(1)
    norm = RMSNorm(32, eps=1e-6)
    norm.weight.data.copy_(torch.randn(32, generator=g))
    x, r = torch.randn(5, 32, generator=g), torch.randn(5, 32, generator=g)
    out, new_res = norm(x, r)
    torch.testing.assert_close(new_res, x + r)
    torch.testing.assert_close(out, norm(x + r))
