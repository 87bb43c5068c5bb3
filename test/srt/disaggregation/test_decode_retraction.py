"""Decode-server retraction with KV backups (issue 4): a PD decode scheduler driven in-process.

The decode server runs with the `fake` transfer backend, which computes each prompt's KV with a
local prefill; from then on the request decodes, retracts and resumes through the real decode
path. Outputs must equal an unpressured run (HF greedy), with zero recomputed prompt tokens."""

import pytest

from sglang.srt.mem_cache.host_pool import decode_retraction_hicache_ratio
from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test.scheduler_utils import assert_no_leak, make_scheduler, random_prompts, run_to_completion, submit
from sglang.test.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("decode_llama")), "llama", seed=3)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return load_hf_model(model_dir)


def decode_scheduler(model_dir, backup, max_total_tokens=320, page_size=1, **kw):
    args = dict(max_total_tokens=max_total_tokens, page_size=page_size, chunked_prefill_size=64, disaggregation_mode="decode", disaggregation_transfer_backend="fake",
                num_reserved_decode_tokens=8, max_running_requests=16)
    if backup is not None:
        args["disaggregation_decode_retraction_backup"] = backup
    args.update(kw)
    return make_scheduler(model_dir, **args)










@pytest.mark.parametrize("backup,page_size", [("host_pool", 1), ("host_pool", 16), ("cpu_tensor", 1), ("cpu_tensor", 16)])
def test_retracted_requests_resume_without_recompute(model_dir, hf_model, backup, page_size):
    sched = decode_scheduler(model_dir, backup, page_size=page_size)
    assert sched.server_args.disaggregation_decode_retraction_backup == backup
    ps = random_prompts([40] * 8, seed=21)
    reqs = [submit(sched, f"d{i}", p, 40) for i, p in enumerate(ps)]
    run_to_completion(sched)
    assert sum(r.num_retractions for r in reqs) > 0
    assert sched.stats.num_recomputed_tokens == 0
    for r, p in zip(reqs, ps):
        assert r.finished_reason.to_json() == {"type": "length", "length": 40}
        assert r.output_ids == hf_greedy(hf_model, p, 40), r.rid
    assert_no_leak(sched)


def test_auto_backup_resolves_to_host_pool_with_backup_only_ratio(model_dir):
    sched = decode_scheduler(model_dir, None, max_total_tokens=256, page_size=16, context_length=81)
    sa = sched.server_args
    assert sa.disaggregation_decode_retraction_backup == "host_pool"
    assert sa.resolution_source("disaggregation_decode_retraction_backup") == "kv_cache_builder.decode_retraction"
    # The host pool must hold the longest request: max_context_len - 1 tokens, page aligned.
    longest = -(-(sched.memory.req_to_token_pool.max_context_len - 1) // 16) * 16
    assert 80 <= longest < 256
    assert sa.hicache_ratio == pytest.approx(longest / 256)
    assert sched.memory.retraction_store.host_pool.size == longest
    assert sched.internal_state()["retraction_backup"]["backend"] == "host_pool"


def test_backup_only_ratio_vectors():
    assert decode_retraction_hicache_ratio(81, 256, 16) == pytest.approx(80 / 256)
    assert decode_retraction_hicache_ratio(81, 256, 16, host_receive_threshold=0.5) == pytest.approx(160 / 256)
    assert decode_retraction_hicache_ratio(2049, 256, 16) == pytest.approx(1.0)
    assert decode_retraction_hicache_ratio(2049, 256, 16, host_receive_threshold=0.5) == pytest.approx(2.0)
    assert decode_retraction_hicache_ratio(2, 256, 16) == pytest.approx(0.2)


def test_none_backup_aborts_with_503(model_dir):
    sched = decode_scheduler(model_dir, "none")
    reqs = [submit(sched, f"n{i}", p, 40) for i, p in enumerate(random_prompts([40] * 8, seed=22))]
    run_to_completion(sched)
    aborted = [r for r in reqs if r.finished_reason.to_json()["type"] == "abort"]
    assert aborted
    for r in aborted:
        assert r.finished_reason.status_code == 503
        assert r.finished_reason.message == "Retracted under decode memory pressure without a KV backup. Retry later."
    assert_no_leak(sched)


def test_small_host_pool_aborts_with_500_and_leaks_nothing(model_dir):
    sched = decode_scheduler(model_dir, "host_pool", hicache_ratio=0.1)  # 32 host slots < one request's KV
    reqs = [submit(sched, f"h{i}", p, 40) for i, p in enumerate(random_prompts([40] * 8, seed=23))]
    run_to_completion(sched)
    aborted = [r for r in reqs if r.finished_reason.to_json()["type"] == "abort"]
    assert aborted
    for r in aborted:
        assert r.finished_reason.status_code == 500
        assert r.finished_reason.message == "Retraction host KV pool exhausted. Aborting the request."
    assert_no_leak(sched)


def test_aborting_retracted_requests_frees_backups(model_dir):
    # 4 x 28 prompt tokens in a 128-token pool: the first retraction comes after a few decode steps.
    sched = decode_scheduler(model_dir, "host_pool", max_total_tokens=128)
    host = sched.memory.retraction_store.host_pool
    for cycle in range(50):
        reqs = [submit(sched, f"c{cycle}_{i}", p, 60) for i, p in enumerate(random_prompts([28] * 4, seed=cycle))]
        for _ in range(200):
            sched.step()
            if sched.role.retracted_queue:
                break
        assert sched.role.retracted_queue, "no retraction happened"
        sched.abort_request(abort_all=True)
        run_to_completion(sched)
        assert all(r.finished() for r in reqs)
        assert host.available_size() == host.size
    assert_no_leak(sched)


@pytest.mark.parametrize("backup", ["host_pool", "cpu_tensor"])
def test_constrained_requests_resume_with_their_grammar_state(model_dir, backup):
    """Retracted mid-grammar and resumed from the backup: the matcher (kept by the request) goes on
    where it was, so every output is still in the regex's language, with zero recomputed tokens."""
    import re

    # A grammar ends requests early; a low conservativeness admits enough of them to run out of KV.
    sched = decode_scheduler(model_dir, backup, schedule_conservativeness=0.1)
    regex = r"[ab]( [ab]){59}"
    sched.grammar_manager.backend.get_future(("regex", regex)).result()  # admission must not depend on thread timing
    ps = random_prompts([40] * 8, seed=23)
    reqs = [submit(sched, f"g{i}", p, 130, regex=regex) for i, p in enumerate(ps)]
    run_to_completion(sched)
    assert sum(r.num_retractions for r in reqs) > 0
    assert sched.stats.num_recomputed_tokens == 0
    for r in reqs:
        assert r.finished_reason.to_json()["type"] == "stop", r.finished_reason.to_json()
        text = sched.tokenizer.decode(r.output_ids, skip_special_tokens=True)
        assert re.fullmatch(regex, text), (r.rid, text)
    assert_no_leak(sched)
