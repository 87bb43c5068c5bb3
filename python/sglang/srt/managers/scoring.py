"""(Tokenizer/HTTP process.) Upstream's scoring API (`/v1/score`, `Engine.score`): the probability
of some label tokens right after `query + item`, for each item.

Each item becomes one prompt (`query + item`, or `item + query` with `item_first`; text is joined
as text and tokenized once, token ids are joined as ids). All prompts run as one batch with
`max_new_tokens: 0`: prefill only, and the next-token distribution after the last prompt token is
read through `token_ids_logprob`. Scores are `exp(logprob)` of each label token (its probability
over the whole vocabulary), or with `apply_softmax` a softmax over the label tokens' logprobs (the
labels' probabilities renormalised to sum to 1). On an embedding server (`--is-embedding`, a
sequence-classification model) the score of an item is its class-logit vector instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
from sglang.srt.managers.tokenizer_manager import abort_reason

Query = Optional[Union[str, List[int]]]
Items = Optional[Union[str, List[str], List[List[int]]]]


@dataclass(frozen=True)
class ScoreResult:
    scores: List[List[float]] = field(default_factory=list)
    prompt_tokens: int = 0


def build_score_request(query: Query, items: Items, label_token_ids: Optional[Sequence[int]],
                        item_first: bool, vocab_size: Optional[int], is_generation: bool = True) -> Optional[GenerateReqInput]:
    """The batch request for these items (None when there are no items: nothing to score).
    Raises ValueError with upstream's messages for what cannot be scored."""
    if is_generation and label_token_ids is None:
        raise ValueError("label_token_ids is required for generation (CausalLM) models.")
    if label_token_ids is not None:
        if not isinstance(label_token_ids, (list, tuple)) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in label_token_ids):
            raise ValueError("label_token_ids must be a list of token ids (integers).")
        for token_id in label_token_ids:
            if vocab_size is not None and not 0 <= token_id < vocab_size:
                raise ValueError(f"Token ID {token_id} is out of vocabulary (vocab size: {vocab_size})")
    if items is None:
        raise ValueError("items must be provided")
    if items == [] or items == "":
        return None
    kind = GenerateReqInput if is_generation else EmbeddingReqInput
    if isinstance(query, str) and (isinstance(items, str) or all(isinstance(i, str) for i in items)):
        texts = [items] if isinstance(items, str) else list(items)
        prompts = [f"{item}{query}" if item_first else f"{query}{item}" for item in texts]
        obj = kind(text=prompts)
    elif (isinstance(query, list) and isinstance(items, list) and all(isinstance(i, list) for i in items)
          and all(isinstance(t, int) for t in query)):
        obj = kind(input_ids=[item + query if item_first else query + item for item in items])
    else:
        raise ValueError("Invalid combination of query/items types for score_request.")
    obj.sampling_params = {"max_new_tokens": 0}
    obj.stream = False
    if is_generation:
        obj.return_logprob = True
        obj.token_ids_logprob = list(label_token_ids)
        obj.logprob_start_len = -1
    return obj


def scores_from_outputs(outputs: List[dict], label_token_ids: Optional[Sequence[int]], apply_softmax: bool,
                        is_generation: bool = True) -> ScoreResult:
    scores = []
    for out in outputs:
        meta = out["meta_info"]
        if not is_generation:
            if "embedding" not in out:
                raise ValueError("Embedding not found in the result.")
            values = [float(x) for x in out["embedding"]]
            scores.append(_softmax(values) if apply_softmax else values)
            continue
        positions = meta.get("output_token_ids_logprobs") or []
        if not positions or not positions[0]:
            raise RuntimeError(f"output_logprobs is empty for request {meta.get('id')}.")
        by_id = {int(tid): float(lp) for lp, tid, *_ in positions[0]}
        logprobs = [by_id.get(t, float("-inf")) for t in label_token_ids]
        if apply_softmax:
            scores.append(_softmax(logprobs))
        else:
            scores.append([math.exp(x) if x != float("-inf") else 0.0 for x in logprobs])
    return ScoreResult(scores=scores, prompt_tokens=sum(o["meta_info"].get("prompt_tokens", 0) for o in outputs))


async def score_request(tokenizer_manager, query: Query = None, items: Items = None,
                        label_token_ids: Optional[Sequence[int]] = None, apply_softmax: bool = False,
                        item_first: bool = False, request=None) -> ScoreResult:
    """Scores every item (see the module docstring). ValueError: the request cannot be scored."""
    is_generation = not tokenizer_manager.server_args.is_embedding
    obj = build_score_request(query, items, label_token_ids, item_first, tokenizer_manager.vocab_size, is_generation)
    if obj is None:
        return ScoreResult()
    outputs = await run_to_completion(tokenizer_manager, obj, request)
    return scores_from_outputs(outputs, label_token_ids, apply_softmax, is_generation)


async def run_to_completion(tokenizer_manager, obj: GenerateReqInput, request=None) -> List[dict]:
    """Runs a non-streaming request (a batch or one prompt) and returns its outputs as a list. An
    aborted entry raises: ValueError for the client's fault (400), RuntimeError otherwise."""
    outputs = None
    async for outputs in tokenizer_manager.generate_request(obj, request):
        break
    outputs = outputs if isinstance(outputs, list) else [outputs]
    for out in outputs:
        reason = abort_reason(out)
        if reason is not None:
            message = str(reason.get("message") or "The request was aborted.")
            raise ValueError(message) if reason.get("status_code") == 400 else RuntimeError(message)
    return outputs


def _softmax(values: List[float]) -> List[float]:
    finite = [v for v in values if v != float("-inf")]
    if not finite:
        return [1.0 / len(values)] * len(values) if values else []
    top = max(finite)
    exps = [math.exp(v - top) if v != float("-inf") else 0.0 for v in values]
    total = sum(exps)
    return [e / total for e in exps]
