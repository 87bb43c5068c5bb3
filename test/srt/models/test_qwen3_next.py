"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE (gated DeltaNet + gated attention, MoE with a shared
expert) vs HF transformers, fp32, tiny random weights: logits of every prompt token and of 20
decode steps with the DeltaNet state in state-pool slots; chunked prefill whose chunks split the
gated delta rule's 64-token chunks; ragged batches in scattered slots; HF's greedy tokens."""

import pytest
import torch

from mamba_hybrid_driver import hybrid_batch_logits, hybrid_greedy, hybrid_logits
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.test.hf_parity import assert_trace_close, hf_reference, load_hf_model, random_prompt
from sglang.test.tiny_models import make_tiny_model

ARCHS = ["qwen3_next", "qwen3_5", "qwen3_5_moe"]


@pytest.fixture(scope="module", params=ARCHS)
def arch(request, tmp_path_factory):
    d = make_tiny_model(str(tmp_path_factory.mktemp(request.param)), request.param, seed=3)
    return request.param, d, load_hf_model(d)


def _runner(path, page_size=1, **kw):
    return ModelRunner(path, max_total_tokens=4096, page_size=page_size, max_running_requests=8,
                       disable_tqdm=True, **kw)


@pytest.fixture(scope="module")
def runner(arch):
    return _runner(arch[1])


def test_config_is_a_hybrid_with_kv_for_full_attention_only(arch, runner):
    cfg = ModelConfig.from_path(arch[1])
    assert cfg.is_hybrid_ssm and cfg.attention_layer_ids == [1, 3]
    assert runner.memory.token_to_kv_pool.layer_ids == [1, 3]
    pool = runner.memory.mamba_pool
    assert pool.num_mamba_layers == 2
    assert tuple(pool.conv_state.shape[2:]) == (2 * 2 * 8 + 4 * 12, 3)
    assert tuple(pool.ssm_state.shape[2:]) == (4, 8, 12)


def test_prefill_and_20_decode_steps_match_hf(arch, runner):
    prompt = random_prompt(70, seed=0)  # > one 64-token chunk of the gated delta rule
    ref = hf_reference(arch[2], prompt, 20)
    assert_trace_close(hybrid_logits(runner, prompt, ref.tokens), ref)


@pytest.mark.parametrize("chunk", [5, 48])
def test_chunked_prefill_carries_the_state(arch, runner, chunk):
    prompt = random_prompt(90, seed=1)
    ref = hf_reference(arch[2], prompt, 3)
    # 5-token chunks take the small-M linear kernel (up to 16 rows in fp32 on AVX-512), whose fp32
    # sum order differs from HF's GEMM: a few logits move by up to ~1.5e-4
    assert_trace_close(hybrid_logits(runner, prompt, ref.tokens, chunk_size=chunk), ref, atol=2e-4)


def test_ragged_batch_in_scattered_slots(arch):
    prompts = [random_prompt(n, seed=10 + n) for n in (1, 9, 33, 70)]
    refs = [hf_reference(arch[2], p, 4) for p in prompts]
    traces = hybrid_batch_logits(_runner(arch[1], 16), prompts, [r.tokens for r in refs], slot_stride=2)
    for ours, ref in zip(traces, refs):
        assert_trace_close(ours, ref)


def test_greedy_tokens_match_hf_generate(arch, runner):
    prompt = random_prompt(26, seed=6)
    n = 12
    hf_out = arch[2].generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              use_cache=True, pad_token_id=0)
    assert hybrid_greedy(runner, prompt, n) == hf_out[0, len(prompt):].tolist()


def test_triton_kernels_in_the_model_match_hf(tmp_path, monkeypatch):
    """The GPU path (Triton conv1d and gated delta rule kernels, here in Triton's interpreter)
    through the whole model: HF's logits for a prefill and 3 decode steps (one config: the
    kernels do not depend on the projection layout)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("SGLANG_GDN_OPS", "triton")
    d = make_tiny_model(str(tmp_path / "next"), "qwen3_next", seed=4)
    prompt = random_prompt(21, seed=7)
    ref = hf_reference(load_hf_model(d), prompt, 3)
    assert_trace_close(hybrid_logits(_runner(d), prompt, ref.tokens), ref)


def test_qwen3_5_vision_language_checkpoint_serves_its_language_model(tmp_path):
    """Qwen3.5 ships as vision-language checkpoints (`Qwen3_5MoeForConditionalGeneration`,
    text fields under `text_config`, weights under `model.language_model.`): served as a text
    model, HF's logits."""
    from transformers import AutoModelForImageTextToText, Qwen3_5MoeConfig

    from sglang.test.tiny_models import tiny_config_dict

    text = tiny_config_dict("qwen3_5_moe", vocab_size=49152)
    text.pop("model_type"), text.pop("architectures")
    cfg = Qwen3_5MoeConfig(text_config=text, vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64,
                                                                out_hidden_size=64))
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(cfg).save_pretrained(str(tmp_path))
    assert ModelConfig.from_path(str(tmp_path)).attention_layer_ids == [1, 3]
    prompt = random_prompt(30, seed=2)
    ref = hf_reference(load_hf_model(str(tmp_path)), prompt, 4)
    assert_trace_close(hybrid_logits(_runner(str(tmp_path)), prompt, ref.tokens), ref)


def test_bfloat16_keeps_the_delta_rule_state_in_float32(arch):
    """As HF and the FLA kernels: the key x value state stays float32 in a bf16 model unless
    --mamba-ssm-dtype says otherwise; the conv state follows the model dtype."""
    bf16 = _runner(arch[1], dtype="bfloat16")
    assert bf16.memory.mamba_pool.ssm_state.dtype == torch.float32
    assert bf16.memory.mamba_pool.conv_state.dtype == torch.bfloat16
    assert _runner(arch[1], dtype="bfloat16", mamba_ssm_dtype="bfloat16").memory.mamba_pool.ssm_state.dtype == torch.bfloat16
    prompt = random_prompt(30, seed=10)
    trace = hybrid_logits(bf16, prompt, [1, 2])
    assert torch.isfinite(trace.prefill).all() and all(torch.isfinite(t).all() for t in trace.decode)
