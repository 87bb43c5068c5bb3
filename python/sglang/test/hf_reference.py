"""HF transformers as the correctness reference: greedy continuations on the same weights."""

from __future__ import annotations

from typing import List

import torch


def load_hf_model(path: str, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.eval()
    return model


@torch.inference_mode()
def hf_greedy(model, input_ids: List[int], max_new_tokens: int) -> List[int]:
    """Greedy tokens with the KV cache, never stopping early (the engine side uses ignore_eos)."""
    ids = torch.tensor([input_ids], dtype=torch.long)
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    tokens = []
    nxt = int(out.logits[0, -1].argmax())
    for _ in range(max_new_tokens):
        tokens.append(nxt)
        if len(tokens) == max_new_tokens:
            break
        out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        nxt = int(out.logits[0, -1].argmax())
    return tokens
