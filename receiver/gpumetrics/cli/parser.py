"""The ``gpumetrics`` argument parser and the map from ``serve`` flags to configuration paths."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any

import gpumetrics
from gpumetrics.service.settings import default_profiler_socket

__all__ = ["SERVE_FLAGS", "CommandParser", "build_parser", "parse_args", "serve_overrides"]

SERVE_FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("--listen", "server.listen", {"metavar": "ADDR", "action": "append",
     "help": "main listener, host:port or unix:/path (repeatable; default 127.0.0.1:4319)"}),
    ("--profiler-listen", "server.profiler_listen", {"metavar": "ADDR", "action": "append",
     "help": "listener of the profiler service (repeatable; default "
             "unix:///run/gpumetrics/profiler.sock as root, else under $XDG_RUNTIME_DIR)"}),
    ("--health-listen", "server.health_listen", {"metavar": "ADDR",
     "help": "plaintext listener for gRPC health only"}),
    ("--pull-token-file", "server.pull_token_file", {"metavar": "FILE",
     "help": "bearer tokens allowed to pull"}),
    ("--declare-token-file", "server.declare_token_file", {"metavar": "FILE",
     "help": "bearer tokens allowed to declare"}),
    ("--tls-cert-file", "server.tls_cert_file", {"metavar": "FILE",
     "help": "server certificate chain (PEM)"}),
    ("--tls-key-file", "server.tls_key_file", {"metavar": "FILE", "help": "server key (PEM)"}),
    ("--tls-client-ca-file", "server.tls_client_ca_file", {"metavar": "FILE",
     "help": "require client certificates signed by these roots (mTLS)"}),
    ("--push-endpoint", "push.endpoint", {"metavar": "ADDR",
     "help": "also push to this OTLP/gRPC collector"}),
    ("--node-name", "identity.node_name", {"metavar": "NAME", "help": "default: uname -n"}),
    ("--proc-root", "identity.proc_root", {"metavar": "DIR", "help": "default /proc"}),
    ("--relabel-config", "identity.relabel_config", {"metavar": "FILE",
     "help": "YAML relabel rules"}),
    ("--identity-mode", "identity.mode", {"choices": ["profiler", "enriched"],
     "help": "per-process resources: profiler (default; equal to the profiler's) or enriched"}),
    ("--include-env-vars", "identity.include_env_vars", {"metavar": "NAMES",
     "type": lambda text: [n.strip() for n in text.split(",") if n.strip()],
     "help": "comma-separated variables reported as process.environment_variable.<NAME> "
             "(the profiler's -env-vars)"}),
    ("--store-path", "store.path", {"metavar": "DIR",
     "help": "keep unacknowledged batches and cursors on disk here (default: memory only)"}),
    ("--batch-interval", "runtime.batch_interval_s", {"metavar": "SECONDS", "type": float,
     "help": "seconds between store batches (default 10)"}),
    ("--collection-interval", "collection.interval_s", {"metavar": "SECONDS", "type": float,
     "help": "NVML sampling interval (default 1)"}),
    ("--plugin-transport", "plugin.transport", {"choices": ["unix", "tcp"],
     "help": "go-plugin listener (default unix)"}),
    ("--log-level", "log.level", {"choices": ["debug", "info", "warn", "error"],
     "help": "default info"}),
    ("--log-format", "log.format", {"choices": ["auto", "json", "text"],
     "help": "default auto (json in plugin mode)"}),
)  # fmt: skip
"""``(flag, dotted config path, argparse options)`` of every ``serve`` flag that sets a setting."""


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that knows its sub-commands' parsers (``commands``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: dict[str, argparse.ArgumentParser] = {}


def parse_args(parser: CommandParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv``; an unknown option prints its command's usage and the closest option.

    argparse (before Python 3.14) reports ``gpumetrics serve --simulte`` with the top-level usage
    and no hint; here it is ``serve``'s usage and ``did you mean --simulate?``. Exits 2, as
    argparse does for every usage error.
    """
    args, extra = parser.parse_known_args(list(argv))
    if not extra:
        return args
    target = parser.commands.get(getattr(args, "command", None) or "", parser)
    unknown = extra[0]
    options = [o for action in target._actions for o in action.option_strings]
    close = difflib.get_close_matches(unknown.split("=", 1)[0], options, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f"; see {target.prog} --help"
    target.print_usage(sys.stderr)
    target.exit(2, f"{target.prog}: error: unrecognized argument {unknown}{hint}\n")


UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1


def _int_in(low: int, high: int, what: str) -> Any:
    """Return an argparse ``type``: an integer in ``low..high``, else a usage error naming the flag.

    argparse words it ``argument --max-points: -1: must be ...`` and exits 2 (docs/configuration.md,
    exit codes). The bounds are the protobuf field's (``uint32``/``uint64``): protobuf would
    otherwise raise ``ValueError: Value out of range`` when the request is built.
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value}: must be {what}")
        return value

    return parse


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def serve_overrides(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    """``{dotted_path: (flag, value)}`` for the ``serve`` flags actually given."""
    out: dict[str, tuple[str, Any]] = {}
    for flag, path, _ in SERVE_FLAGS:
        value = getattr(args, _dest(flag), None)
        if value is not None:
            out[path] = (flag, value)
    if getattr(args, "simulate", None) is not None:
        out["runtime.simulate"] = ("--simulate", args.simulate)
    if getattr(args, "push_insecure", False):
        out["push.insecure"] = ("--push-insecure", True)
    if getattr(args, "allow_insecure_listen", False):
        out["server.allow_insecure_listen"] = ("--allow-insecure-listen", True)
    if getattr(args, "allow_unauthenticated_declare", False):
        out["server.allow_unauthenticated_declare"] = ("--allow-unauthenticated-declare", True)
    return out


def _client_flags(p: argparse.ArgumentParser, default_address: str | None = None) -> None:
    if default_address is None:
        p.add_argument(
            "address", metavar="ADDR", help="sidecar address: host:port, unix:/path or /path"
        )
    else:
        p.add_argument(
            "address",
            metavar="ADDR",
            nargs="?",
            default=default_address,
            help=f"the sidecar's profiler listener: host:port, unix:/path or /path "
            f"(default {default_address}, the sidecar's default for this user)",
        )
    p.add_argument("--token-file", metavar="FILE", help="send the bearer token in FILE")
    p.add_argument("--tls", action="store_true", help="use TLS with the system roots")
    p.add_argument("--ca-file", metavar="FILE", help="use TLS, trusting these roots (PEM)")
    p.add_argument("--cert-file", metavar="FILE", help="client certificate for mTLS (PEM)")
    p.add_argument("--key-file", metavar="FILE", help="client key for mTLS (PEM)")
    p.add_argument("--server-name", metavar="NAME", help="TLS server name to verify")
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="the whole command's deadline (default 10; pull: --wait if longer)",
    )


def _pull_flags(p: argparse.ArgumentParser) -> None:
    """Add the flags ``pull`` and ``pull-logs`` share (each adds its own record cap)."""
    _client_flags(p)
    p.add_argument(
        "--format", choices=["json", "text"], default="json", help="json = OTLP/JSON (default)"
    )
    p.add_argument("--consumer", default="cli", help="consumer name (default cli)")
    p.add_argument("--no-ack", action="store_true", help="do not acknowledge what was pulled")
    p.add_argument(
        "--max-bytes",
        type=_int_in(0, UINT64_MAX, f"0..{UINT64_MAX} (a uint64; 0 = server default)"),
        default=0,
        metavar="N",
        help="cap on bytes (0 = server default)",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep retrying for up to SECONDS while the sidecar is starting or has not produced "
        "its first batch (UNAVAILABLE); default 0 = one attempt",
    )


def build_parser() -> CommandParser:
    """Build the command line: ``serve``, ``pull``, ``pull-logs``, ``declare``, ``count-gpus``."""
    parser = CommandParser(
        prog="gpumetrics",
        description="NVIDIA GPU metrics as OTLP over a gRPC pull endpoint.",
        epilog="Exit codes: 0 ok; 1 failure; 2 usage or configuration error; "
        "3 declare: entries rejected, serve: NVML library/driver mismatch (restart me).",
    )
    parser.add_argument(
        "--version", action="version", version=f"gpumetrics {gpumetrics.__version__}"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the sidecar",
        description="Run the sidecar. "
        "Precedence: flags > GPUMETRICS_* variables > --config file > defaults.",
    )
    serve.add_argument(
        "--config", metavar="FILE", help="YAML configuration file ($GPUMETRICS_CONFIG)"
    )
    serve.add_argument(
        "--simulate",
        nargs="?",
        const="default",
        metavar="PROFILE|FILE",
        help="run on the simulated NVML driver (no argument: the default profile)",
    )
    serve.add_argument("--push-insecure", action="store_true", help="push in plaintext")
    serve.add_argument(
        "--allow-insecure-listen",
        action="store_true",
        help="allow a non-loopback TCP listener without TLS (trusted networks only)",
    )
    serve.add_argument(
        "--allow-unauthenticated-declare",
        action="store_true",
        help="allow the profiler service on TCP without a declare token or mTLS "
        "(anyone who can connect may declare; single-user hosts only)",
    )
    serve.add_argument(
        "--plugin",
        action="store_true",
        help="require go-plugin mode (fails unless started by the go-plugin host)",
    )
    for flag, _, options in SERVE_FLAGS:
        serve.add_argument(flag, **options)

    pull = sub.add_parser(
        "pull",
        help="pull once and print",
        description="Pull once and print "
        "the ExportMetricsServiceRequest; acknowledge it unless --no-ack.",
    )
    _pull_flags(pull)
    pull.add_argument(
        "--max-points",
        type=_int_in(0, UINT32_MAX, f"0..{UINT32_MAX} (a uint32; 0 = server default)"),
        default=0,
        metavar="N",
        help="cap on data points (0 = server default)",
    )
    pull_logs = sub.add_parser(
        "pull-logs",
        help="pull the GPU events (OTLP logs) once and print",
        description="Pull the GPU events once (gpumetrics.v1.LogsPullService) and print the "
        "ExportLogsServiceRequest; acknowledge it unless --no-ack.",
    )
    _pull_flags(pull_logs)
    pull_logs.add_argument(
        "--max-records",
        type=_int_in(0, UINT32_MAX, f"0..{UINT32_MAX} (a uint32; 0 = server default)"),
        default=0,
        metavar="N",
        help="cap on log records (0 = server default)",
    )

    declare = sub.add_parser(
        "declare",
        help="declare one process's identity",
        description="Declare one process to the profiler-integration service.",
    )
    _client_flags(declare, f"unix://{default_profiler_socket()}")
    declare.add_argument(
        "--pid",
        # the wire's bound (uint32); the sidecar rejects, and names, a pid above its pid_max
        type=_int_in(1, UINT32_MAX, f"a process id in 1..{UINT32_MAX} (a uint32)"),
        required=True,
        help="process id",
    )
    declare.add_argument(
        "--start-time-ticks",
        type=_int_in(0, UINT64_MAX, f"0..{UINT64_MAX} (clock ticks since boot, a uint64)"),
        metavar="TICKS",
        help="field 22 of /proc/PID/stat (default: read it)",
    )
    declare.add_argument(
        "--proc-root", default="/proc", metavar="DIR", help="where to read PID's stat"
    )
    declare.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="captured variable (also process.environment_variable.K on the resource)",
    )
    declare.add_argument(
        "--attr",
        action="append",
        default=[],
        metavar="K=V",
        help="another attribute of the process's profile resource (e.g. service.name); the "
        "resource starts with process.pid, and with process.executable.* and container.id "
        "from /proc when --start-time-ticks is not given",
    )
    declare.add_argument(
        "--process-context-file", metavar="FILE", help="serialized OTEP 4719 ProcessContext payload"
    )
    declare.add_argument("--format", choices=["json", "text"], default="text", help="default text")

    count = sub.add_parser("count-gpus", help="count GPUs bound by the NVIDIA driver (no NVML)")
    count.add_argument(
        "--proc-root", default="/proc", metavar="DIR", help="procfs root (default /proc)"
    )
    parser.commands.update(
        {
            "serve": serve,
            "pull": pull,
            "pull-logs": pull_logs,
            "declare": declare,
            "count-gpus": count,
        }
    )
    return parser
