"""The ``gpumetrics`` console script (entry point ``gpumetrics.cli:main``).

Commands: ``serve`` (the sidecar), ``pull ADDR``, ``pull-logs ADDR`` (the GPU events),
``declare ADDR``, ``count-gpus``; ``--version``.

Exit codes:

* 0: success (``serve``: a graceful shutdown);
* 1: failure (unreachable server, RPC error, start-up failure; go-plugin mode refused: wrong or
  missing magic cookie, AutoMTLS requested);
* 2: usage or configuration error (the message names the flag, variable or setting, and where
  its value came from), a listener that cannot be bound (a port or unix socket in use) included;
* 3: ``declare``: the server rejected at least one entry; ``serve``: the collector asked for a
  restart (NVML library and kernel driver versions differ, field case F12).

Errors are one line on stderr: ``gpumetrics: <what>: <why>``.

go-plugin mode: when the magic-cookie variable is present, :func:`main` first keeps a duplicate
of the real stdout for the handshake and points fd 1 at stderr, before importing anything that
could print, so nothing but the handshake line ever reaches the host's stdout pipe. A second
duplicate is held until the process exits: go-plugin SIGKILLs the child as soon as its stdout
closes without a handshake (``client.go`` ``Start``), so the pipe must not close before the exit
status is final, or the host would report ``signal: killed`` instead of the status. Errors are
written with an ``[ERROR]`` prefix, which go-plugin logs at ERROR (an unprefixed stderr line is
logged at DEBUG, hidden at the Collector's default level).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = ["main"]

_COOKIE_KEY = "GPUMETRICS_PLUGIN_MAGIC_COOKIE"  # == gpumetrics.service.plugin.COOKIE_KEY (tested)

_held_stdout: list[int] = []
"""The host's stdout pipe, held open until the process exits (see the module docstring)."""


def _reserve_stdout() -> TextIO:
    """Duplicate fd 1 for the handshake and point fd 1 (and ``sys.stdout``) at stderr."""
    saved = os.dup(1)  # os.dup's copies are not inherited by child processes
    if not _held_stdout:
        _held_stdout.append(os.dup(1))  # never closed: the kernel closes it at exit
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

    from gpumetrics.cli.parser import build_parser, parse_args

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parse_args(parser, argv)
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
                args = parse_args(parser, ["serve", *argv])
            return cmd_serve(args, handshake, **sidecar_options)
        from gpumetrics.cli import client, logs

        commands = {
            "pull": client.cmd_pull,
            "pull-logs": logs.cmd_pull_logs,
            "declare": client.cmd_declare,
            "count-gpus": client.cmd_count_gpus,
        }
        return commands[command](args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure ends as one line and an exit code
        return _report(exc, plugin=handshake is not None)


def _print_error(message: str, plugin: bool) -> None:
    prefix = "[ERROR] gpumetrics: " if plugin else "gpumetrics: "
    for line in message.split("\n"):
        print(prefix + line.removeprefix("gpumetrics: "), file=sys.stderr)
    sys.stderr.flush()


def _report(exc: Exception, plugin: bool = False) -> int:
    """Print ``exc`` as one line on stderr and return its exit code (a traceback if unexpected).

    ``plugin``: go-plugin mode, where each line gets the ``[ERROR]`` prefix go-plugin reads.
    """
    from gpumetrics.cli.client import CommandError
    from gpumetrics.service import ListenError

    if isinstance(exc, CommandError):
        _print_error(str(exc), plugin)
        return exc.code
    if isinstance(exc, ListenError):
        _print_error(str(exc), plugin)
        return 2
    if isinstance(exc, BrokenPipeError):  # `gpumetrics pull ... | head`: the reader left
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a killed writer
    import traceback

    traceback.print_exc(file=sys.stderr)
    _print_error(f"internal error: {type(exc).__name__}: {exc}", plugin)
    return 1
