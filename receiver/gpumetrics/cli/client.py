"""Client side of the CLI: ``pull``, ``declare`` and ``count-gpus``.

Each command returns an exit code (see :mod:`gpumetrics.cli`) and raises :class:`CommandError`
for a failure the user should read as one line on stderr.

Addresses are ``host:port``, ``[v6addr]:port``, ``unix:/path`` (``unix:///path``) or ``/path``;
anything else is a usage error (exit 2): grpc would read ``localhost`` as ``localhost:443``.
Loopback and unix targets are dialled without an HTTP proxy (grpc honours ``http_proxy`` and
``https_proxy`` for every target, so a proxy set for the network would carry a node-local pull).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import ipaddress
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from gpumetrics.identity.attrs import AttrValue, to_key_values
from gpumetrics.identity.modes import ENV_VAR_PREFIX, profiler_resource
from gpumetrics.identity.procfs import ProcfsReader, parse_stat
from gpumetrics.metrics import CountNVIDIAGPUs
from gpumetrics.v1 import profiler_pb2, profiler_pb2_grpc, pull_pb2, pull_pb2_grpc

__all__ = [
    "EXIT_OK",
    "EXIT_FAILURE",
    "EXIT_REJECTED",
    "CommandError",
    "acknowledge",
    "cmd_count_gpus",
    "cmd_declare",
    "cmd_pull",
    "open_channel",
    "parse_pairs",
    "render_json",
    "render_text",
]

EXIT_OK = 0
"""Success."""
EXIT_FAILURE = 1
"""The command failed (unreachable server, RPC error, unreadable file)."""
EXIT_REJECTED = 3
"""``declare``: the server answered, but rejected at least one entry."""


class CommandError(Exception):
    """A failure reported as one line on stderr with exit code ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


def _read(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CommandError(f"{what} {path}: {exc.strerror or exc}") from None


_ADDRESS_FORMS = "host:port (e.g. 127.0.0.1:4319), [v6addr]:port, unix:/path or /path"


def target_of(address: str) -> str:
    """Return the gRPC target for ``address`` (see the module docstring for the forms).

    >>> target_of("/run/gpumetrics.sock")
    'unix:/run/gpumetrics.sock'
    >>> target_of("127.0.0.1:4319")
    '127.0.0.1:4319'

    Raises:
        CommandError: (exit 2) any other form, e.g. a host without a port, naming the forms.

    """
    if address.startswith("/"):
        return "unix:" + address
    if address.startswith("unix:"):
        if not address.removeprefix("unix:").lstrip("/"):
            raise CommandError(f"ADDR {address!r}: unix: needs a socket path", 2)
        return address
    host, sep, port = address.rpartition(":")
    if address.startswith("[") and "]:" not in address:
        sep = ""  # [v6addr] without a port
    elif ":" in host and not host.startswith("["):
        raise CommandError(
            f"ADDR {address!r}: write an IPv6 address in brackets, e.g. [::1]:4319", 2
        )
    if not sep or not host:
        raise CommandError(f"ADDR {address!r}: no port; expected {_ADDRESS_FORMS}", 2)
    if not port.isdigit() or not 0 < int(port) <= 65535:
        raise CommandError(f"ADDR {address!r}: port must be 1..65535; expected {_ADDRESS_FORMS}", 2)
    return address


def _is_local(target: str) -> bool:
    if target.startswith("unix:"):
        return True
    host = target.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_RECONNECT_BACKOFF_MS = 250
"""First reconnection wait (grpc's default is 1 s, growing to 120 s): ``--wait`` notices a
sidecar that starts listening within a fraction of a second."""


def channel_options(target: str) -> list[tuple[str, Any]]:
    """Return the options of the CLI's channel to ``target`` (see the module docstring).

    >>> ("grpc.enable_http_proxy", 0) in channel_options("127.0.0.1:4319")
    True
    >>> ("grpc.enable_http_proxy", 0) in channel_options("gpu-node-7:4319")
    False
    """
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", -1),
        ("grpc.initial_reconnect_backoff_ms", _RECONNECT_BACKOFF_MS),
        ("grpc.min_reconnect_backoff_ms", _RECONNECT_BACKOFF_MS),
        ("grpc.max_reconnect_backoff_ms", 4 * _RECONNECT_BACKOFF_MS),
    ]
    if _is_local(target):
        options.append(("grpc.enable_http_proxy", 0))
    return options


