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

    path = resolve_model_path(server_args.tokenizer_path or default_path or server_args.model_path,
                              server_args.load_format)
    if is_gguf_file(path):
        # The tokenizer the file's metadata describes, as transformers builds it from a GGUF file.
        # Asked of the fast-tokenizer class directly: AutoTokenizer builds the same tokenizer but
        # first parses the whole file with gguf-py's reader for the config (10 s instead of 0.5 s
        # for the default model, in each of the three processes that load it).
        from transformers import PreTrainedTokenizerFast

        folder, name = split_gguf_path(path)
        return PreTrainedTokenizerFast.from_pretrained(folder, gguf_file=name)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=server_args.trust_remote_code,
                                         use_fast=server_args.tokenizer_mode != "slow")
