"""Compare our ModelRunner's logits with HF transformers on the same folder (fp32, CPU).

`hf_reference(model_dir, prompt, n_decode)` runs HF once: prefill logits of every prompt token,
then `n_decode` greedy steps with HF's KV cache, recording each step's logits and token.
`our_logits(runner, prompt, hf_tokens, chunk_size)` replays the same tokens through our runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from sglang.test.runner_utils import ManualDriver


@dataclass
class LogitsTrace:
    prefill: torch.Tensor  # [prompt_len, V]
    decode: List[torch.Tensor]  # n_decode x [V]
    tokens: List[int]  # greedy tokens; tokens[i] is fed at decode step i


def load_hf_model(model_dir: str, attn_implementation: str = "eager"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                attn_implementation=attn_implementation).eval()


def _cache_kwarg() -> str:
    """transformers >= 5.2x renamed `past_key_values` to `cache`; support both."""
    import inspect

    from transformers import LlamaForCausalLM

    return "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


_CACHE_KWARG = _cache_kwarg()


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@torch.no_grad()
def hf_reference(model_dir_or_model, prompt: Sequence[int], n_decode: int) -> LogitsTrace:
    model = load_hf_model(model_dir_or_model) if isinstance(model_dir_or_model, str) else model_dir_or_model
    out = model(torch.tensor([list(prompt)]), use_cache=True)
    prefill = out.logits[0].float()
    past = _cache_of(out)
    tokens, decode = [int(prefill[-1].argmax())], []
    for _ in range(n_decode):
        out = model(torch.tensor([[tokens[-1]]]), use_cache=True, **{_CACHE_KWARG: past})
        past = _cache_of(out)
        logits = out.logits[0, -1].float()
        decode.append(logits)
        tokens.append(int(logits.argmax()))
    return LogitsTrace(prefill, decode, tokens[:n_decode])


def our_logits(runner, prompt: Sequence[int], feed_tokens: Sequence[int], chunk_size: Optional[int] = None) -> LogitsTrace:
    drv = ManualDriver(runner)
    req = drv.new_request(prompt)
    try:
        prefill = drv.prefill_chunked(req, chunk_size)
        decode = [drv.decode([req], [t]).next_token_logits[0] for t in feed_tokens]
    finally:
        drv.free(req)
    return LogitsTrace(prefill, decode, list(feed_tokens))


def assert_trace_close(ours: LogitsTrace, ref: LogitsTrace, atol: float = 1e-4, rtol: float = 1e-4) -> None:
    torch.testing.assert_close(ours.prefill, ref.prefill, atol=atol, rtol=rtol, msg=lambda m: f"prefill: {m}")
    assert len(ours.decode) == len(ref.decode)
    for i, (a, b) in enumerate(zip(ours.decode, ref.decode)):
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=lambda m, i=i: f"decode step {i}: {m}")


def our_batch_logits(runner, prompts: Sequence[Sequence[int]], feed_tokens: Sequence[Sequence[int]]) -> List[LogitsTrace]:
    """All prompts prefilled in ONE ragged extend batch, then batched decode steps
    (request i is fed feed_tokens[i][step])."""
    drv = ManualDriver(runner)
    reqs = [drv.new_request(p) for p in prompts]
    try:
        out = drv.extend(reqs, [list(p) for p in prompts], return_full_logits=True)
        traces, off = [], 0
        for p in prompts:
            traces.append(LogitsTrace(out.full_logits[off : off + len(p)], [], []))
            off += len(p)
        n_steps = len(feed_tokens[0])
        for step in range(n_steps):
            toks = [int(f[step]) for f in feed_tokens]
            dec = drv.decode(reqs, toks).next_token_logits
            for i, tr in enumerate(traces):
                tr.decode.append(dec[i])
                tr.tokens.append(toks[i])
    finally:
        for r in reqs:
            drv.free(r)
    return traces


def random_prompt(length: int, seed: int, vocab: int = 49152, low: int = 100) -> List[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, vocab, (length,), generator=g).tolist()
