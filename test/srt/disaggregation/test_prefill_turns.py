"""A prefill server on cores it shares with its decode server (`SGLANG_CPU_TURNS_FILE`, what
`launch_pd` sets on one machine) keeps its turn until the KV its step sent has landed: the request
is complete on the prefill side when the step returns, so the decode server's next batch can
decode it. Without shared cores the step returns at once and the transfer completes later. Real
prefill and decode schedulers in this process, Mooncake over loopback TCP."""

import time

import pytest

from sglang.srt.utils import compute_turns
from sglang.srt.utils.compute_turns import ENV
from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test.scheduler_utils import InProcessPD, random_prompts
from sglang.test.tiny_models import make_tiny_model

NEW_TOKENS = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("prefill_turns_llama")), "llama", seed=6)


def _step_until_prefilled(pd, timeout=60.0):
    """Steps both sides until the prefill's forward ran; returns what the prefill role holds in flight
    right after that step."""
    deadline = time.monotonic() + timeout
    while pd.prefill.forward_ct == 0:
        assert time.monotonic() < deadline, "the prefill never ran its forward"
        pd.prefill.step()
        if pd.prefill.forward_ct:
            break
        pd.decode.step()
        time.sleep(0.001)
    return list(pd.prefill.role.inflight_queue)


@pytest.mark.parametrize("shared_cores", [True, False])
def test_kv_lands_before_the_prefill_gives_its_turn_back(model_dir, tmp_path, monkeypatch, shared_cores):
    pytest.importorskip("mooncake.engine")
    if shared_cores:
        monkeypatch.setenv(ENV, str(tmp_path / "turns"))
    else:
        monkeypatch.delenv(ENV, raising=False)
    released = []  # each call of the real release_openmp_workers by a scheduler, and what it returned
    real_release = compute_turns.release_openmp_workers
    monkeypatch.setattr(compute_turns, "release_openmp_workers", lambda: released.append(real_release()))
    pd = InProcessPD(model_dir, chunked_prefill_size=64)
    try:
        assert pd.prefill.turns.enabled == shared_cores
        prompt = random_prompts([40], seed=9, vocab_hi=1000)[0]
        pd.prefill.add_request(pd.request("p1", prompt, NEW_TOKENS, 9100))
        dreq = pd.decode.add_request(pd.request("d1", prompt, NEW_TOKENS, 9100))
        in_flight = _step_until_prefilled(pd)
        if shared_cores:
            assert in_flight == []  # landed and completed within the turn
            assert pd.prefill.memory.allocator.available_size() + pd.prefill.memory.tree_cache.evictable_size() \
                == pd.prefill.memory.init_free_kv  # its KV is only cached now, nothing holds it
        else:
            assert [r.rid for r in in_flight] == ["p1"]  # the transfer is completed by a later step
        deadline = time.monotonic() + 60
        while (pd.prefill.has_work() or pd.decode.has_work()) and time.monotonic() < deadline:
            pd.prefill.step()
            pd.decode.step()
            time.sleep(0.001)
        assert not pd.decode.has_work()
        assert dreq.output_ids == hf_greedy(load_hf_model(model_dir), prompt, NEW_TOKENS)
        # on shared cores every forward of either scheduler ended the idle OpenMP workers (their spin
        # would hold a core the other needs); without shared cores none did
        forwards = pd.prefill.forward_ct + pd.decode.forward_ct
        assert released == ([True] * forwards if shared_cores else []), (released, forwards)
    finally:
        pd.close()
