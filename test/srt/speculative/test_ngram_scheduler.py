"""NGRAM speculative decoding in an in-process scheduler, on a tiny random Llama with a 16-token
vocabulary: its greedy output falls into cycles, so drafts taken from the request's own tokens
are accepted often (the acceptance counters say so), and every result is compared with HF
transformers' greedy tokens and with a plain scheduler. Pools are whole afterwards."""

import pytest

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test.scheduler_utils import assert_no_leak, make_scheduler, random_prompts, run_to_completion, submit
from sglang.test.tiny_models import make_tiny_model

VOCAB = 16
SPEC = dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=6)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("spec_v16")), "llama", seed=0, vocab_size=VOCAB,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return load_hf_model(model_dir)


def _prompts(lengths, seed):
    # a repeated random phrase: something to copy from the first step on
    return [p * 3 for p in random_prompts(lengths, seed=seed, vocab_hi=VOCAB)]


def _submit(sched, rid, ids, max_new_tokens, **sampling):
    params = SamplingParams(max_new_tokens=max_new_tokens, **{"temperature": 0.0, "ignore_eos": True, **sampling})
    params.normalize(sched.tokenizer)
    return sched.add_request(TokenizedGenerateReqInput(rid=rid, input_text=None, input_ids=ids, sampling_params=params,
                                                       return_logprob=sampling.pop("return_logprob", False)))


def test_greedy_identity_with_accepted_drafts(model_dir, hf_model):
    prompts = _prompts([5, 9, 13, 7], seed=1)
    sched = make_scheduler(model_dir, **SPEC)
    reqs = [submit(sched, f"r{i}", p, 60) for i, p in enumerate(prompts)]
    run_to_completion(sched)
    for req, p in zip(reqs, prompts):
        assert req.output_ids == hf_greedy(hf_model, p, 60), req.rid
        # every decode step verifies; each emits its accepted drafts and one more token
        assert req.spec.verify_ct + req.spec.num_correct_drafts == 59
    correct = sum(r.spec.num_correct_drafts for r in reqs)
    assert correct > 0 and correct <= sum(r.spec.num_proposed_drafts for r in reqs)
    # accepted drafts save forwards: 59 decode steps would take 59 forwards (+ 1 prefill)
    assert sched.worker.forward_ct < 59
    assert_no_leak(sched)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 5, 8, 33])
def test_max_new_tokens_is_exact(model_dir, hf_model, max_new_tokens):
    prompt = _prompts([6], seed=2)[0]
    sched = make_scheduler(model_dir, **SPEC)
    req = submit(sched, "m", prompt, max_new_tokens)
    run_to_completion(sched)
    assert req.output_ids == hf_greedy(hf_model, prompt, max_new_tokens)
    assert req.finished_reason.to_json() == {"type": "length", "length": max_new_tokens}
    assert_no_leak(sched)


def test_stop_string_inside_an_accepted_run(model_dir, hf_model):
    """The greedy text repeats one token for a while, so one verify step accepts a long drafted
    run of it; a stop string of six of them matches in the middle of that run. The request must
    end exactly where the plain decoder ends and drop the rest of the run (whose KV goes back)."""
    from transformers import AutoTokenizer

    prompt = _prompts([7], seed=1)[0]
    full = hf_greedy(hf_model, prompt, 40)
    token = max(set(full), key=full.count)
    assert full.count(token) >= 8, full
    stop = AutoTokenizer.from_pretrained(model_dir).decode([token] * 6)
    outs, runs = {}, []
    for name, extra in (("plain", {}), ("spec", SPEC)):
        sched = make_scheduler(model_dir, **extra)
        if extra:
            verify = sched.output.process_verify

            def record(reqs, result, *args, verify=verify):
                runs.extend((len(r.output_ids), list(t)) for r, t in zip(reqs, result.spec_tokens))
                return verify(reqs, result, *args)

            sched.output.process_verify = record
        outs[name] = _submit(sched, "s", prompt, 40, stop=[stop])
        run_to_completion(sched)
        assert_no_leak(sched)
    plain, spec = outs["plain"], outs["spec"]
    assert plain.finished_reason.to_json() == {"type": "stop", "matched": stop}
    assert spec.output_ids == plain.output_ids and len(plain.output_ids) < 40
    assert spec.finished_reason.to_json() == plain.finished_reason.to_json()
    last_start, last_run = runs[-1]
    assert len(spec.output_ids) - last_start < len(last_run), "the stop string did not land inside a run"


