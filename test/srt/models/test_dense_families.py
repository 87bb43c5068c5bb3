"""Every dense family (models/decoder.py declarations) against HF transformers on tiny random
checkpoints with each family's options on: windows (8) shorter than the prompts, soft-caps small
enough to bite (Gemma 2: attention 2.0, final 3.0), longrope past its original length (32),
partial rotary, NoPE layers, Granite's multipliers, fused checkpoints (Phi-3).

- runner level: the logits of every prompt token and of each decode step, whole and in chunks
  (fp32: atol/rtol 1e-4, as the Llama tests);
- scheduler level: greedy tokens with chunked prefill (16-token chunks) equal HF's, and the same
  prompt sent again hits the prefix cache (cached_tokens > 0) and gives the same tokens;
- bf16 checkpoints of the Gemma, Phi and Mistral families: within bf16's reach of HF in bf16
  (max |logit diff| < 0.15, argmax agreement > 80%);
- the options really act (turning one off moves the logits away from HF);
- the CPU fast path: families shaped like Llama decode through the fused stack, bit-identical to
  their per-op path; the others say once that they run layer by layer.
"""

from __future__ import annotations

import pytest
import torch

from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.test.family_parity import family_dir, family_hf
from sglang.test.hf_parity import LogitsTrace, assert_trace_close, hf_reference, our_logits, random_prompt
from sglang.test.hf_reference import hf_greedy
from sglang.test.scheduler_utils import assert_no_leak, make_scheduler, run_to_completion, submit

FAMILIES = ["mistral", "mistral_swa", "gemma", "gemma2", "gemma3", "phi3", "phi3_longrope", "phi", "olmo2",
            "granite", "starcoder2", "stablelm", "smollm3", "glm", "glm4", "exaone4"]
PROMPT_LEN = 41


def _runner(path, **kw):
    return ModelRunner(path, max_total_tokens=1024, page_size=1, max_running_requests=4, disable_tqdm=True, **kw)


@pytest.mark.parametrize("arch", FAMILIES)
def test_logits_match_hf_whole_and_chunked(arch):
    prompt = random_prompt(PROMPT_LEN, seed=4)
    ref = hf_reference(family_hf(arch), prompt, 4)
    runner = _runner(family_dir(arch))
    assert_trace_close(our_logits(runner, prompt, ref.tokens), ref)
    # HF picks longrope's factors per forward (long once the forward reaches past 32 tokens): a
    # first chunk inside the original context would be rotated with the short ones there
    chunk = 35 if arch == "phi3_longrope" else 7
    assert_trace_close(our_logits(runner, prompt, ref.tokens, chunk_size=chunk), ref)


@pytest.mark.parametrize("arch", FAMILIES)
def test_scheduler_chunked_prefill_and_prefix_cache_hit(arch):
    # longrope: HF rotates a whole forward with the long factors once it reaches past 32 tokens,
    # so every chunk must (36-token chunks of an 80-token prompt)
    chunk, length = (36, 80) if arch == "phi3_longrope" else (16, PROMPT_LEN)
    sched = make_scheduler(family_dir(arch), chunked_prefill_size=chunk, max_total_tokens=1024, max_running_requests=4)
    prompt = random_prompt(length, seed=5)
    first = submit(sched, "a", prompt, 6)
    run_to_completion(sched)
    again = submit(sched, "b", prompt, 6)
    run_to_completion(sched)
    expected = hf_greedy(family_hf(arch), prompt, 6)
    assert first.output_ids == expected
    assert again.output_ids == expected
    assert again.cached_tokens > 0
    assert_no_leak(sched)


