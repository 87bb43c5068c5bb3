"""The scheduler driven in-process on a tiny random Llama: continuous batching, chunked prefill,
prefix cache and retraction must all give exactly HF transformers' greedy tokens, and leave
no KV slot behind."""

import pytest

from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test import scheduler_utils
from sglang.test.scheduler_utils import assert_no_leak, random_prompts, run_to_completion, submit
from sglang.test.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("tiny_llama")), "llama", seed=1)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return load_hf_model(model_dir)


def make_scheduler(model_dir, **kw):
    args = dict(max_total_tokens=8192, chunked_prefill_size=32, page_size=1, max_running_requests=64)
    args.update(kw)
    return scheduler_utils.make_scheduler(model_dir, **args)










def test_all_greedy_decode_takes_the_argmax_in_the_lm_head(model_dir, hf_model, monkeypatch):
    """An all-greedy decode batch with nothing that reads or changes the logits gets its tokens
    from the LM head's own pass (sgl_kernel.linear_argmax, the head in panels): HF's tokens. A batch
    with a request that wants logprobs, or one that samples, computes the logits."""
    import torch

    from sglang.srt.layers import cpu_ops, logits_processor
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    if not cpu_ops.linear_panels_enabled(torch.float32):
        pytest.skip(f"no fp32 panels here: {cpu_ops.describe()}")
    fused = []
    real = logits_processor.module_linear_argmax

    def counting(module, x, round_to_x=True):
        ids = real(module, x, round_to_x)
        fused.append(ids is not None)
        return ids

    monkeypatch.setattr(logits_processor, "module_linear_argmax", counting)
    sched = make_scheduler(model_dir)
    prompts = random_prompts([5, 17, 30], seed=11)
    reqs = [submit(sched, f"g{i}", p, 5) for i, p in enumerate(prompts)]
    run_to_completion(sched)
    assert len(fused) >= 4 and all(fused)  # every decode step
    for req, p in zip(reqs, prompts):
        assert req.output_ids == hf_greedy(hf_model, p, 5), req.rid

    def other(rid, return_logprob=False, **sampling):
        params = SamplingParams(max_new_tokens=5, ignore_eos=True, **sampling)
        params.normalize(None)
        return sched.add_request(TokenizedGenerateReqInput(rid=rid, input_text=None, input_ids=prompts[1],
                                                           sampling_params=params, return_logprob=return_logprob))

    for extra in (dict(temperature=0.0, return_logprob=True), dict(temperature=0.8, sampling_seed=3),
                  dict(temperature=0.0, logit_bias={"7": 1.0})):
        fused.clear()
        greedy = submit(sched, "g", prompts[0], 5)
        odd = other("odd", **extra)
        run_to_completion(sched)
        assert not fused, extra  # the logits were computed for the sampler
        assert greedy.output_ids == hf_greedy(hf_model, prompts[0], 5)
        assert len(odd.output_ids) == 5
        if extra.get("return_logprob"):
            assert len(odd.logprobs.output_token_logprobs) == 5
    assert_no_leak(sched)


