"""The xgrammar backend (upstream `constrained/xgrammar_backend.py`): JSON schema, regex, EBNF and
structural tags compiled by xgrammar's `GrammarCompiler`, one `GrammarMatcher` per request, a
packed int32 token bitmask per batch applied by xgrammar's own kernel (CPU kernel on CPU tensors,
Triton/CUDA on GPU)."""

from __future__ import annotations

import json
import logging
from typing import Optional

import torch

from sglang.srt.layers import cpu_ops
from sglang.srt.constrained.base_grammar_backend import (
    ANY_JSON,
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarKey,
    InvalidGrammarError,
)

logger = logging.getLogger(__name__)

MAX_ROLLBACK_TOKENS = 200


class XGrammarGrammar(BaseGrammarObject):
    def __init__(self, matcher, key: GrammarKey):
        self.matcher = matcher
        self.key = key

    def accept_token(self, token: int) -> None:
        if not self.matcher.accept_token(int(token)):
            raise ValueError(f"token {token} is not allowed by the {self.key[0]} grammar here")

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        self.matcher.fill_next_token_bitmask(vocab_mask, idx)

    def rollback(self, k: int) -> None:
        self.matcher.rollback(k)


class XGrammarGrammarBackend(BaseGrammarBackend):
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids=(), any_whitespace: bool = True,
                 max_whitespace_cnt: Optional[int] = None):
        import xgrammar as xgr

        super().__init__(num_threads=1)
        self._xgr = xgr
        self.vocab_size = vocab_size
        # --constrained-json-disable-any-whitespace / --constrained-json-max-whitespace-cnt
        self.json_options = dict(any_whitespace=any_whitespace)
        if max_whitespace_cnt is not None:
            self.json_options["max_whitespace_cnt"] = max_whitespace_cnt
        stop = sorted(set(eos_token_ids or ())) or None
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop)
        # The backend's own LRU (BaseGrammarBackend) bounds the cache; xgrammar's would grow without bound.
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, key: GrammarKey):
        kind, spec = key
        c = self.compiler
        try:
            if kind == "json":
                if spec == ANY_JSON:
                    return c.compile_builtin_json_grammar()
                json.loads(spec)  # a clear message for text that is not JSON at all
                return c.compile_json_schema(spec, **self.json_options)
            if kind == "regex":
                return c.compile_regex(spec)
            if kind == "ebnf":
                return c.compile_grammar(spec)
            if kind == "structural_tag":
                return self._compile_structural_tag(spec)
        except InvalidGrammarError:
            raise
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError / its own errors
            raise InvalidGrammarError(f"Invalid {_KIND_NAMES[kind]}: {_short(e)}") from None
        raise InvalidGrammarError(f"Unknown grammar kind {kind!r}")

    def _compile_structural_tag(self, spec: str):
        """Upstream's legacy form {"structures": [{"begin", "schema", "end"}], "triggers": [...]},
        or xgrammar's own structural-tag JSON."""
        xgr = self._xgr
        obj = json.loads(spec)
        if isinstance(obj, dict) and "structures" in obj:
            tags = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                    for s in obj["structures"]]
            return self.compiler.compile_structural_tag(tags, obj.get("triggers", []))
        return self.compiler.compile_structural_tag(spec)

    def new_matcher(self, compiled, key: GrammarKey) -> XGrammarGrammar:
        return XGrammarGrammar(self._xgr.GrammarMatcher(compiled, max_rollback_tokens=MAX_ROLLBACK_TOKENS), key)

    def allocate_vocab_mask(self, batch_size: int) -> torch.Tensor:
        return self._xgr.allocate_token_bitmask(batch_size, self.vocab_size)

    def apply_vocab_mask(self, logits: torch.Tensor, vocab_mask: torch.Tensor) -> None:
        """sgl-kernel's CPU op when it is built (18x xgrammar's CPU kernel on real masks, whose
        32-token words are nearly all fully allowed or fully banned), else xgrammar's kernel."""
        if vocab_mask.device != logits.device:
            vocab_mask = vocab_mask.to(logits.device, non_blocking=True)
        width = min(self.vocab_size, logits.shape[-1])
        if logits.dtype == torch.float32 and logits.is_contiguous() and cpu_ops.enabled(logits):
            torch.ops.sgl_kernel.apply_token_bitmask_(logits, vocab_mask, width)
            return
        self._xgr.apply_token_bitmask_inplace(logits, vocab_mask, vocab_size=width)


_KIND_NAMES = {"json": "json_schema", "regex": "regex", "ebnf": "ebnf", "structural_tag": "structural_tag"}


def _short(e: Exception) -> str:
    """xgrammar's message without its C++ source location prefix."""
    text = str(e).strip()
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    if ".cc:" in text.split(" ", 1)[0]:
        text = text.split(" ", 1)[1] if " " in text else text
    return text.replace("Check failed: (error.empty()) is false: ", "").strip()
