"""The ``gpumetrics`` console script (entry point ``gpumetrics.cli:main``).

Commands: ``serve`` (the sidecar), ``pull ADDR``, ``declare ADDR``, ``count-gpus``; ``--version``.

Exit codes:

* 0: success (``serve``: a graceful shutdown);
* 1: failure (unreachable server, RPC error, start-up failure; go-plugin mode refused: wrong or
  missing magic cookie, AutoMTLS requested);
* 2: usage or configuration error (the message names the flag, variable or setting);
* 3: ``declare``: the server rejected at least one entry; ``serve``: the collector asked for a
  restart (NVML library and kernel driver versions differ, field case F12).

Errors are one line on stderr: ``gpumetrics: <what>: <why>``.

go-plugin mode: when the magic-cookie variable is present, :func:`main` first keeps a duplicate
of the real stdout for the handshake and points fd 1 at stderr, before importing anything that
could print, so nothing but the handshake line ever reaches the host's stdout pipe.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = ["main"]

_COOKIE_KEY = "GPUMETRICS_PLUGIN_MAGIC_COOKIE"  # == gpumetrics.service.plugin.COOKIE_KEY (tested)


def _reserve_stdout() -> TextIO:
    """Duplicate fd 1 for the handshake and point fd 1 (and ``sys.stdout``) at stderr."""
    saved = os.dup(1)
    os.set_inheritable(saved, False)
    os.dup2(2, 1)
    return os.fdopen(saved, "w", encoding="ascii", newline="\n")


def _restore_stdout(handshake: TextIO) -> None:
    sys.stdout.flush()
    os.dup2(handshake.fileno(), 1)
    handshake.close()


def main(argv: Sequence[str] | None = None, **sidecar_options: Any) -> int:
    """Run the console script; return its exit code (documented in the module docstring).

    ``sidecar_options`` (embedding and tests) go to :class:`gpumetrics.runtime.Sidecar` for
    ``serve``, e.g. ``collector_factory``.
    """
    handshake = _reserve_stdout() if _COOKIE_KEY in os.environ else None

    from gpumetrics.cli.parser import build_parser

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command or ("serve" if handshake is not None else None)
    if command is None:
        parser.print_help(sys.stderr)
        return 2
    if handshake is not None and command != "serve":
        _restore_stdout(handshake)  # the cookie only matters to `serve`
        handshake = None
    try:
        if command == "serve":
            from gpumetrics.cli.serve import cmd_serve

            if args.command is None:
                args = parser.parse_args(["serve", *argv])
            return cmd_serve(args, handshake, **sidecar_options)
        from gpumetrics.cli import client

        commands = {
            "pull": client.cmd_pull,
            "declare": client.cmd_declare,
            "count-gpus": client.cmd_count_gpus,
        }
        return commands[command](args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure ends as one line and an exit code
        return _report(exc)


def _report(exc: Exception) -> int:
    """Print ``exc`` as one line on stderr and return its exit code (a traceback if unexpected)."""
    from gpumetrics.cli.client import CommandError
    from gpumetrics.service import ListenError

    if isinstance(exc, CommandError):
        print(f"gpumetrics: {exc}", file=sys.stderr)
        return exc.code
    if isinstance(exc, ListenError):
        print(f"gpumetrics: {exc}", file=sys.stderr)
        return 1
    if isinstance(exc, BrokenPipeError):  # `gpumetrics pull ... | head`: the reader left
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a killed writer
    import traceback

    traceback.print_exc(file=sys.stderr)
    print(f"gpumetrics: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1
