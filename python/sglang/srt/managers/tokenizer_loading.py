"""(Tokenizer/HTTP and scheduler processes.) Loads the tokenizer a server uses (also for the packaged default model). Every process that
needs one (tokenizer manager, detokenizer, scheduler) loads it from the same place:
`--tokenizer-path` when given, else the model (`--tokenizer-mode slow`: the Python tokenizer); for a
GGUF file, the tokenizer its metadata describes, as transformers builds it (`gguf_file=`)."""

from __future__ import annotations

from typing import Optional


def load_tokenizer(server_args, default_path: Optional[str] = None):
    from transformers import AutoTokenizer

    from sglang.srt.model_loader.default_model import resolve_model_path

    from sglang.srt.configs.gguf_file import is_gguf_file, split_gguf_path

    path = resolve_model_path(server_args.tokenizer_path or default_path or server_args.model_path)
    if is_gguf_file(path):  # the tokenizer the file's metadata describes (transformers builds it)
        folder, name = split_gguf_path(path)
        return AutoTokenizer.from_pretrained(folder, gguf_file=name, trust_remote_code=server_args.trust_remote_code)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=server_args.trust_remote_code,
                                         use_fast=server_args.tokenizer_mode != "slow")
