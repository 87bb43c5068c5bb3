"""--quantization w8a16_int8: the per-channel int8 weights, the layers' use of them, and the default
model's greedy text (the README prompt), int8 and from its GGUF blocks, against the unquantized
bf16 model."""

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers import cpu_ops
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.quantization import quantize_linear_weights_int8, quantize_per_channel_int8

needs_kernel = pytest.mark.skipif(not cpu_ops.available(), reason="sgl-kernel is not built")


def test_per_channel_error_is_at_most_half_a_step():
    w = torch.randn(33, 70) * torch.linspace(0.01, 3, 33)[:, None]
    w[5] = 0.0  # an all-zero row must not divide by zero
    q, scale = quantize_per_channel_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (33,) and int(q.abs().max()) <= 127
    err = (w - q.float() * scale[:, None]).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-7).all())
    assert torch.equal(q[5], torch.zeros(70, dtype=torch.int8))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_uses_int8_weights_for_decode_rows_and_float_weights_beyond(dtype):
    layer = ReplicatedLinear(96, 40, bias=True)
    layer.weight.data.copy_(torch.randn(40, 96))
    layer.bias.data.copy_(torch.randn(40))
    layer = layer.to(dtype)
    assert quantize_linear_weights_int8(layer) == 1
    q, scale = layer.int8_weight
    dequant = q.float() * scale[:, None]
    small = torch.randn(cpu_ops.linear_max_rows(torch.int8), 96).to(dtype)
    want = F.linear(small.float(), dequant, layer.bias.float()).to(dtype)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    got = layer(small)
    torch.testing.assert_close(got, want, **tol)  # the dequantized weights ...
    if dtype == torch.float32:  # ... and not the float ones (quantization error >> the tolerance)
        assert (got - F.linear(small, layer.weight, layer.bias)).abs().max() > 1e-3
    big = torch.randn(cpu_ops.linear_max_rows(torch.int8) + 1, 96).to(dtype)
    with cpu_ops.torch_fallbacks():
        float_path = F.linear(big, layer.weight, layer.bias)
    torch.testing.assert_close(layer(big), float_path, atol=2e-2, rtol=2e-2)  # prefill: float weights


@needs_kernel
@pytest.mark.server
def test_default_model_greedy_text_and_logprobs_match_bf16():
    """The default model's quantized paths against its unquantized bf16 reference (the dense copy
    of the dequantized Q4_1 weights, in bf16): served from its GGUF file (`--load-format gguf`; Q4_1 blocks multiplied
    by sgl_kernel.gguf_linear, bf16 activations) and `--quantization w8a16_int8` on the dense
    copy. The documented tolerance: same greedy text on the README prompt, and the chosen tokens'
    logprobs within 0.5 nats of the bf16 model's (0.1 on average; measured: max 0.28 for int8)."""
    import sglang as sgl
    from sglang.srt.model_loader.default_model import ensure_dense_default_model

    dense = ensure_dense_default_model()
    prompt, params = "The capital of France is", {"max_new_tokens": 16, "temperature": 0}
    outs = {}
    for name, path, quant in (("bf16", dense, None), ("w8a16_int8", dense, "w8a16_int8"), ("gguf", "default", None)):
        fmt = "gguf" if name == "gguf" else "auto"  # "default" with --load-format gguf: the shipped file
        llm = sgl.Engine(model_path=path, dtype="bfloat16", quantization=quant, load_format=fmt, max_total_tokens=2048)
        try:
            outs[name] = llm.generate(prompt, params, return_logprob=True)
        finally:
            llm.shutdown()
    ref = outs["bf16"]
    ref_lp = [t[0] for t in ref["meta_info"]["output_token_logprobs"]]
    for name in ("w8a16_int8", "gguf"):
        got = outs[name]
        assert got["text"] == ref["text"], (name, got["text"], ref["text"])
        got_lp = [t[0] for t in got["meta_info"]["output_token_logprobs"]]
        diffs = [abs(a - b) for a, b in zip(ref_lp, got_lp)]
        print(f"{name} vs bf16 logprob diffs: max {max(diffs):.3f}, mean {sum(diffs) / len(diffs):.3f}")
        assert max(diffs) < 0.5 and sum(diffs) / len(diffs) < 0.1, (name, ref_lp, got_lp)


def test_int8_quantization_of_a_gguf_model_is_refused():
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_loader.default_model import default_gguf_path

    with pytest.raises(ValueError, match="GGUF-quantized already"):
        ModelRunner(default_gguf_path(), quantization="w8a16_int8", max_total_tokens=256, max_running_requests=1,
                    disable_tqdm=True)


def test_flag_accepts_the_fork_method_and_refuses_others(capsys):
    from sglang.srt.server_args import prepare_server_args

    assert prepare_server_args(["--model-path", "default", "--quantization", "w8a16_int8"]).quantization == "w8a16_int8"
    with pytest.raises(SystemExit) as e:
        prepare_server_args(["--model-path", "default", "--quantization", "fp8"])
    assert e.value.code == 2 and "invalid choice: 'fp8'" in capsys.readouterr().err
