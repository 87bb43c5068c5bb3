"""Building the argparse parser from the `ServerArgs` field declarations, and `--config` YAML.

Upstream derives every flag from the field declarations (`add_cli_args_from_dataclass`):
`--` + field name with `_` -> `-`, plus aliases; `bool` -> `store_true`; `Optional[X]` -> X;
a choice list -> argparse choices (so a typo is an argparse error, exit code 2); fields without
a CLI (`no_cli`) are skipped. argparse's prefix abbreviation stays on, so `--tp` means `--tp-size`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from typing import Any, List, Optional, Sequence


def _unwrap_optional(tp):
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_cli_args_from_fields(parser: argparse.ArgumentParser, cls) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        md = f.metadata
        if not md or md.get("no_cli") or f.name.startswith("_"):
            continue
        names = [flag_name(f.name), *md.get("aliases", ())]
        kwargs = {"dest": f.name, "default": f.default, "help": md.get("help")}
        tp = _unwrap_optional(hints[f.name])
        if tp is bool:
            parser.add_argument(*names, action="store_true", **kwargs)
            continue
        origin = typing.get_origin(tp)
        if md.get("type_parser") is not None:
            kwargs["type"] = md["type_parser"]
        elif origin in (list, List):
            (item,) = typing.get_args(tp) or (str,)
            kwargs["type"] = item
            kwargs["nargs"] = md.get("nargs") or "+"
        elif tp in (int, float, str):
            kwargs["type"] = tp
        if md.get("nargs") and "nargs" not in kwargs:
            kwargs["nargs"] = md["nargs"]
        if md.get("choices") is not None:
            kwargs["choices"] = md["choices"]
        parser.add_argument(*names, **kwargs)


# --------------------------------------------------------------------------------------------
# --config file.yaml
# --------------------------------------------------------------------------------------------


def _extract_config_path(argv: List[str]):
    """Returns (config_path or None, argv without the --config option)."""
    rest, path, i = [], None, 0
    while i < len(argv):
        token = argv[i]
        if token == "--config":
            if i + 1 >= len(argv):
                raise SystemExit("--config requires a file path")
            path = argv[i + 1]
            i += 2
            continue
        if token.startswith("--config="):
            path = token.split("=", 1)[1]
            i += 1
            continue
        rest.append(token)
        i += 1
    return path, rest


def config_file_to_argv(parser: argparse.ArgumentParser, path: str) -> List[str]:
    """Translate a YAML mapping of field names (with `-` or `_`) into CLI tokens.

    The tokens are placed before the command-line ones, so a flag given on the command line
    overrides the file (argparse keeps the last value). A `true` boolean becomes the bare flag;
    `false`/`null` leave the default. An unknown key is a parser error, like an unknown flag.
    """
    import yaml

    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        parser.error(f"config file {path} must hold a mapping of argument names to values")
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    by_flag = parser._option_string_actions  # upstream-only flags have a private dest
    tokens: List[str] = []
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        action = actions.get(dest) or by_flag.get("--" + dest.replace("_", "-"))
        if action is None or dest == "config":
            parser.error(f"unrecognized argument in config file {path}: {key}")
        flag = action.option_strings[0]
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreConstAction)):
            if value:
                tokens.append(flag)
        elif value is None:
            continue
        elif isinstance(value, (list, tuple)):
            tokens.extend([flag, *map(str, value)])
        elif isinstance(value, dict):
            tokens.extend([flag, json.dumps(value)])
        elif isinstance(value, bool):
            tokens.extend([flag, str(value).lower()])
        else:
            tokens.extend([flag, str(value)])
    return tokens


def parse_with_config(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> argparse.Namespace:
    argv = list(argv) if argv is not None else []
    path, rest = _extract_config_path(argv)
    merged = (config_file_to_argv(parser, path) if path else []) + rest
    args = parser.parse_args(merged)
    args.config = path
    args._radix_eviction_policy_explicitly_set = any(
        t == "--radix-eviction-policy" or t.startswith("--radix-eviction-policy=") for t in merged
    )
    return args


def namespace_to_kwargs(cls, args: Any) -> dict:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
