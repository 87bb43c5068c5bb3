"""SamplingBatchInfo.from_reqs: tensors built from requests, and logits processing vs a reference."""

import random
from dataclasses import dataclass, field

import torch

from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

V = 50
EOS = 2


@dataclass
class Req:
    """The few request fields SamplingBatchInfo reads (a real Req exposes the same names)."""

    sampling_params: SamplingParams
    origin_input_ids: list
    output_ids: list = field(default_factory=list)
    eos_token_ids: set = field(default_factory=lambda: {EOS})


def _reference_logits(logits, reqs, include_prompt=True):
    """Per-request, per-token reference of upstream's penalty semantics."""
    out = logits.clone()
    for i, r in enumerate(reqs):
        sp = r.sampling_params
        row = out[i]
        seen = set(r.output_ids) | (set(r.origin_input_ids) if include_prompt else set())
        for t in seen:
            p = sp.repetition_penalty
            row[t] = row[t] / p if row[t] > 0 else row[t] * p
        for t in set(r.output_ids):
            row[t] -= sp.frequency_penalty * r.output_ids.count(t) + sp.presence_penalty
        if len(r.output_ids) < sp.min_new_tokens:
            for t in r.eos_token_ids | (sp.stop_token_ids or set()):
                row[t] = float("-inf")
        for k, v in (sp.logit_bias or {}).items():
            row[int(k)] += v
    return out


def _random_reqs(seed):
    rng = random.Random(seed)
    reqs = []
    for i in range(6):
        sp = SamplingParams(
            temperature=rng.choice([0.0, 0.5, 1.3]),
            frequency_penalty=rng.choice([0.0, 0.4, -1.0]),
            presence_penalty=rng.choice([0.0, 0.6, 1.5]),
            repetition_penalty=rng.choice([1.0, 1.2, 0.8]),
            min_new_tokens=rng.choice([0, 3, 10]),
            stop_token_ids=rng.choice([None, [7, 9]]),
            logit_bias=rng.choice([None, {"4": 3.0, "11": -2.5}]),
        )
        sp.verify(V)
        prompt = [rng.randrange(V) for _ in range(rng.randrange(1, 20))]
        out = [rng.randrange(V) for _ in range(rng.randrange(0, 15))]
        reqs.append(Req(sp, prompt, out))
    return reqs


def test_apply_logits_bias_matches_reference():
    torch.manual_seed(0)
    for seed in range(5):
        reqs = _random_reqs(seed)
        logits = torch.randn(len(reqs), V) * 4
        info = SamplingBatchInfo.from_reqs(reqs, V)
        got = logits.clone()
        info.apply_logits_bias(got)
        torch.testing.assert_close(got, _reference_logits(logits, reqs))


def test_repetition_penalty_can_exclude_prompt():
    reqs = [Req(SamplingParams(repetition_penalty=1.5), [1, 2, 3], [3, 4])]
    logits = torch.randn(1, V)
    info = SamplingBatchInfo.from_reqs(reqs, V, repetition_penalty_include_prompt=False)
    got = logits.clone()
    info.apply_logits_bias(got)
    torch.testing.assert_close(got, _reference_logits(logits, reqs, include_prompt=False))
    assert got[0, 1] == logits[0, 1]


def test_scalar_fields_and_flags():
    reqs = [
        Req(SamplingParams(temperature=0.0), [1, 2]),
        Req(SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, sampling_seed=(3 << 32) | 9),
            [1], [4, 5, 6]),
    ]
    info = SamplingBatchInfo.from_reqs(reqs, V)
    assert info.temperatures.shape == (2, 1)
    torch.testing.assert_close(info.temperatures.view(-1), torch.tensor([1.0, 0.7]))
    assert info.top_ks.tolist() == [1, 5] and info.greedy_mask.tolist() == [True, False]
    assert not info.is_all_greedy
    assert info.need_top_p_sampling and info.need_top_k_sampling and info.need_min_p_sampling
    assert info.has_seed.tolist() == [False, True]
    assert info.seed_lo.tolist() == [0, 9] and info.seed_hi.tolist() == [0, 3]
    assert info.positions.tolist() == [2, 4]
    assert not info.has_penalties

    plain = SamplingBatchInfo.from_reqs([Req(SamplingParams(), [1])], V)
    assert plain.top_ks.tolist() == [V]  # TOP_K_ALL clamped to the vocabulary
    assert not (plain.need_top_k_sampling or plain.need_top_p_sampling or plain.need_min_p_sampling)
    assert SamplingBatchInfo.from_reqs([reqs[0], reqs[0]], V).is_all_greedy


def test_min_new_tokens_bans_eos_and_stop_ids_until_reached():
    sp = SamplingParams(min_new_tokens=3, stop_token_ids=[7])
    logits = torch.zeros(1, V)
    for n_out, banned in [(0, True), (2, True), (3, False), (5, False)]:
        req = Req(sp, [1, 2], list(range(10, 10 + n_out)))
        info = SamplingBatchInfo.from_reqs([req], V, eos_token_ids=[0])
        got = logits.clone()
        info.apply_logits_bias(got)
        for t in (EOS, 7, 0):  # req EOS, stop_token_ids, batch-wide EOS
            assert (got[0, t] == float("-inf")) == banned
        assert torch.isfinite(got[0, 3:7]).all()


def test_padded_logits_width():
    reqs = [Req(SamplingParams(presence_penalty=1.0, logit_bias={"1": 2.0}), [0], [1, 1])]
    info = SamplingBatchInfo.from_reqs(reqs, V)
    logits = torch.zeros(1, V + 14)
    info.apply_logits_bias(logits)
    assert logits[0, 1] == 1.0 and logits[0, V:].eq(0).all()


def test_vocab_mask_blocks_tokens_after_penalties_before_logit_bias():
    """The grammar mask goes through the backend's apply function, between penalties and logit_bias."""
    info = SamplingBatchInfo.from_reqs([Req(SamplingParams(presence_penalty=1.0, logit_bias={"7": 3.0}), [0], [2])], V)
    seen = []

    def apply(logits, mask):
        seen.append(float(logits[0, 2]))  # the presence penalty is already applied
        logits.masked_fill_(mask, float("-inf"))

    info.vocab_mask = torch.zeros(1, V, dtype=torch.bool)
    info.vocab_mask[0, 5:] = True
    info.apply_mask_func = apply
    logits = torch.zeros(1, V)
    info.apply_logits_bias(logits)
    assert seen == [-1.0]
    assert torch.isinf(logits[0, 5:]).all() and torch.isfinite(logits[0, :5]).all()


def test_rebuild_is_cheap_for_a_big_batch():
    import time

    rng = random.Random(3)
    vocab = 50_000
    reqs = [
        Req(SamplingParams(frequency_penalty=0.5, repetition_penalty=1.1, min_new_tokens=1),
            [rng.randrange(vocab) for _ in range(500)], [rng.randrange(vocab) for _ in range(200)])
        for _ in range(32)
    ]
    SamplingBatchInfo.from_reqs(reqs, vocab)
    t0 = time.perf_counter()
    SamplingBatchInfo.from_reqs(reqs, vocab)
    assert time.perf_counter() - t0 < 1.0
