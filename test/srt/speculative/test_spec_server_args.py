"""The --speculative-* flags: upstream's names, defaults, resolution and messages for NGRAM; what
this server does not run is refused at start with a message that says so."""

import logging

import pytest

from sglang.srt.server_args import ServerArgs, prepare_server_args


def _args(**kw):
    return ServerArgs(model_path="default", device="cpu", **kw)


def test_ngram_resolves_like_upstream(caplog):
    with caplog.at_level(logging.WARNING):
        sa = _args(speculative_algorithm="ngram")
    assert sa.speculative_algorithm == "NGRAM"
    assert sa.speculative_num_draft_tokens == 12
    assert sa.speculative_eagle_topk == sa.speculative_ngram_max_bfs_breadth == 10
    assert sa.speculative_num_steps == 1  # num_draft_tokens // topk
    assert sa.max_running_requests == 48 and sa.enable_mixed_chunk is False
    assert sa.resolution_source("speculative_num_draft_tokens") == "_handle_speculative_decoding"
    text = caplog.text
    assert "Max running requests is reset to 48 for speculative decoding." in text
    assert "speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding." in text
    # defaults of the trie knobs are not reported as having no effect
    assert "have no effect" not in text


def test_explicit_values_are_kept():
    sa = _args(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4, max_running_requests=7,
               speculative_num_steps=3)
    assert (sa.speculative_num_draft_tokens, sa.max_running_requests, sa.speculative_num_steps) == (4, 7, 3)


def test_cli_flags_act():
    sa = prepare_server_args(["--model-path", "default", "--device", "cpu", "--speculative-algorithm", "NGRAM",
                              "--speculative-num-draft-tokens", "5", "--speculative-ngram-max-trie-depth", "9"])
    assert (sa.speculative_algorithm, sa.speculative_num_draft_tokens, sa.speculative_ngram_max_trie_depth) == (
        "NGRAM", 5, 9)
    assert not any(k.startswith("speculative_algorithm") for k in sa.ignored_upstream_args)


@pytest.mark.parametrize("kw,message", [
    (dict(speculative_algorithm="EAGLE"), "--speculative-algorithm EAGLE is not supported by this server yet"),
    (dict(speculative_algorithm="NEXTN"), "--speculative-algorithm EAGLE is not supported by this server yet"),
    (dict(speculative_algorithm="EAGLE3"), "--speculative-algorithm EAGLE3 is not supported by this server yet"),
    (dict(speculative_algorithm="STANDALONE", speculative_draft_model_path="/x"),
     "--speculative-algorithm STANDALONE is not supported by this server yet"),
    (dict(speculative_algorithm="MEDUSA"), "Unknown --speculative-algorithm 'MEDUSA'"),
    (dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=0),
     "--speculative-num-draft-tokens must be at least 1"),
    (dict(speculative_algorithm="NGRAM", page_size=16),
     "speculative_eagle_topk(10) > 1 with page_size(16) > 1 is unstable"),
    (dict(speculative_algorithm="NGRAM", speculative_ngram_external_corpus_path="/c.jsonl"),
     "--speculative-ngram-external-sam-budget must be positive when --speculative-ngram-external-corpus-path is set."),
    (dict(speculative_algorithm="NGRAM", speculative_ngram_external_corpus_path="/c.jsonl",
          speculative_ngram_external_sam_budget=2),
     "--speculative-ngram-external-corpus-path is not supported by this server"),
])
def test_refused_at_start(kw, message):
    with pytest.raises(ValueError) as e:
        _args(**kw)
    assert message in str(e.value)


def test_breadth_one_allows_pages_and_says_what_has_no_effect(caplog):
    with caplog.at_level(logging.WARNING):
        sa = _args(speculative_algorithm="NGRAM", page_size=16, speculative_ngram_max_bfs_breadth=1)
    assert sa.speculative_eagle_topk == 1 and sa.page_size == 16
    assert "have no effect" in caplog.text


def test_hybrid_sliding_window_pool_is_refused_at_scheduler_start(tmp_path):
    from sglang.test.scheduler_utils import make_scheduler
    from sglang.test.tiny_models import make_tiny_model

    model = make_tiny_model(str(tmp_path / "swa"), "qwen3_swa")
    with pytest.raises(ValueError, match="not supported with the hybrid sliding-window KV pool"):
        make_scheduler(model, speculative_algorithm="NGRAM")