def open_channel(args: argparse.Namespace) -> tuple[grpc.Channel, tuple[tuple[str, str], ...]]:
    """Open the channel for ``args.address`` with the TLS flags; return it and the call metadata.

    TLS is used when ``--tls``, ``--ca-file`` or ``--cert-file`` is given; ``--token-file``
    adds ``authorization: Bearer <token>``.

    Raises:
        CommandError: unreadable certificate or token file, an incomplete client key pair, or an
            address of no known form (exit 2).

    """
    target = target_of(args.address)
    options = channel_options(target)
    if bool(args.cert_file) != bool(args.key_file):
        raise CommandError("--cert-file and --key-file must be given together", 2)
    if args.tls or args.ca_file or args.cert_file:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(args.ca_file, "--ca-file"),
            private_key=_read(args.key_file, "--key-file"),
            certificate_chain=_read(args.cert_file, "--cert-file"),
        )
        if args.server_name:
            options.append(("grpc.ssl_target_name_override", args.server_name))
        channel = grpc.secure_channel(target, creds, options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    metadata: tuple[tuple[str, str], ...] = ()
    token = _read(args.token_file, "--token-file")
    if token is not None:
        text = token.decode("utf-8", "replace").strip()
        if not text:
            raise CommandError(f"--token-file {args.token_file}: the file is empty")
        metadata = (("authorization", f"Bearer {text}"),)
    return channel, metadata


def _rpc_error(what: str, address: str, err: grpc.RpcError, hint: str = "") -> CommandError:
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    name = code.name if code is not None else "ERROR"
    details = details.removesuffix(": OK")  # grpc's status text of the handshake, not a result
    return CommandError(f"{what} {address}: {name}: {details}{hint}")


def render_json(request: metrics_service_pb2.ExportMetricsServiceRequest) -> str:
    """OTLP/JSON of ``request``: protobuf's JSON mapping, camelCase names, enums as integers."""
    return str(json_format.MessageToJson(request, use_integers_for_enums=True, indent=2))


def _value(any_value: common_pb2.AnyValue) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


_TEXT_POINTS = 8
"""Points shown per metric by ``--format text`` (the JSON format shows everything)."""


_NAMED_DEVICE_KEYS = frozenset(
    {"hw.id", "hw.parent", "hw.serial_number", "hw.model", "hw.firmware_version"}
)
"""Device attributes left out of a text line when ``hw.name`` already tells devices apart."""


def _point_label(point: Any, varying: Sequence[str]) -> str:
    attrs = {kv.key: _value(kv.value) for kv in point.attributes}
    shown = ", ".join(f"{k}={attrs[k]}" for k in varying if k in attrs)
    return f"{{{shown}}}" if shown else ""


def point_time(time_unix_nano: int) -> str:
    """``@HH:MM:SS.mmmZ`` (UTC) of a point's ``time_unix_nano``, as ``--format text`` shows it.

    >>> point_time(1_767_225_600_250_000_000)
    '@00:00:00.250Z'
    """
    when = _dt.datetime.fromtimestamp(time_unix_nano // 10**9, tz=_dt.UTC)  # no float rounding
    return "@" + when.strftime("%H:%M:%S.") + f"{time_unix_nano // 10**6 % 1000:03d}Z"


def render_text(response: pull_pb2.PullResponse, request: Any) -> str:
    """Summarise one pull for humans: cursor facts, then each resource and its metrics.

    Each metric line gives its kind, unit and number of points, then the first points as
    ``value{attributes}@time``, showing only the attributes whose values differ between the
    metric's points (for example ``hw.id`` and ``hw.state``) and the point's time (UTC, ms), so
    several samples of one GPU in one pull read as samples, not duplicates.
    """
    lines = [
        f"epoch {response.epoch}  batches {response.first_sequence}..{response.last_sequence}  "
        f"points {response.data_points}  more {str(response.more).lower()}  "
        f"dropped {response.dropped_data_points} (total {response.dropped_data_points_total})"
        + (f" [{', '.join(response.drop_reasons)}]" if response.drop_reasons else "")
    ]
    for rm in request.resource_metrics:
        attrs = ", ".join(f"{kv.key}={_value(kv.value)!r}" for kv in rm.resource.attributes)
        lines.append(f"resource {{{attrs}}}")
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                points = list(getattr(metric, kind).data_points) if kind else []
                seen: dict[str, set[str]] = {}
                for p in points:
                    for kv in p.attributes:
                        seen.setdefault(kv.key, set()).add(repr(_value(kv.value)))
                varying = [k for k, values in seen.items() if len(values) > 1]
                if "hw.name" in varying:  # gpu0, gpu1, ...: enough to tell devices apart
                    varying = [k for k in varying if k not in _NAMED_DEVICE_KEYS]
                shown = ", ".join(
                    f"{(p.as_double if p.HasField('as_double') else p.as_int):g}"
                    + _point_label(p, varying)
                    + point_time(p.time_unix_nano)
                    for p in points[:_TEXT_POINTS]
                )
                more = (
                    f", … ({len(points) - _TEXT_POINTS} more)" if len(points) > _TEXT_POINTS else ""
                )
                lines.append(
                    f"  {metric.name} [{sm.scope.name}] {kind}, unit {metric.unit or '-'}, "
                    f"{len(points)} point(s): {shown}{more}"
                )
    return "\n".join(lines)


_RETRY_PAUSE_S = 0.25
"""Pause between two attempts while ``--wait`` lasts."""
_MIN_ACK_S = 1.0
"""The acknowledgement's deadline when the pull used (nearly) all of the command's time."""


def _check_times(args: argparse.Namespace) -> None:
    # float() accepts nan and inf: a deadline of either is none (worded like the configuration's
    # finite_number error, gpumetrics.settingsbase)
    wait = getattr(args, "wait", 0.0)
    for flag, value in (("--timeout", args.timeout), ("--wait", wait)):
        if not math.isfinite(value):
            raise CommandError(f"{flag} {value:g}: must be a finite number of seconds", 2)
    if not args.timeout > 0:
        raise CommandError(f"--timeout {args.timeout:g}: must be more than 0 seconds", 2)
    if not wait >= 0:
        raise CommandError(f"--wait {wait:g}: must be 0 or more seconds", 2)


_NOTHING_LISTENS = ("Connection refused", "No such file or directory")
"""How grpc's UNAVAILABLE details end when nothing listens (TCP, unix socket): not a TLS failure."""


_TLS_FAILED = ("handshake failed", "ssl_error", "certificate_verify_failed", "verification check")
"""Parts of grpc's UNAVAILABLE details (lower-cased) when a TLS handshake failed: permanent."""


def _uses_tls(args: argparse.Namespace) -> bool:
    return bool(args.tls or args.ca_file or args.cert_file)


def _tls_failed(err: grpc.RpcError) -> bool:
    details = str(err.details() or "").lower()
    return err.code() == grpc.StatusCode.UNAVAILABLE and any(s in details for s in _TLS_FAILED)


def _tls_hint(err: grpc.RpcError, args: argparse.Namespace) -> str:
    """Return a next step for the usual TLS mismatches (grpc's text names none), or ""."""
    details = str(err.details() or "")
    if err.code() != grpc.StatusCode.UNAVAILABLE:
        return ""
    if not _uses_tls(args) and "Socket closed" in details:
        return (
            "; if the sidecar serves TLS (server.tls_cert_file), add --tls, or --ca-file FILE"
            " for a private CA"
        )
    if "WRONG_VERSION_NUMBER" in details:
        return "; the sidecar answered without TLS: leave out --tls/--ca-file/--cert-file"
    if "Hostname Verification Check failed" in details:
        return (
            "; the server's certificate does not name the address you dialled: pass"
            " --server-name NAME, a name in its subjectAltName"
        )
    if _tls_failed(err):
        return (
            "; TLS failed: does the sidecar serve TLS (server.tls_cert_file), and does"
            " --ca-file hold the CA that signed its certificate?"
        )
    return ""


def _hint(err: grpc.RpcError, args: argparse.Namespace, budget_s: float) -> str:
    code = err.code()
    details = str(err.details() or "")
    tls = _tls_hint(err, args)
    if tls:
        return tls
    if code == grpc.StatusCode.UNAVAILABLE and any(s in details for s in _NOTHING_LISTENS):
        if args.wait > 0:
            return f"; nothing answered within --wait {args.wait:g} s: is the sidecar running?"
        return "; is the sidecar running? (`--wait N` waits for it)"
    if code == grpc.StatusCode.UNAVAILABLE and "no collection" in details and args.wait <= 0:
        return " (the sidecar is starting: `--wait N` waits for its first collection)"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"; no answer within {budget_s:g} s (--timeout, --wait)"
    return ""


def _pull_waiting(
    call: Callable[..., Any],
    request: Any,
    args: argparse.Namespace,
    metadata: Any,
    clock: Callable[[], float],
    pause: Callable[[float], None],
    what: str = "pull",
) -> tuple[Any, float]:
    """Call ``Pull`` or ``PullLogs`` once within the deadline, retrying UNAVAILABLE.

    ``call`` is the stub's method, ``what`` names the command in errors.

    The deadline is ``max(--timeout, --wait)`` seconds from now and bounds every attempt
    together: each attempt gets what is left of it. UNAVAILABLE (nothing listens yet, or no
    collection is stored yet) is retried every 0.25 s until ``--wait`` seconds have passed; a
    connection that is refused fails an attempt at once (grpc's calls are fail-fast), so without
    ``--wait`` the command fails at once too.

    Returns:
        The response and the deadline (``clock()`` seconds) it was pulled under.

    Raises:
        CommandError: the RPC failed, with a hint for the usual causes.

    """
    start = clock()
    budget = max(args.timeout, args.wait)
    end, retry_until = start + budget, start + max(0.0, args.wait)
    while True:
        try:
            response = call(request, timeout=max(end - clock(), 0.0), metadata=metadata)
            return response, end
        except grpc.RpcError as err:
            retry = err.code() == grpc.StatusCode.UNAVAILABLE and not _tls_failed(err)
            if not retry or clock() + _RETRY_PAUSE_S >= min(retry_until, end):
                raise _rpc_error(what, args.address, err, _hint(err, args, budget)) from None
        pause(_RETRY_PAUSE_S)


def cmd_pull(
    args: argparse.Namespace,
    out: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> int:
    """One pull from ``args.address``; print it; acknowledge it unless ``--no-ack``.

    ``--timeout`` and ``--wait`` bound the whole command (:func:`_pull_waiting`); the
    acknowledgement gets what is left, at least 1 s. An empty answer prints ``no new batches``
    (with ``--format json``: on stderr, and stdout gets ``{}``, the JSON of an empty
    ``ExportMetricsServiceRequest``, so a script always reads one JSON document). ``clock`` and
    ``pause`` are injectable for tests.
    """
    out = out if out is not None else sys.stdout
    _check_times(args)
    channel, metadata = open_channel(args)
    with channel:
        stub = pull_pb2_grpc.MetricsPullServiceStub(channel)  # type: ignore[no-untyped-call]
        request = pull_pb2.PullRequest(
            consumer=args.consumer, max_data_points=args.max_points, max_bytes=args.max_bytes
        )
        response, end = _pull_waiting(stub.Pull, request, args, metadata, clock, pause)
        if not response.last_sequence:
            nothing_new(args, response.epoch, out)
            return EXIT_OK
        otlp = metrics_service_pb2.ExportMetricsServiceRequest.FromString(
            response.export_metrics_service_request
        )
        print(render_json(otlp) if args.format == "json" else render_text(response, otlp), file=out)
        out.flush()
        acknowledge(
            stub.Pull, pull_pb2.PullRequest, response, args, metadata, end - clock(), "pull"
        )
    return EXIT_OK


def acknowledge(
    call: Callable[..., Any],
    request_type: Callable[..., Any],
    response: Any,
    args: argparse.Namespace,
    metadata: Any,
    left_s: float,
    what: str,
) -> None:
    """Acknowledge ``response`` (a pull answer) unless ``--no-ack``.

    The acknowledgement is an ``ack_only`` request of ``request_type`` (``PullRequest``,
    ``PullLogsRequest``) sent on ``call``; it gets ``left_s`` of the deadline, at least 1 s.

    Raises:
        CommandError: the acknowledgement failed (named ``acknowledging the <what> from``).

    """
    if args.no_ack:
        return
    ack = request_type(
        consumer=args.consumer,
        ack_sequence=response.last_sequence,
        ack_epoch=response.epoch,
        ack_only=True,
    )
    try:
        call(ack, timeout=max(left_s, _MIN_ACK_S), metadata=metadata)
    except grpc.RpcError as err:
        raise _rpc_error(f"acknowledging the {what} from", args.address, err) from None


def nothing_new(args: argparse.Namespace, epoch: str, out: TextIO) -> None:
    """Report an empty answer: ``no new batches …`` on ``out`` (``--format text``).

    With ``--format json``, ``out`` gets ``{}`` (the JSON of an empty OTLP request, so stdout is
    always one JSON document) and the note goes to stderr.
    """
    note = f"no new batches for consumer {args.consumer!r} (epoch {epoch})"
    if args.format == "text":
        print(note, file=out)
        return
    print("{}", file=out)
    out.flush()
    print(note, file=sys.stderr)


def parse_pairs(items: Sequence[str], flag: str) -> list[tuple[str, str]]:
    """Split ``K=V`` items on the first ``=``.

    Raises:
        CommandError: (exit 2) an item without ``=`` or with an empty key, naming the flag.

    """
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"{flag} {item!r}: expected KEY=VALUE", 2)
        pairs.append((key, value))
    return pairs


def start_time_ticks(pid: int, proc_root: str) -> int:
    """Field 22 of ``<proc_root>/<pid>/stat`` (clock ticks since boot).

    Raises:
        CommandError: the file is unreadable or malformed.

    """
    path = os.path.join(proc_root, str(pid), "stat")
    data = _read(path, "--start-time-ticks not given and cannot read")
    stat = parse_stat((data or b"").decode("utf-8", "replace"))
    if stat is None:
        raise CommandError(f"{path}: malformed stat line; pass --start-time-ticks")
    return stat.start_time_ticks


def build_declaration(args: argparse.Namespace) -> profiler_pb2.ProcessDeclaration:
    """Build the ``ProcessDeclaration`` the ``declare`` flags describe, as a profiler would.

    Its ``profiler_resource`` is shaped like the OpenTelemetry eBPF profiler's resource for the
    process: ``process.pid`` (int); when the start time is read from ``/proc`` (no
    ``--start-time-ticks``), ``process.executable.*`` and ``container.id`` by the profiler's
    rules; ``process.environment_variable.<NAME>`` for each ``--env`` (which is also sent as
    the declaration's ``environment``); then each ``--attr`` (strings; e.g. an APM agent's
    ``service.name``).
    """
    ticks = args.start_time_ticks
    info = None
    if ticks is None:
        ticks = start_time_ticks(args.pid, args.proc_root)
        procfs = ProcfsReader(args.proc_root, host_pid_namespace=True, resolve_user_names=False)
        info = procfs.read(args.pid)
    decl = profiler_pb2.ProcessDeclaration(pid=args.pid, start_time_ticks=ticks)
    values: dict[str, AttrValue] = dict(profiler_resource(args.pid, info))
    for key, value in parse_pairs(args.env, "--env"):
        decl.environment.add(name=key, value=value.encode("utf-8"))
        values[ENV_VAR_PREFIX + key] = value
    values.update(parse_pairs(args.attr, "--attr"))
    resource = resource_pb2.Resource()
    to_key_values(resource.attributes, values)
    decl.profiler_resource = resource.SerializeToString()
    context = _read(args.process_context_file, "--process-context-file")
    if context is not None:
        decl.process_context = context
    return decl


def cmd_declare(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Declare one process; print what was accepted and each rejection; exit 3 on rejections."""
    out = out if out is not None else sys.stdout
    if args.pid <= 0:
        raise CommandError(f"--pid {args.pid}: must be a positive process id", 2)
    _check_times(args)
    request = profiler_pb2.DeclareProcessesRequest(processes=[build_declaration(args)])
    channel, metadata = open_channel(args)
    with channel:
        stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            response = stub.DeclareProcesses(request, timeout=args.timeout, metadata=metadata)
        except grpc.RpcError as err:
            raise _rpc_error("declare to", args.address, err, _tls_hint(err, args)) from None
    if args.format == "json":
        print(json.dumps(json_format.MessageToDict(response), indent=2), file=out)
    else:
        print(f"accepted {response.accepted}", file=out)
        for r in response.rejected:
            print(f"rejected pid {r.pid}: {r.field}: {r.reason}", file=out)
    return EXIT_REJECTED if response.rejected else EXIT_OK


def cmd_count_gpus(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Print the number of GPUs the NVIDIA kernel driver bound (``CountNVIDIAGPUs``)."""
    out = out if out is not None else sys.stdout
    try:
        print(CountNVIDIAGPUs(args.proc_root), file=out)
    except OSError as exc:
        raise CommandError(f"--proc-root {args.proc_root}: {exc.strerror or exc}") from None
    return EXIT_OK
