"""The scheduler in-process (issue 13): a failing batch aborts only its requests (500 with the
reason) and frees their memory; too many failures in a row are fatal; mixed chunks, stop regexes,
zero-token requests and token_ids_logprob give upstream's results, outputs still equal HF."""

import math
import re

import pytest
import torch

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.scheduler_process import SchedulerLoop
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import PortArgs
from sglang.test import scheduler_utils
from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test.scheduler_utils import assert_no_leak, random_prompts, run_to_completion, submit
from sglang.test.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("robust_llama")), "llama", seed=21)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return load_hf_model(model_dir)


def make_scheduler(model_dir, **kw):
    args = dict(max_total_tokens=4096, chunked_prefill_size=32, page_size=1, max_running_requests=32)
    args.update(kw)
    return scheduler_utils.make_scheduler(model_dir, **args)


class PoisonedForward:
    """Makes the model runner raise for any batch that holds `poison` (the injected fault lives
    in the runner, a dependency; the scheduler's containment is what runs for real)."""

    def __init__(self, runner, poison: int, times: int = 1):
        self.runner, self.poison, self.left = runner, poison, times
        self.inner = runner.forward

    def __call__(self, forward_batch):
        if self.left and bool((forward_batch.input_ids == self.poison).any()):
            self.left -= 1
            raise RuntimeError("injected fault")
        return self.inner(forward_batch)


def test_a_failing_batch_aborts_only_its_requests(model_dir, hf_model):
    sched = make_scheduler(model_dir)
    poison = 4242
    healthy = random_prompts([12, 20], seed=1)
    early = [submit(sched, f"ok{i}", p, 8) for i, p in enumerate(healthy)]
    run_to_completion(sched)
    sched.worker.model_runner.forward = PoisonedForward(sched.worker.model_runner, poison)
    bad = submit(sched, "bad", [7, 8, poison, 9], 8)
    for _ in range(3):  # the bad request's prefill batch fails; the loop's recovery runs
        try:
            sched.step()
        except RuntimeError:
            sched.recover_from_step_error(RuntimeError("injected fault"))
    later = [submit(sched, f"later{i}", p, 8) for i, p in enumerate(healthy)]
    run_to_completion(sched)
    reason = bad.finished_reason.to_json()
    assert reason["type"] == "abort" and reason["status_code"] == 500
    assert "injected fault" in reason["message"]
    for req, p in zip(early + later, healthy + healthy):
        assert req.output_ids == hf_greedy(hf_model, p, 8)
    assert_no_leak(sched)


def _turn_is_free(path) -> bool:
    import fcntl
    import os

    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_a_scheduler_gives_its_turn_back_after_every_step(model_dir, hf_model, monkeypatch, tmp_path):
    """SGLANG_CPU_TURNS_FILE: one turn per step that runs a forward, free again when the step ends,
    a failing step's too; the outputs are unchanged."""
    path = str(tmp_path / "turns")
    monkeypatch.setenv("SGLANG_CPU_TURNS_FILE", path)
    sched = make_scheduler(model_dir)
    assert sched.turns.enabled
    prompts = random_prompts([12, 30], seed=3)
    reqs = [submit(sched, f"t{i}", p, 6) for i, p in enumerate(prompts)]
    while sched.has_work():
        sched.step()
        assert _turn_is_free(path)
    assert sched.turns.turns_taken == sched.forward_ct > 0
    poison = 4242
    sched.worker.model_runner.forward = PoisonedForward(sched.worker.model_runner, poison)
    submit(sched, "bad", [7, poison], 4)
    with pytest.raises(RuntimeError, match="injected fault"):
        sched.step()
    assert _turn_is_free(path)
    sched.recover_from_step_error(RuntimeError("injected fault"))
    for req, p in zip(reqs, prompts):
        assert req.output_ids == hf_greedy(hf_model, p, 6)
    assert_no_leak(sched)
    sched.close()


def test_the_loop_contains_a_fault_and_gives_up_after_too_many(model_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_SCHEDULER_MAX_CONSECUTIVE_ERRORS", "3")
    sched = make_scheduler(model_dir)
    loop = SchedulerLoop(sched, PortArgs.init_new(sched.server_args))
    sched.worker.model_runner.forward = PoisonedForward(sched.worker.model_runner, 4242, times=100)
    submit(sched, "bad1", [4242, 1, 2], 4)
    loop.run_once()  # contained: the request is aborted, the loop goes on
    assert loop.consecutive_errors == 1 and not sched.has_work()
    for i in range(2):
        submit(sched, f"bad{i + 2}", [4242, 3], 4)
        if i == 0:
            loop.run_once()
    with pytest.raises(RuntimeError, match="injected fault"):
        loop.run_once()  # the third failure in a row is fatal
    loop.ctx.destroy(linger=0)


def test_mixed_chunks_match_hf(model_dir, hf_model):
    sched = make_scheduler(model_dir, chunked_prefill_size=16, enable_mixed_chunk=True, page_size=16)
    prompts = random_prompts([5, 40, 70, 9, 33], seed=3)
    reqs = [submit(sched, "m0", prompts[0], 20)]
    for _ in range(3):
        sched.step()  # m0 is decoding when the next prompts arrive: their chunks carry its tokens
    reqs += [submit(sched, f"m{i}", p, 20) for i, p in enumerate(prompts[1:], 1)]
    run_to_completion(sched)
    assert sched.stats.num_mixed_batches > 3
    for req, p in zip(reqs, prompts):
        assert req.output_ids == hf_greedy(hf_model, p, 20), req.rid
    assert_no_leak(sched)


def _request(sched, rid, ids, **sampling):
    params = SamplingParams(**{"temperature": 0.0, **sampling})
    params.normalize(sched.tokenizer)
    return sched.add_request(TokenizedGenerateReqInput(rid=rid, input_text=None, input_ids=ids, sampling_params=params,
                                                       return_logprob="logprob" in rid, token_ids_logprob=[3, 99]
                                                       if "tids" in rid else None))


def test_stop_regex_zero_tokens_and_token_ids_logprob(model_dir, hf_model):
    sched = make_scheduler(model_dir)
    prompt = random_prompts([10], seed=5)[0]
    want = hf_greedy(hf_model, prompt, 12)
    text = [sched.tokenizer.decode(want[: i + 1]) for i in range(12)]
    # A regex that matches the decoded output for the first time at token k stops there.
    k = 5
    target = text[k]
    pattern = "^" + re.escape(target)
    assert not any(re.search(pattern, t) for t in text[:k])
    r1 = _request(sched, "regex", prompt, max_new_tokens=12, stop_regex=pattern)
    r2 = _request(sched, "zero", prompt, max_new_tokens=0)
    r3 = _request(sched, "logprob-tids", prompt, max_new_tokens=4, ignore_eos=True)
    run_to_completion(sched)
    assert r1.finished_reason.to_json() == {"type": "stop", "matched": pattern}
    assert r1.output_ids == want[: k + 1]
    assert r2.output_ids == [] and r2.finished_reason.to_json() == {"type": "length", "length": 0}
    assert r3.output_ids == want[:4]
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + want[:3]])).logits[0, len(prompt) - 1:].float()
    ref = torch.log_softmax(logits, dim=-1)
    for pos, step in enumerate(r3.logprobs.output_token_ids_logprobs):
        values = dict((tid, v) for v, tid in step)
        assert set(values) == {3, 99}
        for tid, v in values.items():
            assert math.isclose(v, float(ref[pos, tid]), abs_tol=1e-4)
    assert_no_leak(sched)
