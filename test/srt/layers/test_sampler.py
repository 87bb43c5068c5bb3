"""Sampler: greedy exactness (incl. vs HF generate), filters, seeds, distributions, logprobs."""

from dataclasses import dataclass, field

import pytest
import torch

from sglang.srt.layers.sampler import (
    Sampler,
    compute_prompt_logprobs,
    inverse_cdf_sample,
    sample_from_logprobs,
    seeded_uniforms,
    top_k_top_p_min_p_filter,
)
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

V = 64


@dataclass
class Req:
    sampling_params: SamplingParams
    origin_input_ids: list = field(default_factory=lambda: [1, 2, 3])
    output_ids: list = field(default_factory=list)
    eos_token_ids: set = field(default_factory=lambda: {0})


def _reqs(n, **kw):
    return [Req(SamplingParams(**kw)) for _ in range(n)]


def _sample(logits, reqs, **kw):
    info = SamplingBatchInfo.from_reqs(reqs, logits.shape[-1])
    return Sampler()(logits, info, **kw), info


def _penalized(logits, info):
    out = logits.clone()
    info.apply_logits_bias(out)
    return out


def test_all_greedy_is_exact_argmax_of_penalized_logits():
    torch.manual_seed(0)
    logits = torch.randn(8, V)
    reqs = [Req(SamplingParams(temperature=0.0, frequency_penalty=1.5, repetition_penalty=1.3),
                origin_input_ids=[i, i + 1], output_ids=[i, i, 2 * i]) for i in range(8)]
    out, info = _sample(logits, reqs)
    assert info.is_all_greedy and info.linear_penalties is not None
    assert out.next_token_ids.dtype == torch.int64 and out.next_token_ids.shape == (8,)
    assert torch.equal(out.next_token_ids, torch.argmax(_penalized(logits, info), dim=-1))
    assert out.next_token_logprobs is None and out.top_logprobs is None
    # The caller's logits are not modified.
    torch.manual_seed(0)
    assert torch.equal(logits, torch.randn(8, V))


@pytest.mark.parametrize("vocab", [V, 49152])
def test_greedy_without_penalties_is_torch_argmax_and_leaves_logits(vocab):
    """The plain greedy path: no copy of the logits (nothing is written to them) and, on CPU,
    sgl_kernel's argmax, which must pick torch.argmax's index (ties: the first)."""
    torch.manual_seed(1)
    logits = torch.randn(16, vocab)
    logits[3, 5] = logits[3, 9] = logits[3].max() + 1  # a tie
    logits[4, :] = float("-inf")
    before = logits.clone()
    out, info = _sample(logits, _reqs(16, temperature=0.0))
    assert info.is_all_greedy and not info.modifies_logits
    assert torch.equal(out.next_token_ids, torch.argmax(before, dim=-1))
    assert int(out.next_token_ids[3]) == 5 and int(out.next_token_ids[4]) == 0
    assert torch.equal(logits, before)


def test_top_k_1_and_tiny_top_p_equal_greedy_in_a_sampling_batch():
    torch.manual_seed(1)
    logits = torch.randn(12, V) * 2
    reqs = (_reqs(4, temperature=0.9, top_k=1) + _reqs(4, temperature=1.3, top_p=1e-6)
            + _reqs(2, temperature=0.8, top_p=1e-6, sampling_seed=3) + _reqs(2, temperature=1.0))
    for _ in range(5):
        out, info = _sample(logits, reqs)
        assert not info.is_all_greedy
        assert torch.equal(out.next_token_ids[:10], torch.argmax(logits[:10], dim=-1))


def test_filter_top_k_1_and_tiny_top_p_keep_only_the_argmax():
    torch.manual_seed(2)
    probs = torch.softmax(torch.randn(6, V), dim=-1)
    for ks, ps in [([1] * 6, [1.0] * 6), ([V] * 6, [1e-7] * 6)]:
        sorted_p, ids = top_k_top_p_min_p_filter(
            probs, torch.tensor(ks), torch.tensor(ps), torch.zeros(6), False)
        assert (sorted_p[:, 1:] == 0).all() and (sorted_p[:, 0] > 0).all()
        assert torch.equal(ids[:, 0], torch.argmax(probs, dim=-1))


def _reference_keep(probs_row, k, p, min_p):
    """Set of kept token ids by direct definition (upstream semantics)."""
    order = sorted(range(len(probs_row)), key=lambda t: (-probs_row[t], t))
    keep, mass_before = [], 0.0
    for rank, t in enumerate(order):
        if rank < k and mass_before <= p:
            keep.append(t)
        mass_before += probs_row[t]
    pmax = probs_row[order[0]]
    return {t for t in keep if probs_row[t] >= min_p * pmax}


