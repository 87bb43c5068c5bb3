"""`python -m sglang.launch_server --model-path M [flags]`: start the HTTP server."""

from __future__ import annotations

import sys


def main(argv=None) -> None:
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.model_loader.loader import ModelConfigError
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(sys.argv[1:] if argv is None else argv)
    code = 0
    try:
        launch_server(server_args)
    except SystemExit as e:  # the server's own exit code (a failed child: 1)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except ModelConfigError as e:  # a config.json we cannot serve: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        code = 1
    if argv is None:  # the command itself: leave without the interpreter's ~1 s module teardown
        from sglang.srt.utils.process import exit_after_cleanup

        exit_after_cleanup(code)
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
