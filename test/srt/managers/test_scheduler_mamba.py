"""Mamba2-hybrid models (NemotronH, Falcon-H1) through the in-process scheduler: each request owns
a MambaPool slot, the radix cache keeps Mamba states at node ends (MAMBA component), chunked
prefill carries the state across chunks, retraction recomputes. Greedy tokens must equal HF
transformers', and after everything no KV, request-row or Mamba slot may be left behind."""


import pytest

from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.server_args import ServerArgs
from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test import scheduler_utils
from sglang.test.scheduler_utils import assert_no_leak, random_prompts, run_to_completion, submit
from sglang.test.tiny_models import make_tiny_model

MAX_STEPS = 5000
VOCAB_HI = 1000  # the tiny tokenizer's vocabulary is larger; any ids below it are valid


@pytest.fixture(scope="module", params=["nemotron_h", "falcon_h1"])
def arch_models(request, tmp_path_factory):
    d = make_tiny_model(str(tmp_path_factory.mktemp(request.param)), request.param, seed=2)
    return request.param, d, load_hf_model(d)


def make_scheduler(model_dir, **kw):
    args = dict(max_total_tokens=4096, chunked_prefill_size=16, page_size=1, max_running_requests=8,
                max_mamba_cache_size=48)
    args.update(kw)
    return scheduler_utils.make_scheduler(model_dir, **args)






def prompts(lengths, seed):
    return random_prompts(lengths, seed, VOCAB_HI)




@pytest.mark.parametrize("page_size", [1, 16])
def test_mixed_batch_with_small_chunks_matches_hf(arch_models, page_size):
    arch, d, hf = arch_models
    if arch == "falcon_h1" and page_size == 16:
        pytest.skip("paged KV is covered on NemotronH")
    sched = make_scheduler(d, page_size=page_size)
    assert ComponentType.MAMBA in sched.memory.tree_cache.core.components
    ps = prompts([1, 7, 23, 40, 70, 33], seed=page_size)  # > SSD chunk (8) and > prefill chunk (16)
    reqs = [submit(sched, f"r{i}", p, 6) for i, p in enumerate(ps)]
    run_to_completion(sched)
    for r, p in zip(reqs, ps):
        assert r.finished_reason.to_json() == {"type": "length", "length": 6}
        assert r.output_ids == hf_greedy(hf, p, 6), r.rid
    assert_no_leak(sched)


def test_repeated_prompt_hits_cached_state(arch_models):
    arch, d, hf = arch_models
    sched = make_scheduler(d)
    p = prompts([45], seed=7)[0]
    first = submit(sched, "first", p, 5)
    run_to_completion(sched)
    want = hf_greedy(hf, p, 5)
    assert first.output_ids == want and first.cached_tokens == 0
    # Same prompt: the state saved at the last prefill-chunk end (32 of 45 tokens) is copied in.
    again = submit(sched, "again", p, 5)
    run_to_completion(sched)
    assert again.output_ids == want
    assert again.cached_tokens == 32
    # A follow-up turn (prompt + answer + more) resumes from the finished request's state.
    follow = p + want[:-1]
    follow2 = follow + prompts([6], seed=8)[0]
    turn = submit(sched, "turn", follow2, 4)
    run_to_completion(sched)
    assert turn.output_ids == hf_greedy(hf, follow2, 4)
    assert turn.cached_tokens == len(follow)
    assert_no_leak(sched)


def test_retraction_recomputes_with_identical_outputs(arch_models):
    arch, d, hf = arch_models
    # 6 requests x (30 prompt + 40 output) tokens do not fit into 260 KV slots at once.
    sched = make_scheduler(d, max_total_tokens=260, chunked_prefill_size=64)
    ps = prompts([30] * 6, seed=11)
    reqs = [submit(sched, f"q{i}", p, 40) for i, p in enumerate(ps)]
    run_to_completion(sched)
    assert sum(r.num_retractions for r in reqs) > 0
    for r, p in zip(reqs, ps):
        assert r.output_ids == hf_greedy(hf, p, 40), r.rid
    assert_no_leak(sched)


def test_mamba_slots_bound_admission_and_tree_states_are_evicted(arch_models):
    arch, d, hf = arch_models
    # 4 slots for 6 requests: admission waits for slots, and the tree's states are evicted
    # whenever a request needs a slot.
    sched = make_scheduler(d, max_mamba_cache_size=4, max_running_requests=4)
    ps = prompts([20, 35, 9, 50, 18, 27], seed=13)
    reqs = [submit(sched, f"m{i}", p, 5) for i, p in enumerate(ps)]
    run_to_completion(sched)
    for r, p in zip(reqs, ps):
        assert r.output_ids == hf_greedy(hf, p, 5), r.rid
    assert_no_leak(sched)


@pytest.mark.parametrize("slots", [1, 2])
def test_tiny_mamba_pool_never_stalls(arch_models, slots):
    """With 1 slot the tree's only state is the one a match would need: the request starts from
    scratch instead of waiting forever; with 2 the finished request's donated slot is hit."""
    arch, d, hf = arch_models
    sched = make_scheduler(d, max_mamba_cache_size=slots, max_running_requests=1)
    base = prompts([20], seed=17)[0]
    first = submit(sched, "first", base, 4)
    run_to_completion(sched)
    follow = base + first.output_ids[:-1] + prompts([5], seed=18)[0]
    turn = submit(sched, "turn", follow, 4)
    run_to_completion(sched)
    assert first.output_ids == hf_greedy(hf, base, 4)
    assert turn.output_ids == hf_greedy(hf, follow, 4)
    assert turn.cached_tokens == (0 if slots == 1 else len(base) + 3)
    assert_no_leak(sched)


def test_host_pool_retraction_is_rejected_for_mamba_models(arch_models):
    arch, d, hf = arch_models
    if arch != "nemotron_h":
        pytest.skip("one model is enough")
    with pytest.raises(ValueError, match="^Host-pool retraction does not support Mamba models.$"):
        Scheduler(ServerArgs(model_path=d, dtype="float32", max_total_tokens=1024, disaggregation_mode="decode",
                             disaggregation_transfer_backend="fake",
                             disaggregation_decode_retraction_backup="host_pool"))
    # The auto rule picks cpu_tensor for these models.
    sched = Scheduler(ServerArgs(model_path=d, dtype="float32", max_total_tokens=1024, disaggregation_mode="decode",
                                 disaggregation_transfer_backend="fake"))
    assert sched.server_args.disaggregation_decode_retraction_backup == "cpu_tensor"
    assert sched.memory.retraction_store.mamba_pool is sched.memory.mamba_pool
