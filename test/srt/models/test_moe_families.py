"""The sparse-MoE families (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE: models/*.py declarations over
models/decoder.py and layers/moe) against HF transformers on tiny random checkpoints it saved
(4-8 experts, top 2; Qwen2-MoE's shared expert and sparse step, Qwen3-MoE's mlp_only_layers and
norm_topk_prob, OLMoE's q/k norms over the projection and clip_qkv, Mixtral's per-expert
w1/w2/w3 checkpoint names).

- through `sglang.Engine` (real scheduler and detokenizer processes), one fp32 engine per family,
  16-token chunked prefill of a 41-token prompt sent twice (the second a prefix-cache hit): HF's
  greedy tokens and first-step top-5 logprobs (1e-4);
- bf16 checkpoints (saved by transformers in bf16) through the in-process scheduler, same chunks
  and prefix hit: HF's bf16 greedy tokens wherever HF's own top two are not a near-tie;
- runner level, fp32 and bf16: every prompt token's logits and each decode step's as HF's, whole
  and in 7-token chunks; the experts ran sgl-kernel's fused op (test/sgl-kernel/test_fused_moe.py
  tests the op itself) and its torch fallback gives the same logits; each family's sparse layers
  are the ones HF builds;
- a config the router or experts cannot compute is refused with one line naming the field, at
  start-up before any process is spawned (check_model_servable) and by the model class.
"""

from __future__ import annotations

import pytest
import torch

from sglang.test.family_parity import family_dir, family_hf
from sglang.test.hf_parity import random_prompt
from sglang.test.hf_reference import hf_greedy

FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]
PROMPT_LEN, NEW_TOKENS = 41, 6
NEAR_TIE = 0.1  # bf16: HF's top-2 logits closer than this may swap under another summation order


@pytest.fixture(scope="module", params=FAMILIES)
def engine(request):
    import sglang

    arch = request.param
    eng = sglang.Engine(model_path=family_dir(arch), max_total_tokens=1024, dtype="float32",
                        chunked_prefill_size=16, max_running_requests=4)
    yield arch, eng
    eng.shutdown()


@torch.inference_mode()
def _assert_greedy_as_hf(hf, prompt, ours, expected, near_tie: float):
    """ours == expected, or (bf16) they part where HF's own top two are within `near_tie`."""
    if ours == expected or near_tie == 0:
        assert ours == expected
        return
    i = next(i for i, (a, b) in enumerate(zip(ours, expected)) if a != b)
    logits = hf(torch.tensor([prompt + expected[:i]])).logits[0, -1].float()
    assert float(logits[expected[i]] - logits[ours[i]]) < near_tie, (i, ours, expected)


def test_engine_greedy_first_step_logprobs_and_prefix_hit(engine):
    arch, eng = engine
    dtype = "float32"
    prompt = random_prompt(PROMPT_LEN, seed=11)
    params = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    hf = family_hf(arch, dtype)
    expected = hf_greedy(hf, prompt, NEW_TOKENS)
    with torch.no_grad():
        first = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1].float(), -1)
    outs = [eng.generate(input_ids=prompt, sampling_params=params, return_logprob=True, top_logprobs_num=5)
            for _ in range(2)]
    for out in outs:
        assert out["output_ids"] == expected
        top = out["meta_info"]["output_top_logprobs"][0]
        ref_vals, ref_ids = first.topk(5)
        assert [t[1] for t in top] == ref_ids.tolist()
        torch.testing.assert_close(torch.tensor([t[0] for t in top]), ref_vals, atol=1e-4, rtol=1e-4)
    assert outs[0]["meta_info"]["cached_tokens"] == 0 and outs[1]["meta_info"]["cached_tokens"] > 0