def test_filter_matches_reference_sets():
    torch.manual_seed(3)
    probs = torch.softmax(torch.randn(8, V, dtype=torch.float64) * 2, dim=-1)
    ks = [3, V, 10, 1, V, 5, V, 20]
    ps = [1.0, 0.5, 0.8, 1.0, 0.95, 0.3, 1.0, 0.9]
    mps = [0.0, 0.0, 0.05, 0.0, 0.1, 0.0, 0.3, 0.02]
    sorted_p, ids = top_k_top_p_min_p_filter(
        probs, torch.tensor(ks), torch.tensor(ps, dtype=torch.float64),
        torch.tensor(mps, dtype=torch.float64), True)
    for i in range(8):
        kept = set(ids[i][sorted_p[i] > 0].tolist())
        assert kept == _reference_keep(probs[i].tolist(), ks[i], ps[i], mps[i])


@pytest.mark.parametrize("kw", [dict(top_k=4), dict(top_p=0.6), dict(min_p=0.2),
                                dict(top_k=6, min_p=0.1, sampling_seed=11)])
def test_samples_stay_inside_the_filtered_set(kw):
    torch.manual_seed(4)
    logits = torch.randn(1, V).repeat(400, 1) * 2
    reqs = _reqs(400, temperature=1.0, **kw)
    for i, r in enumerate(reqs):
        r.output_ids = [0] * i  # distinct positions so seeded rows draw fresh noise
    out, _ = _sample(logits, reqs)
    probs = torch.softmax(logits[0].double(), -1).tolist()
    allowed = _reference_keep(probs, kw.get("top_k", V), kw.get("top_p", 1.0), kw.get("min_p", 0.0))
    drawn = set(out.next_token_ids.tolist())
    assert drawn <= allowed and len(drawn) > 1


def _frequencies(ids, n):
    return torch.bincount(ids, minlength=n).double() / ids.numel()


@pytest.mark.parametrize("seeded", [False, True])
def test_temperature_sampling_distribution(seeded):
    torch.manual_seed(5)
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    n = 6000
    temperature = 0.7
    reqs = _reqs(n, temperature=temperature)
    if seeded:
        for i, r in enumerate(reqs):
            r.sampling_params.sampling_seed = 1000 + i
    out, _ = _sample(base.repeat(n, 1), reqs)
    freq = _frequencies(out.next_token_ids, 6)
    want = torch.softmax(base.double() / temperature, -1)
    # Std of each frequency <= 0.0065 here; 0.03 is > 4.5 sigma.
    assert (freq - want).abs().max() < 0.03, (freq, want)


def test_top_k_renormalizes_distribution():
    torch.manual_seed(6)
    base = torch.tensor([1.0, 0.8, 0.2, 0.1, -0.5])
    n = 6000
    out, _ = _sample(base.repeat(n, 1), _reqs(n, temperature=1.0, top_k=2))
    freq = _frequencies(out.next_token_ids, 5)
    want = torch.zeros(5, dtype=torch.float64)
    want[:2] = torch.softmax(base[:2].double(), -1)
    assert (freq - want).abs().max() < 0.03


def test_seed_is_reproducible_and_independent_of_batch():
    torch.manual_seed(7)
    logits = torch.randn(5, V)

    def req(seed, pos_out):
        return Req(SamplingParams(temperature=1.2, top_p=0.95, sampling_seed=seed),
                   output_ids=[5] * pos_out)

    alone = [_sample(logits[2:3], [req(42, k)])[0].next_token_ids.item() for k in range(20)]
    for k in range(20):
        torch.manual_seed(100 + k)  # the global RNG must not matter for seeded rows
        batch = [Req(SamplingParams(temperature=0.5)), req(7, k), req(42, k),
                 Req(SamplingParams(temperature=0.0)), req(42, k + 1)]
        out, _ = _sample(logits, batch)
        assert out.next_token_ids[2].item() == alone[k]
        if k < 19:
            assert out.next_token_ids[4].item() == _sample(logits[4:5], [req(42, k + 1)])[0].next_token_ids.item()
    # Different positions draw fresh noise, and another seed gives another sequence.
    assert len(set(alone)) > 3
    other = [_sample(logits[2:3], [req(43, k)])[0].next_token_ids.item() for k in range(20)]
    assert other != alone


