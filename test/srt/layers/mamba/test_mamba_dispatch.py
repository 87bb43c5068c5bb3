"""get_mamba_ops: torch references on CPU by default, Triton kernels on request, same call shape."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from sglang.srt.layers.mamba import torch_ops
from sglang.srt.layers.mamba.dispatch import get_mamba_ops
from sglang.srt.layers.mamba.ops import selective_state_update as triton_ssu


def test_cpu_defaults_to_torch_and_triton_can_be_forced():
    ops = get_mamba_ops("cpu")
    assert ops.backend == "torch" and ops.selective_state_update is torch_ops.selective_state_update
    tri = get_mamba_ops(torch.device("cpu"), backend="triton")
    assert tri.backend == "triton" and tri.selective_state_update is triton_ssu.selective_state_update
    # Same call, same result (one decode step, two heads sharing one B/C group).
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little") % (2**31 - 1))
    state = torch.randn(2, 2, 4, 8, generator=g)
    args = (torch.randn(2, 2, 4, generator=g), torch.rand(2, 2, 4, generator=g),
            -torch.rand(2, 4, 8, generator=g), torch.randn(2, 1, 8, generator=g), torch.randn(2, 1, 8, generator=g))
    s1, s2 = state.clone(), state.clone()
    torch.testing.assert_close(ops.selective_state_update(s1, *args), tri.selective_state_update(s2, *args),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s1, s2, atol=1e-5, rtol=1e-5)


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="Unknown Mamba ops backend 'cuda_graph'"):
        get_mamba_ops("cpu", backend="cuda_graph")
