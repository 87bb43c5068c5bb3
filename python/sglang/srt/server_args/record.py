"""`ServerArgs`: every knob of the server, the rules that derive unset values, and `PortArgs`.

Why the record works the way it does (upstream's "declarations", reference section 1.2):
operators need to see both what they asked for and what the server decided. So construction
keeps the input as given (`raw_input()`), runs the resolution rules in upstream's order
(`resolution.RESOLUTION_PIPELINE`), and each rule *declares* its decisions under the
name of the upstream handler that makes them instead of assigning fields. After the last rule
the declarations are applied to the attributes, so consumers simply read `server_args.page_size`
and get the resolved value; `resolution_source("page_size")` says which rule chose it and
`explain()` prints the whole provenance. Validation errors are raised at construction with
upstream's exact messages, in upstream's order.

Importing this module is cheap (no torch): the CLI checker and launchers import it first.
"""

from __future__ import annotations

import argparse
import atexit
import copy
import dataclasses
import logging
import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sglang.srt.server_args.cli import add_cli_args_from_fields, namespace_to_kwargs, parse_with_config
from sglang.srt.server_args.compat.no_effect_fields import NoEffectFields
from sglang.srt.server_args.fields import (
    DeviceFields,
    DisaggFields,
    ExecFields,
    MemoryFields,
    ModelFields,
    ObservabilityFields,
    ParallelFields,
    ScheduleFields,
    ServingFields,
)
from sglang.srt.server_args.resolution import ServerArgsAssertionError, run_resolution_pipeline
from sglang.srt.utils import get_free_port_below_ephemeral, is_valid_ipv6_address, split_host_port

logger = logging.getLogger(__name__)

__all__ = ["ServerArgs", "PortArgs", "prepare_server_args", "ServerArgsAssertionError", "ZMQ_TCP_PORT_DELTA"]

ZMQ_TCP_PORT_DELTA = 233  # upstream's TCP port offset for attention-DP channels; this server never uses TCP for them

FALLBACK_SOURCE = "fallback"
# Never echoed back: the start-up log line and /server_info show REDACTED instead.
SECRET_FIELDS = ("api_key", "admin_api_key")
REDACTED = "<redacted>"


