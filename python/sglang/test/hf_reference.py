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


@torch.inference_mode()
def hf_pooled(path: str, prompts: List[List[int]], pooling: str = "last", normalize: bool = True) -> List[List[float]]:
    """Embedding references: the final hidden states of HF's base model (`AutoModel`) pooled
    over each prompt (last token, mean, or first token), then L2-normalised when asked; for a
    `*ForSequenceClassification` folder the last token's class logits instead."""
    import json
    import os

    from transformers import AutoModel, AutoModelForSequenceClassification

    with open(os.path.join(path, "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    classifier = arch.endswith("ForSequenceClassification")
    model = (AutoModelForSequenceClassification if classifier else AutoModel).from_pretrained(path, dtype=torch.float32)
    model.eval()
    out = []
    for ids in prompts:
        res = model(input_ids=torch.tensor([ids]))
        if classifier:
            out.append(res.logits[0].tolist())
            continue
        hidden = res.last_hidden_state[0]
        vec = {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[pooling]
        if normalize:
            vec = torch.nn.functional.normalize(vec, p=2, dim=-1)
        out.append(vec.tolist())
    return out