def test_seeded_uniforms_look_uniform_and_distinct():
    n = 20000
    pos = torch.arange(n)
    for lo, hi in [(1, 0), (2, 0), (1, 1)]:
        u = seeded_uniforms(torch.full((n,), lo), torch.full((n,), hi), pos)
        assert ((u > 0) & (u < 1)).all() and u.dtype == torch.float64
        assert abs(u.mean().item() - 0.5) < 0.01
        hist = torch.histc(u.float(), bins=10, min=0, max=1) / n
        assert (hist - 0.1).abs().max() < 0.01
        assert u.unique().numel() == n
    a = seeded_uniforms(torch.tensor([1]), torch.tensor([0]), torch.tensor([5]))
    b = seeded_uniforms(torch.tensor([1]), torch.tensor([1]), torch.tensor([5]))
    assert a.item() != b.item()
    # Big and negative seeds are accepted (split into 32-bit halves by from_reqs).
    info = SamplingBatchInfo.from_reqs(_reqs(1, sampling_seed=-(1 << 40) - 5, temperature=1.0), V)
    Sampler()(torch.randn(1, V), info)


def test_inverse_cdf_sample_skips_zero_mass():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).repeat(4, 1)
    u = torch.tensor([1e-12, 0.49, 0.51, 1 - 1e-12], dtype=torch.float64)
    assert inverse_cdf_sample(probs, u).tolist() == [1, 1, 3, 3]


@pytest.mark.parametrize("seeded", [False, True])
def test_candidate_shortcut_agrees_with_full_sort(seeded):
    """Rows filtered among the top `max_candidates` and rows needing a full sort both obey the
    reference kept sets; seeded rows draw the same token through either path."""
    torch.manual_seed(11)
    base = torch.randn(V) * 2
    kws = [dict(top_k=3), dict(top_k=20), dict(top_p=0.3), dict(top_p=0.99), dict(min_p=0.5),
           dict(min_p=0.01), dict(top_k=30, top_p=0.9, min_p=0.05)]
    probs = torch.softmax(base.double(), -1).tolist()
    for kw in kws:
        reqs = _reqs(300, temperature=1.0, **kw)
        for i, r in enumerate(reqs):
            r.output_ids = [0] * i
            if seeded:
                r.sampling_params.sampling_seed = 5
        info = SamplingBatchInfo.from_reqs(reqs, V)
        logprobs = torch.log_softmax(base.repeat(300, 1), -1)
        short = sample_from_logprobs(logprobs, info, max_candidates=8)
        full = sample_from_logprobs(logprobs, info, max_candidates=V)
        allowed = _reference_keep(probs, kw.get("top_k", V), kw.get("top_p", 1.0), kw.get("min_p", 0.0))
        assert set(short.tolist()) <= allowed and set(full.tolist()) <= allowed, kw
        if seeded:
            assert torch.equal(short, full), kw


def test_logprobs_greedy_match_log_softmax():
    torch.manual_seed(8)
    logits = torch.randn(4, V) * 3
    reqs = [Req(SamplingParams(temperature=0.0, presence_penalty=1.0), output_ids=[i, 9]) for i in range(4)]
    out, info = _sample(logits, reqs, return_logprob=True, top_logprobs_nums=[0, 1, 5, 3],
                        token_ids_logprobs=[None, [3, 4], None, [0]])
    ref = torch.log_softmax(_penalized(logits, info), -1)
    ids = out.next_token_ids
    torch.testing.assert_close(out.next_token_logprobs, ref[torch.arange(4), ids])
    for i, k in enumerate([0, 1, 5, 3]):
        vals, tids = out.top_logprobs[i]
        rv, ri = ref[i].topk(k) if k else (torch.tensor([]), torch.tensor([], dtype=torch.long))
        assert tids == ri.tolist()
        torch.testing.assert_close(torch.tensor(vals), rv)
    assert out.token_ids_logprobs[0] is None and out.token_ids_logprobs[1][1] == [3, 4]
    torch.testing.assert_close(torch.tensor(out.token_ids_logprobs[1][0]), ref[1, [3, 4]])


def test_logprobs_sampling_are_temperature_scaled_before_filtering():
    torch.manual_seed(9)
    logits = torch.randn(3, V) * 2
    reqs = [Req(SamplingParams(temperature=0.5, top_k=3)), Req(SamplingParams(temperature=1.7)),
            Req(SamplingParams(temperature=0.0))]
    out, info = _sample(logits, reqs, return_logprob=True, top_logprobs_nums=[2, 2, 2])
    ref = torch.log_softmax(logits / torch.tensor([[0.5], [1.7], [1.0]]), -1)
    torch.testing.assert_close(out.next_token_logprobs, ref[torch.arange(3), out.next_token_ids])
    torch.testing.assert_close(torch.tensor([v for v, _ in out.top_logprobs]), ref.topk(2).values)