class _ResolvingView:
    """Live read-through of a record under resolution: last declaration wins, else raw input."""

    __slots__ = ("_sa",)

    def __init__(self, sa: "ServerArgs"):
        object.__setattr__(self, "_sa", sa)

    def __getattr__(self, name: str) -> Any:
        sa = object.__getattribute__(self, "_sa")
        for _source, decided in reversed(sa._declarations):
            if name in decided:
                return decided[name]
        raw = sa._raw_input
        if name in raw:
            return raw[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ResolvingConfig is read-only; resolution writes through declarations")


# Bases are listed in reverse so that `model_path` is the first positional field, as upstream;
# the no-effect fields come last.
@dataclasses.dataclass
class ServerArgs(
    NoEffectFields,
    ExecFields,
    DeviceFields,
    ParallelFields,
    DisaggFields,
    MemoryFields,
    ScheduleFields,
    ObservabilityFields,
    ServingFields,
    ModelFields,
):
    def __post_init__(self) -> None:
        raw = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)}
        object.__setattr__(self, "_raw_input", raw)
        object.__setattr__(self, "_declarations", [])
        # Upstream flags without a field here, as given (from_cli_args / from_kwargs fill it).
        object.__setattr__(self, "ignored_upstream_args", {})
        object.__setattr__(self, "_resolving", True)
        try:
            run_resolution_pipeline(self)
            self._apply_fallbacks()
        finally:
            object.__setattr__(self, "_resolving", False)
        for name, value in self._overlay().items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_resolving") and name in _FIELD_NAMES:
            raise AttributeError(
                f"server_args.{name} assigned during resolution; the record is the operator's input and "
                "resolution does not write it -- declare the decision with declare_resolution(server_args, "
                "source, **fields) so it carries a source and leaves the input intact."
            )
        object.__setattr__(self, name, value)

    # ---------------------------------------------------------------- declarations
    def _declare(self, source: str, **fields: Any) -> None:
        unknown = sorted(set(fields) - _FIELD_NAMES)
        if unknown:
            raise AttributeError(f"{source}: {unknown} are not ServerArgs fields")
        if not self.__dict__.get("_resolving"):
            raise ValueError(
                f"{source}: declared after resolution finished; use server_args.override(source, **fields) "
                "to change a resolved value."
            )
        if fields:
            self._declarations.append((source, dict(fields)))

    def _view(self) -> _ResolvingView:
        return _ResolvingView(self)

    @staticmethod
    def _fallback(name: str) -> Any:
        return _FIELDS[name].metadata.get("fallback")

    def _apply_fallbacks(self) -> None:
        view = self._view()
        decided = {
            name: f.metadata["fallback"]
            for name, f in _FIELDS.items()
            if "fallback" in f.metadata and getattr(view, name) is None
        }
        if decided:
            self._declarations.append((FALLBACK_SOURCE, decided))

    def _overlay(self) -> Dict[str, Any]:
        merged: Dict[str, Any] = {}
        for _source, decided in self._declarations:
            merged.update(decided)
        return merged

    def override(self, source: str, **fields: Any) -> None:
        """Change resolved values after construction, recorded with a source.

        For decisions that can only be made later (e.g. the scheduler resolving
        `disaggregation_decode_retraction_backup` from the KV pool it built, reference 4.5:
        `server_args.override("kv_cache_builder.decode_retraction", disaggregation_decode_retraction_backup=...)`).
        """
        unknown = sorted(set(fields) - _FIELD_NAMES)
        if unknown:
            raise AttributeError(f"{source}: {unknown} are not ServerArgs fields")
        self._declarations.append((source, dict(fields)))
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    # ---------------------------------------------------------------- provenance API
    def raw_input(self) -> Dict[str, Any]:
        """The fields exactly as the caller gave them (defaults included), before any rule ran."""
        return copy.deepcopy(self._raw_input)

    def declarations(self) -> List[Tuple[str, Dict[str, Any]]]:
        """Every decision in the order made: `(source, {field: value})`; later entries win."""
        return [(source, dict(decided)) for source, decided in self._declarations]

    def resolution_source(self, field: str) -> Optional[str]:
        """The rule that last declared `field`, or None when the value is the input."""
        if field not in _FIELD_NAMES:
            raise AttributeError(f"{field!r} is not a ServerArgs field")
        for source, decided in reversed(self._declarations):
            if field in decided:
                return source
        return None

    def resolution_result(self, field: str) -> Any:
        return getattr(self, field)

    def resolved_dict(self, redact: bool = True) -> Dict[str, Any]:
        """All public fields with their resolved values (what `/server_info` reports); secrets
        (`SECRET_FIELDS`) read "<redacted>" unless `redact=False`."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.name.startswith("_")}
        out["enable_dp_attention"] = self.attn_dp_size > 1
        if redact:
            for name in SECRET_FIELDS:
                if out.get(name):
                    out[name] = REDACTED
        return out

    def __repr__(self) -> str:
        """As the dataclass repr (upstream logs `server_args=ServerArgs(...)` at start), secrets redacted."""
        fields = self.resolved_dict()
        fields.pop("enable_dp_attention", None)
        return "ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"

    def explain(self, only_changed: bool = True) -> str:
        """Human-readable provenance: one line per field that a rule declared or the user set."""
        lines = []
        for f in dataclasses.fields(self):
            name = f.name
            value = getattr(self, name)
            raw = self._raw_input[name]
            if name in SECRET_FIELDS:  # explain() is printed (check_server_args): keys stay out of it
                value = REDACTED if value else value
                raw = REDACTED if raw else raw
            source = self.resolution_source(name)
            if source is not None:
                lines.append(f"{name} = {value!r}  [{source}; input {raw!r}]")
            elif raw != f.default:
                lines.append(f"{name} = {value!r}  [input]")
            elif not only_changed:
                lines.append(f"{name} = {value!r}  [default]")
        return "\n".join(lines)

    # ---------------------------------------------------------------- helpers for consumers
    def attention_backends(self) -> Tuple[Optional[str], Optional[str]]:
        """(prefill, decode) attention backends: the specific flags win over --attention-backend."""
        return (
            self.prefill_attention_backend or self.attention_backend,
            self.decode_attention_backend or self.attention_backend,
        )

    def url(self) -> str:
        host = self.host
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if is_valid_ipv6_address(host):
            return f"http://[{host}]:{self.port}"
        return f"http://{host}:{self.port}"

    # ---------------------------------------------------------------- CLI
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add_cli_args_from_fields(parser, ServerArgs)
        parser.add_argument(
            "--config",
            type=str,
            default=None,
            help="Read arguments from a YAML file (keys are argument names with - or _); command-line flags override it.",
        )
        add_upstream_only_flags(parser)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        sa = cls(**namespace_to_kwargs(cls, args))
        ignored = {k[len(UPSTREAM_DEST_PREFIX):]: v for k, v in vars(args).items()
                   if k.startswith(UPSTREAM_DEST_PREFIX) and v is not None}
        object.__setattr__(sa, "ignored_upstream_args", ignored)
        return sa

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "ServerArgs":
        """`ServerArgs(**kwargs)` that also accepts upstream-only field names (`Engine(**kwargs)`):
        those are kept in `ignored_upstream_args` and reported as having no effect."""
        from sglang.srt.server_args.compat.upstream_only_flags import UPSTREAM_ONLY_FLAGS

        ignored = {k: kwargs.pop(k) for k in list(kwargs) if k not in _FIELD_NAMES and k in UPSTREAM_ONLY_FLAGS}
        sa = cls(**kwargs)
        object.__setattr__(sa, "ignored_upstream_args", ignored)
        return sa


UPSTREAM_DEST_PREFIX = "_upstream__"


def add_upstream_only_flags(parser: argparse.ArgumentParser) -> None:
    """Upstream's flags without a field here: accepted with their argument shape (`compat/`)."""
    from sglang.srt.server_args.compat import NO_EFFECT_WARNING
    from sglang.srt.server_args.compat.upstream_only_flags import UPSTREAM_ONLY_FLAGS

    taken = set(parser._option_string_actions)
    for field, (flags, kind) in UPSTREAM_ONLY_FLAGS.items():
        names = [f for f in flags if f not in taken]
        if not names:
            continue
        kwargs = {"dest": UPSTREAM_DEST_PREFIX + field, "default": None, "help": f"Upstream flag, {NO_EFFECT_WARNING}."}
        if kind == "flag":
            parser.add_argument(*names, action="store_const", const=True, **kwargs)
        elif kind == "bool_optional":
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, **kwargs)
        elif kind == "values":
            parser.add_argument(*names, nargs="+", **kwargs)
        else:
            parser.add_argument(*names, **kwargs)


