"""Shared by the sgl-kernel op tests: run a test once per kernel set this machine has, with
uninitialised memory poisoned (so a kernel that reads what it never wrote fails)."""

import pytest
import torch

import sgl_kernel


@pytest.fixture(params=sgl_kernel.supported_isas() or ["none"])
def isa(request):
    before = sgl_kernel.isa()
    sgl_kernel.use_isa(request.param)
    torch.use_deterministic_algorithms(True, warn_only=True)
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield request.param
    torch.utils.deterministic.fill_uninitialized_memory = fill
    torch.use_deterministic_algorithms(False)
    sgl_kernel.use_isa(before)