def test_banned_tokens_logprobs_are_finite():
    logits = torch.zeros(1, V)
    req = Req(SamplingParams(temperature=0.0, min_new_tokens=2))
    out, _ = _sample(logits, [req], return_logprob=True, top_logprobs_nums=[V])
    assert out.next_token_ids.item() != 0
    vals, ids = out.top_logprobs[0]
    assert all(v > float("-inf") for v in vals) and ids[-1] == 0


def test_compute_prompt_logprobs():
    torch.manual_seed(10)
    full = torch.randn(7, V)
    nxt = torch.randint(0, V, (7,))
    res = compute_prompt_logprobs(full, nxt, top_k=4, token_ids=[1, 2])
    ref = torch.log_softmax(full, -1)
    torch.testing.assert_close(res.token_logprobs, ref[torch.arange(7), nxt])
    assert [t for _, t in res.top_logprobs] == ref.topk(4).indices.tolist()
    torch.testing.assert_close(torch.tensor([v for v, _ in res.token_ids_logprobs]), ref[:, [1, 2]])
    assert compute_prompt_logprobs(full, nxt).top_logprobs is None


def _tiny_hf_model():
    from transformers import AutoConfig, AutoModelForCausalLM

    from sglang.test.tiny_models import tiny_config_dict

    cfg = tiny_config_dict("llama", vocab_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model_type = cfg.pop("model_type")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg),
                                             dtype=torch.float32)
    return model.eval()


def _hf_greedy(model, prompt, eos, **kw):
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12,
                         eos_token_id=eos, pad_token_id=0, **kw)
    return out[0, len(prompt):].tolist()


def _our_greedy(model, prompt, eos, **kw):
    req = Req(SamplingParams(temperature=0.0, max_new_tokens=12, **kw), origin_input_ids=prompt,
              eos_token_ids={eos})
    sampler = Sampler()
    while len(req.output_ids) < 12:
        logits = model(torch.tensor([prompt + req.output_ids])).logits[:, -1]
        info = SamplingBatchInfo.from_reqs([req], logits.shape[-1])
        tok = sampler(logits, info).next_token_ids.item()
        req.output_ids.append(tok)
        if tok == eos:
            break
    return req.output_ids


@pytest.mark.parametrize("repetition_penalty", [1.0, 1.5, 0.7])
def test_greedy_decoding_matches_hf_generate(repetition_penalty):
    model = _tiny_hf_model()
    with torch.no_grad():
        # A prompt ending in the model's own greedy continuation, so that penalizing prompt
        # tokens (HF semantics) visibly changes what comes next.
        prompt = [1, 17, 33] + _hf_greedy(model, [1, 17, 33], 2)[:8]
        hf = _hf_greedy(model, prompt, 2, repetition_penalty=repetition_penalty)
        ours = _our_greedy(model, prompt, 2, repetition_penalty=repetition_penalty)
        assert ours == hf and len(hf) == 12
        if repetition_penalty != 1.0:  # the penalty really changed the decoding
            assert hf != _hf_greedy(model, prompt, 2)


@pytest.mark.parametrize("repetition_penalty,min_new_tokens", [(1.0, 6), (1.3, 4)])
def test_min_new_tokens_matches_hf_generate(repetition_penalty, min_new_tokens):
    model = _tiny_hf_model()
    prompt = [1, 17, 33, 5, 17, 60, 8]
    with torch.no_grad():
        # Make EOS the model's favourite first token so min_new_tokens has something to ban.
        eos = int(model(torch.tensor([prompt])).logits[0, -1].argmax())
        kw = dict(min_new_tokens=min_new_tokens, repetition_penalty=repetition_penalty)
        hf = _hf_greedy(model, prompt, eos, **kw)
        assert _our_greedy(model, prompt, eos, **kw) == hf
        assert eos not in hf[:min_new_tokens]
        assert _hf_greedy(model, prompt, eos) == [eos]  # without the ban it stops at once


def test_empty_batch():
    info = SamplingBatchInfo.from_reqs([], V)
    out = Sampler()(torch.zeros(0, V), info, return_logprob=True, top_logprobs_nums=[])
    assert out.next_token_ids.shape == (0,) and out.top_logprobs == []
