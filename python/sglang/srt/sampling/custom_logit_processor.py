"""Custom logit processors, as upstream `sampling/custom_logit_processor.py`.

A client subclasses `CustomLogitProcessor`, sends `MyProcessor.to_str()` as the request's
`custom_logit_processor` and per-request arguments as `sampling_params.custom_params`. The server
(only with `--enable-custom-logit-processor`: the string is a pickled class, so it runs code the
client chose) loads the class with dill, instantiates it once per distinct string, and calls it on
the logits rows of the requests that use it, after penalties, the grammar mask and logit_bias.
Each row's `custom_params` dict gets `"__req__"`: the scheduler's request object, as upstream.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from functools import lru_cache
from typing import Any, Dict, List, Optional

import torch


class CustomLogitProcessor(ABC):
    @abstractmethod
    def __call__(self, logits: torch.Tensor, custom_param_list: Optional[List[Dict[str, Any]]] = None) -> torch.Tensor:
        """Returns the processed logits of the rows it was given (same shape)."""

    @classmethod
    def to_str(cls) -> str:
        import dill

        return json.dumps({"callable": dill.dumps(cls).hex()})

    @classmethod
    def from_str(cls, json_str: str) -> "CustomLogitProcessor":
        return _load(json_str)


@lru_cache(maxsize=64)
def _load(json_str: str) -> CustomLogitProcessor:
    import dill

    try:
        payload = json.loads(json_str)["callable"]
        obj = dill.loads(bytes.fromhex(payload))
    except Exception as e:  # noqa: BLE001 - any malformed string is the client's error
        raise ValueError(f"Invalid custom_logit_processor: {type(e).__name__}: {e}") from None
    return obj() if isinstance(obj, type) else obj


def apply_custom_logit_processors(logits: torch.Tensor, reqs) -> None:
    """In place: each distinct processor on the rows of the requests that name it."""
    groups: Dict[str, List[int]] = {}
    for i, req in enumerate(reqs):
        if req.custom_logit_processor:
            groups.setdefault(req.custom_logit_processor, []).append(i)
    for text, rows in groups.items():
        processor = _load(text)
        params = []
        for i in rows:
            p = dict(reqs[i].sampling_params.custom_params or {})
            p["__req__"] = reqs[i]
            params.append(p)
        idx = torch.tensor(rows, dtype=torch.int64, device=logits.device)
        logits[idx] = processor(logits[idx], params).to(logits.dtype)
