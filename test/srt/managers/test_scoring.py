"""The scoring API's request building and score arithmetic (`managers/scoring.py`), against
upstream's rules: text joins as text, ids as ids, `item_first` swaps, label ids are checked,
and scores are probabilities (or a softmax over the labels)."""

import math

import pytest

from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
from sglang.srt.managers.scoring import build_score_request, scores_from_outputs


def test_text_items_join_as_text_and_item_first_swaps():
    obj = build_score_request("Q:", [" a", " b"], [5, 6], False, 100)
    assert type(obj) is GenerateReqInput and obj.text == ["Q: a", "Q: b"]
    assert obj.sampling_params == {"max_new_tokens": 0} and obj.token_ids_logprob == [5, 6]
    assert obj.return_logprob is True and obj.logprob_start_len == -1 and obj.stream is False
    assert build_score_request("Q", "x", [1], True, 100).text == ["xQ"]


def test_token_items_join_as_ids():
    obj = build_score_request([1, 2], [[3], [4, 5]], [7], False, 100)
    assert obj.input_ids == [[1, 2, 3], [1, 2, 4, 5]]
    assert build_score_request([1, 2], [[3]], [7], True, 100).input_ids == [[3, 1, 2]]


@pytest.mark.parametrize("args, message", [
    (("q", ["a"], None), "label_token_ids is required for generation (CausalLM) models."),
    (("q", ["a"], [100]), "Token ID 100 is out of vocabulary (vocab size: 100)"),
    (("q", None, [1]), "items must be provided"),
    (("q", [[1]], [1]), "Invalid combination of query/items types for score_request."),
    (([1], ["a"], [1]), "Invalid combination of query/items types for score_request."),
    ((None, ["a"], [1]), "Invalid combination of query/items types for score_request."),
])
def test_unscorable_requests_say_why(args, message):
    with pytest.raises(ValueError) as e:
        build_score_request(*args, item_first=False, vocab_size=100)
    assert str(e.value) == message


def test_no_items_means_nothing_to_run_and_embedding_servers_need_no_labels():
    assert build_score_request("q", [], [1], False, 100) is None
    obj = build_score_request("q", ["a"], None, False, 100, is_generation=False)
    assert type(obj) is EmbeddingReqInput and obj.text == ["qa"]


def _out(pairs, prompt_tokens=3):
    return {"meta_info": {"id": "r", "prompt_tokens": prompt_tokens,
                          "output_token_ids_logprobs": [[[lp, tid, None] for lp, tid in pairs]]}}


def test_scores_are_probabilities_or_a_label_softmax():
    outs = [_out([(math.log(0.2), 5), (math.log(0.05), 6)]), _out([(math.log(0.5), 6), (math.log(0.1), 5)], 4)]
    plain = scores_from_outputs(outs, [5, 6], apply_softmax=False)
    assert plain.prompt_tokens == 7
    assert [[round(x, 6) for x in s] for s in plain.scores] == [[0.2, 0.05], [0.1, 0.5]]
    soft = scores_from_outputs(outs, [5, 6], apply_softmax=True)
    assert [[round(x, 6) for x in s] for s in soft.scores] == [[0.8, 0.2], [round(1 / 6, 6), round(5 / 6, 6)]]


def test_a_missing_distribution_is_an_error():
    with pytest.raises(RuntimeError, match="output_logprobs is empty"):
        scores_from_outputs([{"meta_info": {"id": "r", "output_token_ids_logprobs": []}}], [1], False)
