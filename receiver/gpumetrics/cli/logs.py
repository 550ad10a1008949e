"""``gpumetrics pull-logs``: one ``PullLogs`` of the GPU events (``gpumetrics.v1.LogsPullService``).

The logs counterpart of ``gpumetrics pull``, with the same flags, deadline, retries and hints
(:mod:`gpumetrics.cli.client`): it prints the ``ExportLogsServiceRequest`` as OTLP/JSON
(``--format json``, the default) or one line per log record (``--format text``), then
acknowledges it unless ``--no-ack``. The log store has its own cursors and epoch, so a consumer
name of ``pull`` and of ``pull-logs`` never share a position. ``--max-records`` caps the log
records of the answer as ``--max-points`` caps a metrics pull's points.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

from gpumetrics.cli.client import (
    EXIT_OK,
    _check_times,
    _pull_waiting,
    _value,
    acknowledge,
    nothing_new,
    open_channel,
    point_time,
)
from gpumetrics.v1 import logs_pull_pb2, logs_pull_pb2_grpc

__all__ = ["cmd_pull_logs", "render_logs_json", "render_logs_text"]


def render_logs_json(request: logs_service_pb2.ExportLogsServiceRequest) -> str:
    """OTLP/JSON of ``request``: protobuf's JSON mapping, camelCase names, enums as integers."""
    return str(json_format.MessageToJson(request, use_integers_for_enums=True, indent=2))


def _record_line(record: Any) -> str:
    """``@HH:MM:SS.mmmZ SEVERITY event body {attributes}`` of one log record.

    The time is the event's (``time_unix_nano``) when set, else when the sidecar observed it
    (``observed_time_unix_nano``; NVML events carry no event time, docs/events.md).
    """
    when = record.time_unix_nano or record.observed_time_unix_nano
    severity = record.severity_text or f"severity {record.severity_number}"
    body = _value(record.body)
    attrs = ", ".join(f"{kv.key}={_value(kv.value)!r}" for kv in record.attributes)
    name = f" {record.event_name}" if record.event_name else ""
    return f"  {point_time(when)} {severity}{name} {body!r} {{{attrs}}}"


def render_logs_text(
    response: logs_pull_pb2.PullLogsResponse, request: logs_service_pb2.ExportLogsServiceRequest
) -> str:
    """Summarise one logs pull for humans: cursor facts, then each resource and its records."""
    lines = [
        f"epoch {response.epoch}  batches {response.first_sequence}..{response.last_sequence}  "
        f"records {response.log_records}  more {str(response.more).lower()}  "
        f"dropped {response.dropped_log_records} (total {response.dropped_log_records_total})"
        + (f" [{', '.join(response.drop_reasons)}]" if response.drop_reasons else "")
    ]
    for rl in request.resource_logs:
        attrs = ", ".join(f"{kv.key}={_value(kv.value)!r}" for kv in rl.resource.attributes)
        lines.append(f"resource {{{attrs}}}")
        for sl in rl.scope_logs:
            lines.extend(_record_line(r) for r in sl.log_records)
    return "\n".join(lines)


def cmd_pull_logs(
    args: argparse.Namespace,
    out: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> int:
    """One ``PullLogs`` from ``args.address``; print it; acknowledge it unless ``--no-ack``.

    Deadlines, ``--wait`` and the empty answer (``{}`` on stdout with ``--format json``, the note
    ``no new batches …`` on stderr) are as for :func:`gpumetrics.cli.client.cmd_pull`.

    Raises:
        CommandError: the call or its acknowledgement failed (UNIMPLEMENTED: a sidecar without
            GPU events, ``events.enabled: false``), or a flag is out of range.

    """
    out = out if out is not None else sys.stdout
    _check_times(args)
    channel, metadata = open_channel(args)
    with channel:
        stub = logs_pull_pb2_grpc.LogsPullServiceStub(channel)  # type: ignore[no-untyped-call]
        request = logs_pull_pb2.PullLogsRequest(
            consumer=args.consumer, max_log_records=args.max_records, max_bytes=args.max_bytes
        )
        response, end = _pull_waiting(
            stub.PullLogs, request, args, metadata, clock, pause, what="pull-logs"
        )
        if not response.last_sequence:
            nothing_new(args, response.epoch, out)
            return EXIT_OK
        otlp = logs_service_pb2.ExportLogsServiceRequest.FromString(
            response.export_logs_service_request
        )
        text = render_logs_json(otlp) if args.format == "json" else render_logs_text(response, otlp)
        print(text, file=out)
        out.flush()
        acknowledge(
            stub.PullLogs, logs_pull_pb2.PullLogsRequest, response, args, metadata,
            end - clock(), "pull-logs",
        )  # fmt: skip
    return EXIT_OK
