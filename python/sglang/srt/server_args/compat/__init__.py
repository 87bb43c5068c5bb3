"""The upstream-compatibility surface: flags accepted so that upstream launch commands start, but
that have no effect in this server.

Two kinds, both reported in one warning at start when the user set them (to anything but their
default), and listed in `docs/server_args.md`:

* `NoEffectFields` (`no_effect_fields.py`): `ServerArgs` fields that are parsed and validated
  with upstream's rules but change nothing here (CUDA graphs, HiCache storage tiers, ...), each
  declared with its reason (`NO_EFFECT_FIELDS` maps name -> reason);
* `UPSTREAM_ONLY_FLAGS` (`upstream_only_flags.py`): upstream flags this fork has no field
  for; the parser accepts them with their upstream argument shape so that upstream launch
  commands and tests start.

Every other field does what its help says; `test/srt/test_server_args_compat.py` walks every
field and fails if one is neither read by the server nor listed here. Importing this is cheap.
"""

from __future__ import annotations

import logging
from typing import List

__all__ = ["NO_EFFECT_FIELDS", "NO_EFFECT_WARNING", "NoEffectFields", "UPSTREAM_ONLY_FLAGS", "no_effect_settings",
           "warn_no_effect_flags"]

from sglang.srt.server_args.compat.no_effect_fields import NO_EFFECT_FIELDS, NoEffectFields
from sglang.srt.server_args.compat.upstream_only_flags import UPSTREAM_ONLY_FLAGS

logger = logging.getLogger(__name__)

NO_EFFECT_WARNING = "accepted for compatibility, has no effect here"


def no_effect_settings(server_args) -> List[str]:
    """The flags the user set that do nothing here, as `--flag` names (sorted)."""
    import dataclasses

    from sglang.srt.server_args.cli import flag_name

    out = []
    defaults = {f.name: f.default for f in dataclasses.fields(server_args)}
    raw = server_args.raw_input()
    for name in NO_EFFECT_FIELDS:
        if name in raw and raw[name] != defaults.get(name):
            out.append(flag_name(name))
    for name in server_args.ignored_upstream_args:
        out.append(flag_name(name))
    return sorted(out)


def warn_no_effect_flags(server_args) -> None:
    flags = no_effect_settings(server_args)
    if flags:
        logger.warning("%s: %s (see docs/server_args.md)", NO_EFFECT_WARNING, ", ".join(flags))
