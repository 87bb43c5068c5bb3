"""(Tokenizer/HTTP process.) `--log-requests`: one "Receive: obj=..." line when a sequence arrives
and one "Finish: obj=..., out=..." line when it ends, in upstream's format.

`--log-requests-level` (upstream's meaning):
  0: metadata only (no prompt, no output text/ids, no sampling parameters);
  1: metadata and sampling parameters;
  2: everything, strings and lists longer than 2048 cut in the middle (upstream's default);
  3: everything, uncut.
The rid, prompt/completion token counts and the latency (`meta_info.e2e_latency`) are in every level.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional, Set

logger = logging.getLogger("sglang.srt.managers.tokenizer_manager")

_UNCUT = 1 << 30
_METADATA_SKIP_IN = {"text", "input_ids", "input_embeds", "image_data", "audio_data", "lora_path"}
_METADATA_SKIP_OUT = {"text", "output_ids", "embedding"}


def to_string_truncated(data: Any, max_length: int, skip_names: Optional[Set[str]] = None) -> str:
    """repr-like text of a dataclass / dict / list / str, long values cut to their two halves."""
    skip = skip_names or set()
    if isinstance(data, str):
        if len(data) > max_length:
            half = max_length // 2
            return f"{data[:half]!r} ... {data[-half:]!r}"
        return repr(data)
    if isinstance(data, (list, tuple)):
        if len(data) > max_length:
            half = max_length // 2
            return f"{list(data[:half])} ... {list(data[-half:])}"
        return str(list(data))
    if isinstance(data, dict):
        items = ", ".join(f"{k!r}: {to_string_truncated(v, max_length)}" for k, v in data.items() if k not in skip)
        return "{" + items + "}"
    if dataclasses.is_dataclass(data):
        items = ", ".join(f"{f.name}={to_string_truncated(getattr(data, f.name), max_length)}"
                          for f in dataclasses.fields(data) if f.name not in skip)
        return f"{type(data).__name__}({items})"
    return str(data)


class RequestLogger:
    def __init__(self, level: int = 2):
        self.level = level
        if level == 0:
            self.max_length, self.skip_in, self.skip_out = _UNCUT, _METADATA_SKIP_IN | {"sampling_params"}, _METADATA_SKIP_OUT
        elif level == 1:
            self.max_length, self.skip_in, self.skip_out = _UNCUT, _METADATA_SKIP_IN, _METADATA_SKIP_OUT
        elif level == 2:
            self.max_length, self.skip_in, self.skip_out = 2048, set(), set()
        else:
            self.max_length, self.skip_in, self.skip_out = _UNCUT, set(), set()

    @classmethod
    def from_server_args(cls, server_args) -> Optional["RequestLogger"]:
        return cls(server_args.log_requests_level) if server_args.log_requests else None

    def on_receive(self, obj) -> None:
        logger.info(f"Receive: obj={to_string_truncated(obj, self.max_length, self.skip_in)}")

    def on_finish(self, obj, out: dict) -> None:
        logger.info(f"Finish: obj={to_string_truncated(obj, self.max_length, self.skip_in)}, "
                    f"out={to_string_truncated(out, self.max_length, self.skip_out)}")
