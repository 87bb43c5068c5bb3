"""(Tokenizer/HTTP and scheduler processes.) Loads the tokenizer a server uses (also for the packaged default model). Every process that
needs one (tokenizer manager, detokenizer, scheduler) loads it from the same place:
`--tokenizer-path` when given, else the model (`--tokenizer-mode slow`: the Python tokenizer)."""

from __future__ import annotations

from typing import Optional


def load_tokenizer(server_args, default_path: Optional[str] = None):
    from transformers import AutoTokenizer

    from sglang.srt.model_loader.default_model import resolve_model_path

    path = resolve_model_path(server_args.tokenizer_path or default_path or server_args.model_path)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=server_args.trust_remote_code,
                                         use_fast=server_args.tokenizer_mode != "slow")
