"""sgl-kernel's GGUF ops against their reference, dequantize-then-matmul, on every kernel set this
CPU runs (forced with sgl_kernel.use_isa) and both paths of `gguf_linear` (the row kernel for
few activation rows, dequantized panels over the panel GEMM for many; forced with
row_kernel_max_rows). The reference dequantizes with gguf-py (`gguf.quants.dequantize`, llama.cpp's
formulas in numpy); K-quant blocks are random bytes with small scales (gguf-py cannot quantize
them), which llama.cpp's layouts accept as they are."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sglang.srt.configs.gguf_file import GGML_TYPES
from sglang.srt.layers import cpu_ops
from sglang.test.gguf_files import random_blocks

needs_kernel = pytest.mark.skipif(not cpu_ops.available(), reason="sgl-kernel is not built")

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
TYPE_ID = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}


def _isas():
    import sgl_kernel

    return sgl_kernel.supported_isas() if cpu_ops.available() else []


@pytest.fixture
def on_isa(request):
    import sgl_kernel

    before = sgl_kernel.isa()
    yield lambda name: sgl_kernel.use_isa(name)
    sgl_kernel.use_isa(before)


def _reference(raw: np.ndarray, type_name: str, rows: int, cols: int) -> torch.Tensor:
    from gguf.quants import dequantize

    values = dequantize(raw.view(np.uint8), TYPE_ID[type_name])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(rows, cols))


@needs_kernel
@pytest.mark.parametrize("isa", _isas())
def test_every_type_on_every_path_matches_dequantize_then_matmul(isa, on_isa):
    on_isa(isa)
    rng = np.random.default_rng(1)
    N, K = 64, 512
    for type_name in TYPES:
        raw = random_blocks(type_name, N, K, rng)
        q = torch.from_numpy(raw)
        w = _reference(raw, type_name, N, K)
        tid = TYPE_ID[type_name]
        assert torch.equal(torch.ops.sgl_kernel.gguf_dequantize(q, tid, K), w), type_name
        bias = torch.randn(N)
        for rows, row_kernel_max_rows in ((1, 16), (3, 16), (13, 16), (13, 0), (40, 0)):
            x = torch.randn(rows, K)
            want = F.linear(x.double(), w.double(), bias.double()).float()
            got = torch.ops.sgl_kernel.gguf_linear(x, q, tid, K, bias, None, True, row_kernel_max_rows)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4,
                                       msg=lambda m: f"{isa} {type_name} rows={rows}: {m}")


@needs_kernel
@pytest.mark.parametrize("isa", _isas())
@pytest.mark.parametrize("row_kernel_max_rows", [64, 0])
def test_bf16_activations_round_like_the_bf16_linear(isa, row_kernel_max_rows, on_isa):
    """bf16 x: fp32 sums of the exact dequantized weights, rounded once to bf16 (or widened: the
    fp32 LM head's `round_to_x`)."""
    on_isa(isa)
    rng = np.random.default_rng(2)
    N, K = 96, 256
    raw = random_blocks("Q4_K", N, K, rng)
    w = _reference(raw, "Q4_K", N, K)
    x = torch.randn(7, K).to(torch.bfloat16)
    exact = F.linear(x.double(), w.double())
    q = torch.from_numpy(raw)
    got = torch.ops.sgl_kernel.gguf_linear(x, q, TYPE_ID["Q4_K"], K, None, None, True, row_kernel_max_rows)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), exact.float().to(torch.bfloat16).float(), atol=1e-2, rtol=1e-2)
    wide = torch.ops.sgl_kernel.gguf_linear(x, q, TYPE_ID["Q4_K"], K, None, torch.float32, True, row_kernel_max_rows)
    assert wide.dtype == torch.float32 and torch.equal(wide, wide.to(torch.bfloat16).float())
    sums = torch.ops.sgl_kernel.gguf_linear(x, q, TYPE_ID["Q4_K"], K, None, torch.float32, False, row_kernel_max_rows)
    torch.testing.assert_close(sums.double(), exact, atol=1e-4, rtol=1e-4)


@needs_kernel
def test_bad_blocks_are_refused_with_the_reason():
    q = torch.zeros(4, 20, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="GGUF tensor type 20 is not supported"):
        torch.ops.sgl_kernel.gguf_linear(torch.randn(1, 32), q, 20, 32, None)
    with pytest.raises(RuntimeError, match="take 40 bytes per row"):
        torch.ops.sgl_kernel.gguf_linear(torch.randn(1, 64), q, TYPE_ID["Q4_1"], 64, None)


def test_merged_layer_with_a_type_per_part_and_the_torch_fallback_agree():
    """A qkv_proj whose q/k are Q4_K and v Q6_K (a Q4_K_M file): one segment per type, joined
    where neighbours share one; the kernel path and the torch fallback (dequantize once, F.linear)
    give the reference; the embedding lookup dequantizes the rows it gathers."""
    from sglang.srt.layers.gguf_linear import GGUFWeight, gguf_embedding, gguf_linear

    rng = np.random.default_rng(3)
    K = 256
    parts = [("Q4_K", 64), ("Q4_K", 32), ("Q6_K", 32)]
    weight = GGUFWeight(128, K)
    refs, start = [], 0
    for type_name, rows in parts:
        raw = random_blocks(type_name, rows, K, rng)
        refs.append(_reference(raw, type_name, rows, K))
        weight.add(start, TYPE_ID[type_name], torch.from_numpy(raw))
        start += rows
    weight.segments.reverse()  # out of order: finish() sorts
    weight.finish("qkv_proj")
    assert weight.type_names() == ["Q4_K", "Q6_K"]
    w = torch.cat(refs)
    x = torch.randn(5, K)
    bias = torch.randn(128)
    want = F.linear(x.double(), w.double(), bias.double()).float()
    torch.testing.assert_close(gguf_linear(x, weight, bias), want, atol=1e-4, rtol=1e-4)
    with cpu_ops.torch_fallbacks():
        torch.testing.assert_close(gguf_linear(x, weight, bias), want, atol=1e-4, rtol=1e-4)
    ids = torch.tensor([[5, 0], [127, 64]])
    torch.testing.assert_close(gguf_embedding(ids, weight, torch.float32), w[ids])


def test_uncovered_rows_are_an_error():
    from sglang.srt.layers.gguf_linear import GGUFWeight

    weight = GGUFWeight(64, 32)
    weight.add(0, TYPE_ID["Q8_0"], torch.zeros(32, 34, dtype=torch.uint8))
    with pytest.raises(ValueError, match="cover 32 of 64 output rows"):
        weight.finish("o_proj")
