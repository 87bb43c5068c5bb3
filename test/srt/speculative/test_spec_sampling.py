"""Sampled speculative decoding keeps the target's distribution exactly.

1. `verify_chains` alone, 40000 copies of one request with a two-token draft over fixed logits
   (temperature, top-p and top-k filtering on): the first emitted token follows the first row's
   filtered distribution, the second (given the first draft was emitted) the second row's, the
   third the last row's. Pearson's chi-square against the exact distributions stays under the
   p = 1e-5 critical value of its degrees of freedom (the torch RNG is seeded, so the test is
   deterministic; a verifier that resamples from the full distribution after a rejection
   instead of the residual fails it by a wide margin).
2. End to end, a scheduler with NGRAM on a 16-token random Llama: 1500 samples of 3 tokens at
   temperature 1; the second and third tokens' empirical distribution against the exact
   marginals computed from HF transformers' probabilities (total variation under 0.06, where
   sampling noise alone gives ~0.03).
"""

import math

import pytest
import torch

from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.speculative.verify import verify_chains

# chi-square critical values at p = 1e-5 by degrees of freedom (upper tail)
_CHI2_1E5 = {1: 19.51, 2: 23.03, 3: 25.90, 4: 28.47, 5: 30.86, 6: 33.11, 7: 35.26}


class _Row:
    def __init__(self, params, output_ids):
        self.sampling_params = params
        self.origin_input_ids = [1, 2, 3]
        self.output_ids = output_ids
        self.eos_token_ids = set()


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple:
    n = counts.sum().item()
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token the target never samples was emitted"
    expected = probs[keep] * n
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


def _exact(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    p = torch.softmax(logits / temperature, dim=-1)
    order = torch.argsort(p, descending=True, stable=True)
    sp = p[order]
    drop = (torch.cumsum(sp, 0) - sp) > top_p
    drop |= torch.arange(len(sp)) >= top_k
    sp[drop] = 0
    out = torch.zeros_like(p)
    out[order] = sp
    return out / out.sum()


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 8), (0.7, 0.9, 5)])
def test_verify_chains_keeps_the_target_distribution(temperature, top_p, top_k):
    torch.manual_seed(0)
    vocab, n = 8, 40000
    rows = torch.randn(3, vocab) * 1.5
    draft = [int(torch.argsort(rows[0])[-2]), int(torch.argsort(rows[1])[-1])]  # likely, not sure
    params = SamplingParams(max_new_tokens=8, temperature=temperature, top_p=top_p, top_k=top_k)
    params.normalize(None)
    views = [_Row(params, draft[:j]) for _ in range(n) for j in range(3)]
    info = SamplingBatchInfo.from_reqs(views, vocab, "cpu")
    verdict = verify_chains(rows.repeat(n, 1), info, [draft] * n)

    exact = [_exact(rows[j], temperature, top_p, top_k) for j in range(3)]
    firsts = torch.tensor([t[0] for t in verdict.tokens])
    stat, df = _chi2(torch.bincount(firsts, minlength=vocab).float(), exact[0])
    assert stat < _CHI2_1E5[df], (stat, df)
    seconds = torch.tensor([t[1] for t in verdict.tokens if len(t) > 1])
    assert len(seconds) == int((firsts == draft[0]).sum())  # a second token only after an accepted draft
    stat, df = _chi2(torch.bincount(seconds, minlength=vocab).float(), exact[1])
    assert stat < _CHI2_1E5[df], (stat, df)
    thirds = torch.tensor([t[2] for t in verdict.tokens if len(t) > 2])
    assert len(thirds) > 1000
    stat, df = _chi2(torch.bincount(thirds, minlength=vocab).float(), exact[2])
    assert stat < _CHI2_1E5[df], (stat, df)
    # accepted counts agree with the tokens: accepted drafts come first, then one more token
    for toks, a in zip(verdict.tokens[:200], verdict.accepted[:200]):
        assert len(toks) == a + 1 and toks[:a] == draft[:a]


def test_greedy_rows_take_the_argmax_chain():
    rows = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    params.normalize(None)
    for draft, expected in (([1, 0], [1, 0, 2]), ([1, 2], [1, 0]), ([2, 0], [1])):
        info = SamplingBatchInfo.from_reqs([_Row(params, draft[:j]) for j in range(3)], 3, "cpu")
        verdict = verify_chains(rows, info, [draft])
        assert verdict.tokens == [expected]
        assert verdict.accepted == [len(expected) - 1]


# --- end to end ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from sglang.test.tiny_models import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("spec_sampling_v16")), "llama", seed=3, vocab_size=16,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0)


def test_scheduler_samples_keep_the_target_marginals(model_dir):
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.test.hf_reference import load_hf_model
    from sglang.test.scheduler_utils import assert_no_leak, make_scheduler, run_to_completion

    # "9 a" for every token a, ending on 9: whatever the first sampled token t, the suffix (9, t)
    # occurs in the prompt, so every request drafts from its second token on
    prompt = [x for a in range(16) for x in (9, a)] + [9]
    n, vocab = 1500, 16
    sched = make_scheduler(model_dir, speculative_algorithm="NGRAM", speculative_num_draft_tokens=4,
                           random_seed=1)
    reqs = []
    for i in range(n):
        params = SamplingParams(max_new_tokens=3, temperature=1.0, ignore_eos=True)
        params.normalize(None)
        reqs.append(sched.add_request(TokenizedGenerateReqInput(rid=f"s{i}", input_text=None, input_ids=prompt,
                                                                sampling_params=params)))
    run_to_completion(sched)
    assert_no_leak(sched)
    assert all(len(r.output_ids) == 3 for r in reqs)
    assert sum(r.spec.num_proposed_drafts for r in reqs) == n  # every request drafted its second token
    assert sum(r.spec.num_correct_drafts for r in reqs) > 0

    hf = load_hf_model(model_dir)
    with torch.no_grad():
        p1 = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1].double(), -1)  # [V]
        ctx2 = torch.tensor([prompt + [a] for a in range(vocab)])
        p2 = torch.softmax(hf(ctx2).logits[:, -1].double(), -1)  # [V(a), V(b)]
        ctx3 = torch.tensor([prompt + [a, b] for a in range(vocab) for b in range(vocab)])
        p3 = torch.softmax(hf(ctx3).logits[:, -1].double(), -1).view(vocab, vocab, vocab)
    marg2 = p1 @ p2
    marg3 = torch.einsum("a,ab,abc->c", p1, p2, p3)
    for pos, exact in ((1, marg2), (2, marg3)):
        counts = torch.bincount(torch.tensor([r.output_ids[pos] for r in reqs]), minlength=vocab).double()
        tv = 0.5 * (counts / n - exact).abs().sum().item()
        assert tv < 0.06, (pos, tv)
    # the bound is not vacuous: the marginal differs from the first token's by much more
    assert 0.5 * (marg2 - p1).abs().sum().item() > 0.1 or 0.5 * (marg3 - p1).abs().sum().item() > 0.1
    assert math.isfinite(tv)