# ---- in process: the layers each family builds, the fused op, refusals -----------------------
SPARSE_LAYERS = {"mixtral": [0, 1], "qwen2_moe": [1, 3], "qwen3_moe": [0, 2], "olmoe": [0, 1]}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_logits_whole_and_chunked_fused_op_and_its_fallback(arch, dtype):
    """Every prompt token's logits and each decode step's as HF's (fp32: 1e-4; bf16: most rows
    within 0.15 of HF's bf16 run and with its argmax), whole and in 7-token chunks; the experts
    run the fused op, and its torch fallback gives the same logits."""
    from sglang.srt.layers import cpu_ops
    from sglang.srt.layers.moe import SparseMoeBlock
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.test.hf_parity import assert_trace_close, hf_reference, our_logits

    runner = ModelRunner(family_dir(arch, dtype), max_total_tokens=512, page_size=1, max_running_requests=2,
                         disable_tqdm=True, dtype=dtype)
    prompt = random_prompt(PROMPT_LEN, seed=4)
    ref = hf_reference(family_hf(arch, dtype), prompt, 3)
    for chunk in (None, 7):
        ours = our_logits(runner, prompt, ref.tokens, chunk_size=chunk)
        if dtype == "float32":
            assert_trace_close(ours, ref)
            continue
        # bf16: a 1-ulp difference anywhere before a router can swap a token's expert (a near-tie
        # of two router logits) and move that token's logits far; most rows stay within reach
        rows = torch.cat([ours.prefill.float()] + [d.float()[None] for d in ours.decode])
        ref_rows = torch.cat([ref.prefill.float()] + [d.float()[None] for d in ref.decode])
        assert ((rows - ref_rows).abs().amax(-1) < 0.15).float().mean() > 0.8
        assert (rows.argmax(-1) == ref_rows.argmax(-1)).float().mean() > 0.8
    layers = runner.model.model.layers
    assert [i for i, l in enumerate(layers) if isinstance(l.mlp, SparseMoeBlock)] == SPARSE_LAYERS[arch]
    assert (layers[SPARSE_LAYERS[arch][0]].mlp.shared_expert is not None) == (arch == "qwen2_moe")
    prompt, tokens = random_prompt(20, seed=9), random_prompt(2, seed=10)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fused = our_logits(runner, prompt, tokens)
    assert ("sgl_kernel::fused_experts" in {e.key for e in prof.key_averages()}) == cpu_ops.available()
    with cpu_ops.torch_fallbacks():
        ref = our_logits(runner, prompt, tokens)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == "float32" else dict(atol=0.1, rtol=0)
    torch.testing.assert_close(fused.prefill.float(), ref.prefill.float(), **tol)
    for a, b in zip(fused.decode, ref.decode):
        torch.testing.assert_close(a.float(), b.float(), **tol)


@pytest.mark.parametrize("arch", FAMILIES)
def test_bf16_scheduler_chunked_prefill_and_prefix_cache_hit(arch):
    """A bf16 checkpoint through the scheduler (16-token chunks, the prompt twice): HF's bf16
    greedy tokens (up to near-ties), the second run a prefix-cache hit, no KV slot leaked."""
    from sglang.test.scheduler_utils import assert_no_leak, make_scheduler, run_to_completion, submit

    sched = make_scheduler(family_dir(arch, "bfloat16"), dtype="bfloat16", chunked_prefill_size=16,
                           max_total_tokens=1024, max_running_requests=4)
    prompt = random_prompt(PROMPT_LEN, seed=5)
    first = submit(sched, "a", prompt, NEW_TOKENS)
    run_to_completion(sched)
    again = submit(sched, "b", prompt, NEW_TOKENS)
    run_to_completion(sched)
    hf = family_hf(arch, "bfloat16")
    expected = hf_greedy(hf, prompt, NEW_TOKENS)
    for req in (first, again):
        _assert_greedy_as_hf(hf, prompt, req.output_ids, expected, NEAR_TIE)
    assert again.cached_tokens > 0
    assert_no_leak(sched)


@pytest.mark.parametrize("arch,field,value,message", [
    ("qwen3_moe", "scoring_func", "sigmoid", "scoring_func='sigmoid'"),
    ("mixtral", "hidden_act", "gelu", "hidden_act='gelu'"),
    ("qwen2_moe", "num_experts_per_tok", 9, "num_experts_per_tok=9"),
])
def test_unsupported_router_or_experts_refused_naming_the_field(arch, field, value, message):
    from transformers import AutoConfig

    from sglang.srt.models.registry import get_model_class

    config = AutoConfig.from_pretrained(family_dir(arch))
    setattr(config, field, value)
    with pytest.raises(ValueError, match=message):
        get_model_class(config.architectures)(config)


@pytest.mark.parametrize("arch,field,value,message", [
    ("qwen3_moe", "num_experts_per_tok", 99, r"num_experts_per_tok=99 must be in \[1, num_experts=8\]"),
    ("mixtral", "scoring_func", "sigmoid", "scoring_func='sigmoid'"),
])
def test_start_refuses_a_router_it_cannot_compute(arch, field, value, message, tmp_path):
    """Start-up's check (before any process is spawned) reads config.json: one line naming the field."""
    import json
    import shutil

    from sglang.srt.model_loader.loader import ModelConfigError, check_model_servable

    src = family_dir(arch)
    check_model_servable(src)
    shutil.copy(f"{src}/config.json", tmp_path / "config.json")
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match=message):
        check_model_servable(str(tmp_path))