@pytest.mark.parametrize("arch", ["mistral_swa", "gemma", "gemma2", "gemma3", "phi3", "phi"])
def test_bf16_checkpoint_close_to_hf_bf16(arch):
    prompt = random_prompt(PROMPT_LEN, seed=6)
    ref = hf_reference(family_hf(arch, "bfloat16"), prompt, 3)
    runner = _runner(family_dir(arch, "bfloat16"), dtype="bfloat16")
    assert runner.dtype == torch.bfloat16
    ours = our_logits(runner, prompt, ref.tokens)
    assert (ours.prefill - ref.prefill).abs().max() < 0.15
    assert (ours.prefill.argmax(-1) == ref.prefill.argmax(-1)).float().mean() > 0.8
    for a, b in zip(ours.decode, ref.decode):
        assert (a - b).abs().max() < 0.15


def _far(ours: LogitsTrace, ref: LogitsTrace) -> float:
    return float((ours.prefill - ref.prefill).abs().max())


@pytest.mark.parametrize("arch,switch_off", [
    ("mistral_swa", "window"), ("starcoder2", "window"), ("gemma2", "window"), ("gemma2", "softcap"),
    ("gemma2", "final_softcap"), ("gemma3", "window"), ("phi3_longrope", "long_factors"), ("exaone4", "window"),
    ("glm", "interleaved_rope"),
])
def test_options_act(arch, switch_off):
    """Guards the parity tests against passing trivially: without the option, the logits leave HF's."""
    prompt = random_prompt(PROMPT_LEN, seed=4)
    ref = hf_reference(family_hf(arch), prompt, 0)
    runner = _runner(family_dir(arch))
    model = runner.model
    for layer in model.model.layers:
        attn = layer.self_attn
        if switch_off == "window":
            attn.attn.sliding_window_size = -1
        elif switch_off == "softcap":
            assert attn.attn.logit_cap == 2.0
            attn.attn.logit_cap = 0.0
        elif switch_off == "long_factors":
            attn.rotary_emb.long_tables = None
        elif switch_off == "interleaved_rope":
            assert attn.rotary_emb.rotary_dim == attn.head_dim // 2
            attn.rotary_emb.is_neox_style = True
    if switch_off == "final_softcap":
        assert model.logits_processor.final_logit_softcapping == 3.0
        model.logits_processor.final_logit_softcapping = None
    try:
        assert _far(our_logits(runner, prompt, []), ref) > 1e-2
    finally:
        if switch_off in ("long_factors", "interleaved_rope"):  # rotary tables are shared in the process
            from sglang.srt.layers import rotary_embedding

            rotary_embedding._ROPE_CACHE.clear()


def test_window_layers_and_pools():
    """Gemma 2/3 slide on their `layer_types` layers, over a hybrid SWA pool; Mistral's window is on
    every layer over the full pool (not a hybrid- or pure-SWA model, as upstream counts it)."""
    g2 = _runner(family_dir("gemma2"))
    assert g2.model_config.swa_layer_ids == [0, 2] and g2.memory.is_hybrid_swa
    assert [l.self_attn.attn.sliding_window_size for l in g2.model.model.layers] == [8, -1, 8, -1]
    g3 = _runner(family_dir("gemma3"))
    local, glob = (g3.model.model.layers[i].self_attn.rotary_emb for i in (0, 1))
    assert local.base == 10000.0 and glob.base == 1000000.0 and glob.rope_scaling["rope_type"] == "linear"
    m = _runner(family_dir("mistral_swa"))
    assert not m.model_config.is_hybrid_swa and not m.model_config.is_pure_swa and not m.memory.is_hybrid_swa
    assert {l.self_attn.attn.sliding_window_size for l in m.model.model.layers} == {8}
    assert {l.self_attn.attn.sliding_window_size for l in _runner(family_dir("mistral")).model.model.layers} == {-1}


# True: the whole stack in one call; "layers": the layers that fit (SmolLM3's RoPE layers, not
# its NoPE ones), one call each; False: each layer's ops
FUSED = {"mistral": True, "mistral_swa": True, "phi3": True, "phi3_longrope": False, "gemma": False,
         "gemma2": False, "phi": False, "granite": False, "smollm3": "layers", "stablelm": False, "glm": False,
         "exaone4": False}


