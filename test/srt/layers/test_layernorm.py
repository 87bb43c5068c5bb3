"""RMSNorm vs HF's LlamaRMSNorm (fp32 and bf16), and the fused residual form."""

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from sglang.srt.layers.layernorm import RMSNorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_hf(dtype):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, generator=g)
    ours, ref = RMSNorm(64, eps=1e-5), LlamaRMSNorm(64, eps=1e-5)
    ours.weight.data.copy_(w)
    ref.weight.data.copy_(w)
    ours, ref = ours.to(dtype), ref.to(dtype)
    x = (torch.randn(7, 64, generator=g) * 3).to(dtype)
    torch.testing.assert_close(ours(x), ref(x), atol=0, rtol=0)


def test_fused_residual():
    g = torch.Generator().manual_seed(1)
    norm = RMSNorm(32, eps=1e-6)
    norm.weight.data.copy_(torch.randn(32, generator=g))
    x, r = torch.randn(5, 32, generator=g), torch.randn(5, 32, generator=g)
    out, new_res = norm(x, r)
    torch.testing.assert_close(new_res, x + r)
    torch.testing.assert_close(out, norm(x + r))
