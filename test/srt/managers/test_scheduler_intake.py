"""Admission rules of the scheduler, in-process (issue 13): --max-queued-requests, upstream's
waiting/running time limits, exact-rid aborts with upstream's texts, --random-seed,
--tokenizer-path, and the "Decode batch. #running-req: N" log line upstream's tools parse."""

import logging
import os
import shutil

import pytest

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.core.finish_reason import (
    ABORT_IN_QUEUE_MESSAGE,
    ABORT_RUNNING_MESSAGE,
    QUEUE_FULL_MESSAGE,
    QUEUED_TIMEOUT_MESSAGE,
    RUNNING_TIMEOUT_MESSAGE,
)
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test import scheduler_utils
from sglang.test.scheduler_utils import assert_no_leak, random_prompts, run_to_completion, submit
from sglang.test.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("intake_llama")), "llama", seed=23)


def make_scheduler(model_dir, **kw):
    args = dict(max_total_tokens=2048, chunked_prefill_size=64, page_size=1)
    args.update(kw)
    return scheduler_utils.make_scheduler(model_dir, **args)


def test_max_queued_requests_refuses_with_503(model_dir):
    sched = make_scheduler(model_dir, max_queued_requests=2)
    reqs = [submit(sched, f"q{i}", [5, 6, 7], 4) for i in range(3)]
    assert reqs[2].finished_reason.to_json()["message"] == QUEUE_FULL_MESSAGE
    assert reqs[2].finished_reason.status_code == 503
    run_to_completion(sched)
    assert [r.finished_reason.to_json()["type"] for r in reqs[:2]] == ["length", "length"]
    assert_no_leak(sched)


def test_waiting_and_running_timeouts(model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_QUEUED_TIMEOUT_MS", "300")  # the deprecated name, in milliseconds
    monkeypatch.setenv("SGLANG_REQ_RUNNING_TIMEOUT", "0.5")
    sched = make_scheduler(model_dir, max_running_requests=1)
    assert sched.intake.waiting_timeout_s == pytest.approx(0.3) and sched.intake.running_timeout_s == 0.5
    runner = submit(sched, "runs", [5, 6, 7], 100000)
    waiter = submit(sched, "waits", [8, 9], 4)
    run_to_completion(sched)
    assert runner.finished_reason.to_json()["message"] == RUNNING_TIMEOUT_MESSAGE
    assert waiter.finished_reason.to_json()["message"] == QUEUED_TIMEOUT_MESSAGE
    assert runner.finished_reason.status_code == waiter.finished_reason.status_code == 503
    assert_no_leak(sched)


def test_abort_is_by_exact_rid_with_upstreams_texts(model_dir):
    sched = make_scheduler(model_dir, max_running_requests=1)
    x1 = submit(sched, "x1", [5, 6, 7], 50)
    x10 = submit(sched, "x10", [5, 6, 7], 5)
    sched.step()  # x1 runs, x10 waits
    sched.abort_request("x1")
    run_to_completion(sched)
    assert x1.finished_reason.to_json()["message"] == ABORT_RUNNING_MESSAGE
    assert x10.finished_reason.to_json() == {"type": "length", "length": 5}
    y = submit(sched, "y", [5, 6, 7], 50)
    z = submit(sched, "z", [5, 6, 7], 50)
    sched.step()
    sched.abort_request("z")  # still waiting
    run_to_completion(sched)
    assert z.finished_reason.to_json() == {"type": "abort", "message": ABORT_IN_QUEUE_MESSAGE, "status_code": None,
                                           "err_type": None}
    assert y.finished_reason.to_json()["type"] == "length"
    assert_no_leak(sched)


def _sample(sched, seed_rid):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, ignore_eos=True)
    params.normalize(None)
    req = sched.add_request(TokenizedGenerateReqInput(rid=seed_rid, input_text=None, input_ids=[5, 6, 7],
                                                      sampling_params=params))
    run_to_completion(sched)
    return req.output_ids


def test_random_seed_makes_sampling_reproducible(model_dir):
    a = _sample(make_scheduler(model_dir, random_seed=1234), "a")
    b = _sample(make_scheduler(model_dir, random_seed=1234), "b")
    c = _sample(make_scheduler(model_dir, random_seed=4321), "c")
    assert a == b
    assert a != c


def test_the_scheduler_uses_tokenizer_path(model_dir, tmp_path):
    weights_only = tmp_path / "weights_only"
    weights_only.mkdir()
    for name in os.listdir(model_dir):
        if name.endswith((".json", ".safetensors")) and "token" not in name and name != "chat_template.json":
            shutil.copy(os.path.join(model_dir, name), weights_only / name)
    sched = make_scheduler(str(weights_only), tokenizer_path=model_dir)
    assert sched.tokenizer is not None and sched.tokenizer.decode([5, 6]) != ""


def test_decode_log_line(model_dir, caplog):
    sched = make_scheduler(model_dir, decode_log_interval=1)
    with caplog.at_level(logging.INFO, logger="sglang.srt.managers.scheduler"):
        for i, p in enumerate(random_prompts([4, 6], seed=2)):
            submit(sched, f"log{i}", p, 3)
        run_to_completion(sched)
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("Prefill batch. #new-seq: 2, #new-token: 10, #cached-token: 0, ") for m in lines), lines
    decode = [m for m in lines if m.startswith("Decode batch. #running-req: ")]
    assert decode and "#token: " in decode[0] and "gen throughput (token/s): " in decode[0]
    assert "#running-req: 2," in decode[0]


def test_allow_auto_truncate_keeps_the_head_of_a_prompt_longer_than_the_pool(model_dir):
    """--allow-auto-truncate: a prompt past the scheduler's input limit (here the KV pool) runs on
    its first `max_req_input_len` tokens, as upstream, instead of the 400 it gets without it."""
    from sglang.test.hf_reference import hf_greedy, load_hf_model

    prompt = random_prompts([300], seed=8, vocab_hi=1000)[0]
    refused = make_scheduler(model_dir, max_total_tokens=256)
    req = submit(refused, "long", prompt, 4)
    assert req.finished_reason.status_code == 400
    assert "Use a shorter input or enable --allow-auto-truncate." in req.finished_reason.to_json()["message"]
    assert_no_leak(refused)
    sched = make_scheduler(model_dir, max_total_tokens=256, allow_auto_truncate=True)
    req = submit(sched, "long", prompt, 4)
    run_to_completion(sched)
    kept = sched.max_req_input_len
    assert req.origin_input_ids == prompt[:kept] and kept < len(prompt)
    assert req.finished_reason.to_json() == {"type": "length", "length": 4}
    assert req.output_ids == hf_greedy(load_hf_model(model_dir), prompt[:kept], 4)
    assert_no_leak(sched)
