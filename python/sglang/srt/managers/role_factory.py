"""(Scheduler process.) The server role for `--disaggregation-mode`: `make_role(mode, facade)`.

The one place that maps a mode to its role; the PD roles are imported only on the servers that
use them (a plain server never loads the transfer engine).
"""

from __future__ import annotations

from sglang.srt.managers.server_role import SchedulerFacade, ServerRole


def make_role(mode: str, facade: SchedulerFacade) -> ServerRole:
    if mode == "null":
        return ServerRole(facade)
    if mode == "prefill":
        from sglang.srt.disaggregation.prefill import PrefillRole

        return PrefillRole(facade)
    if mode == "decode":
        from sglang.srt.disaggregation.decode import DecodeRole

        return DecodeRole(facade)
    raise ValueError(f"Unknown disaggregation mode: {mode!r} (expected null, prefill or decode)")