@pytest.mark.parametrize("page_size", [1, 16])
def test_batch_matches_hf_with_chunked_prefill(model_dir, hf_model, page_size):
    sched = make_scheduler(model_dir, page_size=page_size, chunked_prefill_size=32)
    lengths = [1 + (i * 299) // 15 for i in range(16)]  # 1 .. 300
    prompts = random_prompts(lengths, seed=page_size)
    reqs = [submit(sched, f"r{i}", p, 6) for i, p in enumerate(prompts)]
    run_to_completion(sched)
    for req, p in zip(reqs, prompts):
        assert req.finished_reason.to_json() == {"type": "length", "length": 6}
        assert req.output_ids == hf_greedy(hf_model, p, 6), req.rid
    assert_no_leak(sched)


def test_shared_prefix_is_cached(model_dir, hf_model):
    sched = make_scheduler(model_dir, page_size=16)
    prefix = random_prompts([200], seed=7)[0]
    a = prefix + random_prompts([20], seed=8)[0]
    b = prefix + random_prompts([15], seed=9)[0]
    ra = submit(sched, "a", a, 4)
    run_to_completion(sched)
    rb = submit(sched, "b", b, 4)
    run_to_completion(sched)
    assert ra.cached_tokens == 0
    assert rb.cached_tokens >= 192
    assert rb.output_ids == hf_greedy(hf_model, b, 4)
    assert_no_leak(sched)


@pytest.mark.parametrize("page_size", [1, 16])
def test_retraction_keeps_outputs_identical(model_dir, hf_model, page_size):
    # 8 requests x (40 prompt + 40 output) tokens do not fit into 320 KV slots at once.
    sched = make_scheduler(model_dir, page_size=page_size, max_total_tokens=320, chunked_prefill_size=64)
    prompts = random_prompts([40] * 8, seed=11)
    reqs = [submit(sched, f"q{i}", p, 40) for i, p in enumerate(prompts)]
    run_to_completion(sched)
    assert sum(r.num_retractions for r in reqs) > 0
    for req, p in zip(reqs, prompts):
        assert req.output_ids == hf_greedy(hf_model, p, 40), req.rid
    assert_no_leak(sched)


def test_request_that_cannot_fit_is_aborted_and_server_goes_on(model_dir, hf_model):
    sched = make_scheduler(model_dir, max_total_tokens=64, chunked_prefill_size=32)
    too_long = submit(sched, "long", random_prompts([100], seed=3)[0], 4)
    assert too_long.finished_reason.to_json()["type"] == "abort"
    assert too_long.finished_reason.status_code == 400
    # As upstream, max_new_tokens is clamped so that a sequence never outgrows the pool:
    # max_req_len = min(context - 1, pool - 1) = 63, so 63 - 30 - 1 = 32 new tokens, then "length".
    grow_prompt = random_prompts([30], seed=4)[0]
    grows = submit(sched, "grow", grow_prompt, 100)
    run_to_completion(sched)
    assert grows.finished_reason.to_json() == {"type": "length", "length": 32}
    assert grows.output_ids == hf_greedy(hf_model, grow_prompt, 32)
    ok_prompt = random_prompts([10], seed=5)[0]
    ok = submit(sched, "ok", ok_prompt, 5)
    run_to_completion(sched)
    assert ok.output_ids == hf_greedy(hf_model, ok_prompt, 5)
    assert_no_leak(sched)


def test_abort_waiting_and_running(model_dir):
    sched = make_scheduler(model_dir)
    prompts = random_prompts([20, 20, 20], seed=6)
    r0 = submit(sched, "x0", prompts[0], 50)
    sched.step()  # x0 prefilled and running
    r1 = submit(sched, "x1", prompts[1], 50)
    sched.abort_request("x0")
    sched.abort_request("x1")
    run_to_completion(sched)
    for r in (r0, r1):
        assert r.finished_reason.to_json()["type"] == "abort"
    assert_no_leak(sched)


@pytest.mark.parametrize("page_size", [1, 16])
def test_hybrid_swa_model_matches_hf_under_pressure(tmp_path_factory, page_size):
    """Qwen3 with sliding (window 8) and full layers: a hybrid SWA pool whose out-of-window SWA
    slots are given back, shared prefixes through the tree, and retractions; HF's greedy tokens."""
    d = make_tiny_model(str(tmp_path_factory.mktemp("swa")), "qwen3_swa", seed=4)
    hf = load_hf_model(d)
    sched = make_scheduler(d, page_size=page_size, max_total_tokens=288, chunked_prefill_size=48)
    assert sched.worker.model_runner.memory.is_hybrid_swa
    prefix = random_prompts([64], seed=30)[0]
    prompts = [prefix + p for p in random_prompts([20] * 6, seed=31)]
    reqs = [submit(sched, f"s{i}", p, 30) for i, p in enumerate(prompts)]
    run_to_completion(sched)
    for req, p in zip(reqs, prompts):
        assert req.output_ids == hf_greedy(hf, p, 30), req.rid
    assert sum(r.num_retractions for r in reqs) > 0
    assert_no_leak(sched)
    assert sched.memory.allocator.swa_available_size() == sched.memory.allocator.swa_attn_allocator.size


def test_requests_that_arrive_while_the_turn_is_taken_join_the_batch(model_dir, hf_model, tmp_path, monkeypatch):
    """Shared cores (`SGLANG_CPU_TURNS_FILE`): a scheduler that had to wait for its turn takes the
    messages that came meanwhile before it forms the batch, so a prompt that arrived while the other
    scheduler computed is prefilled in this step, not one batch later; with a free turn it does not look."""
    import threading

    from sglang.srt.utils.compute_turns import ENV, ComputeTurns

    path = str(tmp_path / "turns")
    monkeypatch.setenv(ENV, path)
    sched = make_scheduler(model_dir)
    first_prompt, late_prompt = random_prompts([10, 12], seed=5)  # one batch: within chunked_prefill_size
    other = ComputeTurns(path)  # the other scheduler, computing
    assert other.take() is False
    late = []
    sched.take_messages = lambda: late.append(submit(sched, "late", late_prompt, 3))
    first = submit(sched, "first", first_prompt, 3)
    release = threading.Timer(0.3, other.give_back)
    release.start()
    sched.step()
    release.join()
    assert len(late) == 1 and sched.forward_ct == 1
    assert len(first.output_ids) == 1 and len(late[0].output_ids) == 1  # both prefilled by that one forward
    sched.step()  # the turn is free now: no second look at the messages
    assert len(late) == 1 and sched.forward_ct == 2
    run_to_completion(sched)
    assert first.output_ids == hf_greedy(hf_model, first_prompt, 3)
    assert late[0].output_ids == hf_greedy(hf_model, late_prompt, 3)
    assert_no_leak(sched)
    other.close()
    sched.turns.close()