@pytest.mark.parametrize("arch", list(FUSED))
def test_fast_path_where_the_family_fits_it(arch, monkeypatch):
    sgl_kernel = pytest.importorskip("sgl_kernel")
    # the small-M kernel takes a decode row whatever the measured crossover (as test_fused_decode)
    monkeypatch.setenv("SGLANG_CPU_SMALL_M_LINEAR", "4")
    runner = _runner(family_dir(arch))
    assert runner.model.model.fused_decode == (FUSED[arch] is True)
    if not sgl_kernel.load():
        return
    prompt = random_prompt(20, seed=9)
    tokens = random_prompt(4, seed=10)

    def decode(enabled: str):
        monkeypatch.setenv("SGLANG_CPU_FUSED_DECODE", enabled)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            trace = our_logits(runner, prompt, tokens)
        keys = {e.key for e in prof.key_averages()}
        return trace, "sgl_kernel::decode_layers" in keys, "sgl_kernel::decode_layer" in keys

    fused, stack, layers = decode("1")
    assert (stack, layers) == {True: (True, False), "layers": (False, True), False: (False, False)}[FUSED[arch]]
    ref, *ran_off = decode("0")
    assert not any(ran_off)
    for a, b in zip(fused.decode, ref.decode):
        assert torch.equal(a, b)


# ---- through sglang.Engine: real scheduler and detokenizer processes ----------------------------
ENGINE_FAMILIES = ["gemma3", "phi3"]  # hybrid SWA with per-layer RoPE; fused checkpoint on the fast path


@pytest.fixture(scope="module", params=ENGINE_FAMILIES)
def engine(request):
    import sglang

    arch = request.param
    eng = sglang.Engine(model_path=family_dir(arch), max_total_tokens=1024, dtype="float32", chunked_prefill_size=16,
                        max_running_requests=4)
    yield arch, eng
    eng.shutdown()


def test_engine_greedy_first_step_logprobs_and_prefix_hit(engine):
    arch, eng = engine
    prompt = random_prompt(PROMPT_LEN, seed=11)
    params = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
    hf = family_hf(arch)
    expected = hf_greedy(hf, prompt, 6)
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


def test_engine_uses_the_checkpoints_chat_template(engine):
    """The family's own chat template comes from its tokenizer files (the tiny checkpoints carry
    SmolLM2's ChatML one)."""
    from transformers import AutoTokenizer

    arch, eng = engine
    messages = [{"role": "user", "content": "Hi there"}]
    tok = AutoTokenizer.from_pretrained(family_dir(arch))
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert "<|im_start|>assistant" in tok.decode(ids)
    ours = eng.tokenizer_manager.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ours == tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "phi3"])
def test_pd_decode_host_pool_retraction(arch):
    """A PD decode server (in-process, `fake` transfer: each prompt's KV from a local prefill)
    under memory pressure retracts to the host pool and resumes without recomputing, with HF's
    tokens; afterwards every pool (full and SWA) is whole."""
    from sglang.test.scheduler_utils import random_prompts

    sched = make_scheduler(family_dir(arch), max_total_tokens=320, page_size=1, chunked_prefill_size=64,
                           disaggregation_mode="decode", disaggregation_transfer_backend="fake",
                           num_reserved_decode_tokens=8, max_running_requests=16,
                           disaggregation_decode_retraction_backup="host_pool")
    prompts = random_prompts([40] * 8, seed=21)
    reqs = [submit(sched, f"d{i}", p, 40) for i, p in enumerate(prompts)]
    run_to_completion(sched)
    assert sum(r.num_retractions for r in reqs) > 0
    assert sched.stats.num_recomputed_tokens == 0
    hf = family_hf(arch)
    for r, p in zip(reqs, prompts):
        assert r.output_ids == hf_greedy(hf, p, 40), r.rid
    assert_no_leak(sched)