_FIELDS = {f.name: f for f in dataclasses.fields(ServerArgs)}
_FIELD_NAMES = frozenset(_FIELDS)


def prepare_server_args(argv: Optional[Sequence[str]] = None, prog: str = "sglang serve") -> ServerArgs:
    """Parse `argv` like `sglang serve` does (with `--config` merged) and build the ServerArgs.

    Unlike upstream 0.5.23 (which returns an unresolved record and resolves at launch), the
    record is resolved and validated here: construction is resolution in this fork.
    """
    parser = argparse.ArgumentParser(prog=prog)
    ServerArgs.add_cli_args(parser)
    args = parse_with_config(parser, argv)
    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s] %(message)s")
    return ServerArgs.from_cli_args(args)


# --------------------------------------------------------------------------------------------
# PortArgs (reference 1.6)
# --------------------------------------------------------------------------------------------


def _private_ipc_dir() -> str:
    """A fresh directory only this user can enter (mkdtemp makes it 0700), for one server's ipc
    sockets: another local user can neither connect to them nor swap them. The process that
    created it removes it at exit (also `EngineProcesses.shutdown`, earlier)."""
    path = tempfile.mkdtemp(prefix="sglang-ipc-")
    atexit.register(_remove_ipc_dir, path, os.getpid())
    return path


def _remove_ipc_dir(path: str, owner_pid: Optional[int] = None) -> None:
    if owner_pid is not None and os.getpid() != owner_pid:  # a forked child: not its directory
        return
    shutil.rmtree(path, ignore_errors=True)


@dataclasses.dataclass
class PortArgs:
    """The ZMQ endpoints and the NCCL port that the server's processes use to talk to each other.

    Always `ipc://` sockets in `ipc_dir`, a private directory of this server (upstream switches
    to TCP with attention-DP; this server runs one scheduler on one host, where `--attn-dp-size`
    has no effect, and a flag without effect must not open a network port)."""

    tokenizer_ipc_name: str
    scheduler_input_ipc_name: str
    detokenizer_ipc_name: str
    nccl_port: int
    rpc_ipc_name: str
    metrics_ipc_name: str
    tokenizer_worker_ipc_name: Optional[str]
    decoupled_spec_ipc_config: Optional[Any] = None
    load_collector_ipc_name: str = ""
    instance_id: str = ""
    ipc_dir: str = ""

    @staticmethod
    def init_new(
        server_args: ServerArgs, dp_rank: Optional[int] = None, worker_ports: Optional[List[int]] = None
    ) -> "PortArgs":
        """`dp_rank` and `worker_ports` are upstream's (attention-DP over TCP) and change nothing here."""
        if server_args.attn_dp_size > 1 and server_args.dist_init_addr is not None:
            split_host_port(server_args.dist_init_addr)  # upstream's error for a malformed address
        nccl_port = server_args.nccl_port or get_free_port_below_ephemeral()
        d = _private_ipc_dir()

        def ipc(name: str) -> str:
            return f"ipc://{os.path.join(d, name)}"

        return PortArgs(
            tokenizer_ipc_name=ipc("tokenizer"),
            scheduler_input_ipc_name=ipc("scheduler_input"),
            detokenizer_ipc_name=ipc("detokenizer"),
            nccl_port=nccl_port,
            rpc_ipc_name=ipc("rpc"),
            metrics_ipc_name=ipc("metrics"),
            tokenizer_worker_ipc_name=None if server_args.tokenizer_worker_num == 1 else ipc("tokenizer_worker"),
            load_collector_ipc_name=ipc("load_collector"),
            ipc_dir=d,
        )
