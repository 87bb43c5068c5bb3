"""`python -m sglang.launch_server --model-path M [flags]`: start the HTTP server."""

from __future__ import annotations

import sys


def main(argv=None) -> None:
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(sys.argv[1:] if argv is None else argv)
    launch_server(server_args)


if __name__ == "__main__":
    main()
