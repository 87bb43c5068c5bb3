"""Loads the tokenizer a server uses (also for the packaged default model)."""

from __future__ import annotations


def load_tokenizer(server_args):
    from transformers import AutoTokenizer

    from sglang.srt.model_loader.default_model import resolve_model_path

    path = resolve_model_path(server_args.tokenizer_path or server_args.model_path)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=getattr(server_args, "trust_remote_code", False))
