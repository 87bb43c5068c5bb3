"""Configuration in one room: `ServerArgs`, its flags, its resolution rules, and the
upstream-compatibility surface.

    record.py       ServerArgs (the record, its provenance), PortArgs, prepare_server_args
    fields.py       the fields that act, grouped like upstream's field namespaces
    choices.py      the choice lists of the flags
    cli.py          argparse built from the field declarations, `--config` YAML
    resolution.py   derived defaults and validations, in upstream's order, with its messages
    compat/         accepted for upstream compatibility, no effect here: no-effect fields (with
                    their reasons) and upstream-only flags, and the start-up warning about them

Users import `sglang.srt.server_args.ServerArgs` as upstream; importing it is cheap (no torch).
"""

from sglang.srt.server_args.record import (
    ZMQ_TCP_PORT_DELTA,
    PortArgs,
    ServerArgs,
    ServerArgsAssertionError,
    prepare_server_args,
)

__all__ = ["ServerArgs", "PortArgs", "prepare_server_args", "ServerArgsAssertionError", "ZMQ_TCP_PORT_DELTA"]
