"""The scheduler of an embedding server (`--is-embedding`), driven in-process: every prompt,
prefilled in chunks and batched with others, ends with HF transformers' pooled vector (last
token, mean, or a classifier's logits), radix-cache hits change nothing, and no KV is left."""

import pytest
import torch

from sglang.test import scheduler_utils
from sglang.test.hf_reference import hf_pooled
from sglang.test.scheduler_utils import assert_no_leak, random_prompts, run_to_completion, submit
from sglang.test.tiny_models import make_tiny_model, write_sentence_transformers_pooling

LENGTHS = [1, 2, 7, 15, 16, 17, 40, 61]  # around and across the 16-token chunk


def run_prompts(model_dir, prompts, **kw):
    sched = scheduler_utils.make_scheduler(model_dir, is_embedding=True, chunked_prefill_size=16,
                                           max_total_tokens=4096, **kw)
    reqs = [submit(sched, f"r{i}", p, 0) for i, p in enumerate(prompts)]
    run_to_completion(sched)
    return sched, reqs


def assert_close(got, ref, tol=2e-5):
    assert len(got) == len(ref)
    assert torch.allclose(torch.tensor(got), torch.tensor(ref), atol=tol, rtol=0), (got[:4], ref[:4])


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_pooled_vectors_match_hf_across_chunks(tmp_path, pooling):
    model = make_tiny_model(str(tmp_path / "m"), "llama", seed=3)
    if pooling == "mean":
        write_sentence_transformers_pooling(model, "mean", normalize=True)
    prompts = random_prompts(LENGTHS, seed=5)
    sched, reqs = run_prompts(model, prompts)
    refs = hf_pooled(model, prompts, pooling)
    for req, ref in zip(reqs, refs):
        assert req.finished_reason.to_json() == {"type": "length", "length": 0}
        assert req.output_ids == []
        assert abs(sum(x * x for x in req.embedding) - 1.0) < 1e-5
        assert_close(req.embedding, ref)
    assert_no_leak(sched)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_radix_cache_hits_keep_the_vector(tmp_path, pooling):
    """Last-token pooling may start from a cached prefix (only the last token's state counts);
    mean pooling must not (every token's hidden state is summed), so it recomputes."""
    model = make_tiny_model(str(tmp_path / "m"), "qwen2", seed=4)
    if pooling == "mean":
        write_sentence_transformers_pooling(model, "mean", normalize=True)
    prefix = random_prompts([40], seed=8)[0]
    first, second = prefix + [11, 12], prefix + [13, 14, 15]
    sched = scheduler_utils.make_scheduler(model, is_embedding=True, chunked_prefill_size=16, max_total_tokens=4096)
    ra = submit(sched, "a", first, 0)
    run_to_completion(sched)
    rb = submit(sched, "b", second, 0)
    run_to_completion(sched)
    assert (rb.cached_tokens >= 40) if pooling == "last" else (rb.cached_tokens == 0)
    ref_a, ref_b = hf_pooled(model, [first, second], pooling)
    assert_close(ra.embedding, ref_a)
    assert_close(rb.embedding, ref_b)
    assert_no_leak(sched)


def test_sequence_classifier_gives_the_last_token_logits(tmp_path):
    model = make_tiny_model(str(tmp_path / "cls"), "qwen3", seed=6, sequence_classification=True, num_labels=3)
    prompts = random_prompts([3, 16, 33], seed=9)
    sched, reqs = run_prompts(model, prompts)
    for req, ref in zip(reqs, hf_pooled(model, prompts)):
        assert len(req.embedding) == 3
        assert_close(req.embedding, ref)
    assert_no_leak(sched)
