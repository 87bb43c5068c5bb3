"""Vectorized penalty builders vs straightforward per-token references (and HF's processor)."""

import random

import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from sglang.srt.sampling import penalties

V = 37


def _random_lists(rng, n_rows, max_len, vocab=V):
    return [[rng.randrange(vocab) for _ in range(rng.randrange(max_len + 1))] for _ in range(n_rows)]


def test_token_counts_match_python_counting():
    rng = random.Random(0)
    lists = _random_lists(rng, 6, 40) + [[]]
    counts = penalties.token_counts(lists, V, "cpu")
    ref = torch.zeros(len(lists), V)
    for i, lst in enumerate(lists):
        for t in lst:
            ref[i, t] += 1
    assert torch.equal(counts, ref)


def test_out_of_vocab_ids_are_ignored():
    counts = penalties.token_counts([[1, V, V + 5, -1, 1]], V, "cpu")
    assert counts[0, 1] == 2 and counts.sum() == 2


def test_linear_penalties_match_reference():
    rng = random.Random(1)
    lists = _random_lists(rng, 5, 30)
    freq = torch.tensor([0.0, 0.5, -1.0, 2.0, 0.3])
    pres = torch.tensor([1.0, 0.0, 0.7, -2.0, 0.3])
    got = penalties.linear_penalties(penalties.token_counts(lists, V, "cpu"), freq, pres)
    ref = torch.zeros(len(lists), V)
    for i, lst in enumerate(lists):
        for t in set(lst):
            ref[i, t] = -(freq[i] * lst.count(t) + pres[i])
    torch.testing.assert_close(got, ref)


def test_repetition_scaling_matches_hf_processor():
    rng = random.Random(2)
    torch.manual_seed(0)
    penalties_list = [1.3, 0.7, 1.0, 2.0]
    # HF needs equal-length rows: use one length, with repeats inside rows.
    seqs = [[rng.randrange(V) for _ in range(12)] for _ in penalties_list]
    logits = torch.randn(len(seqs), V) * 3
    got = logits.clone()
    scaling = penalties.repetition_scaling(seqs, torch.tensor(penalties_list), V, "cpu")
    penalties.apply_scaling_penalties(got, scaling)
    for i, p in enumerate(penalties_list):
        hf = RepetitionPenaltyLogitsProcessor(penalty=p)
        ref = hf(torch.tensor([seqs[i]]), logits[i : i + 1].clone())
        torch.testing.assert_close(got[i : i + 1], ref)


def test_min_new_tokens_mask_only_where_still_banned():
    mask = penalties.min_new_tokens_mask([[0, 5], [0], [3, 4]], [True, False, True], V, "cpu")
    want = torch.zeros(3, V, dtype=torch.bool)
    want[0, [0, 5]] = True
    want[2, [3, 4]] = True
    assert torch.equal(mask, want)
    assert penalties.min_new_tokens_mask([[0], [1]], [False, False], V, "cpu") is None