def test_logprobs_are_the_targets(model_dir):
    prompts = _prompts([7, 11], seed=4)
    results = {}
    for name, extra in (("plain", {}), ("spec", SPEC)):
        sched = make_scheduler(model_dir, **extra)
        reqs = []
        for i, p in enumerate(prompts):
            params = SamplingParams(max_new_tokens=30, temperature=0.0, ignore_eos=True)
            params.normalize(None)
            reqs.append(sched.add_request(TokenizedGenerateReqInput(
                rid=f"l{i}", input_text=None, input_ids=p, sampling_params=params, return_logprob=True,
                top_logprobs_num=3)))
        run_to_completion(sched)
        results[name] = reqs
        assert_no_leak(sched)
    assert sum(r.spec.num_correct_drafts for r in results["spec"]) > 0
    for a, b in zip(results["plain"], results["spec"]):
        assert a.output_ids == b.output_ids
        la, lb = a.logprobs.output_token_logprobs, b.logprobs.output_token_logprobs
        assert len(la) == len(lb) == 30
        for (va, ta), (vb, tb) in zip(la, lb):
            assert ta == tb and va == pytest.approx(vb, abs=1e-4)
        for ta, tb in zip(a.logprobs.output_top_logprobs, b.logprobs.output_top_logprobs):
            assert [t for _v, t in ta] == [t for _v, t in tb]
            assert [v for v, _t in ta] == pytest.approx([v for v, _t in tb], abs=1e-4)


@pytest.mark.parametrize("page_size", [1, 4])
def test_chunked_prefill_prefix_cache_and_retraction(model_dir, hf_model, page_size):
    """A pool too small for every request at once (decode retracts and recomputes), prompts
    prefilled in chunks, a shared prefix through the radix tree, pages of 4 (the rejected drafts'
    pages go back whole): HF's greedy tokens, pools whole."""
    shared = random_prompts([24], seed=5, vocab_hi=VOCAB)[0]
    prompts = [shared + p for p in _prompts([4] * 8, seed=6)]
    sched = make_scheduler(model_dir, **SPEC, page_size=page_size, speculative_ngram_max_bfs_breadth=1,
                           max_total_tokens=200, chunked_prefill_size=16)
    reqs = [submit(sched, f"c{i}", p, 40) for i, p in enumerate(prompts)]
    run_to_completion(sched)
    assert sum(r.num_retractions for r in reqs) > 0
    assert sum(r.spec.num_correct_drafts for r in reqs) > 0
    assert any(r.cached_tokens > 0 for r in reqs)
    for req, p in zip(reqs, prompts):
        assert req.output_ids == hf_greedy(hf_model, p, 40), req.rid
    assert_no_leak(sched)


def test_penalties_and_min_tokens_keep_plain_output(model_dir):
    """Each verify row sees the history up to its own draft position: repetition/frequency
    penalties and min_new_tokens give what the plain decoder gives, token for token."""
    prompts = _prompts([6, 8], seed=7)
    sampling = dict(repetition_penalty=1.3, frequency_penalty=0.2, min_new_tokens=10, ignore_eos=False)
    outs = {}
    for name, extra in (("plain", {}), ("spec", SPEC)):
        sched = make_scheduler(model_dir, **extra)
        outs[name] = [_submit(sched, f"p{i}", p, 40, **sampling) for i, p in enumerate(prompts)]
        run_to_completion(sched)
        assert_no_leak(sched)
    assert [r.output_ids for r in outs["plain"]] == [r.output_ids for r in outs["spec"]]
    assert sum(r.spec.verify_ct for r in outs["spec"]) > 0


@pytest.mark.parametrize("backup", ["host_pool", "cpu_tensor"])
def test_pd_decode_server_retracts_and_resumes_from_backup(model_dir, hf_model, backup):
    """A PD decode server (the `fake` transfer backend computes the prompt's KV locally): NGRAM
    needs nothing from the prefill side; under memory pressure requests are retracted with their
    KV backed up and resumed without recomputation; HF's greedy tokens, pools and backups whole."""
    prompts = _prompts([13] * 8, seed=8)
    sched = make_scheduler(model_dir, **SPEC, max_total_tokens=320, chunked_prefill_size=64, max_running_requests=16,
                           disaggregation_mode="decode", disaggregation_transfer_backend="fake",
                           num_reserved_decode_tokens=8, disaggregation_decode_retraction_backup=backup)
    reqs = [submit(sched, f"d{i}", p, 40) for i, p in enumerate(prompts)]
    run_to_completion(sched)
    assert sum(r.num_retractions for r in reqs) > 0
    assert sched.stats.num_recomputed_tokens == 0
    assert sum(r.spec.num_correct_drafts for r in reqs) > 0
    for req, p in zip(reqs, prompts):
        assert req.output_ids == hf_greedy(hf_model, p, 40), req.rid
    assert_no_leak(sched)
