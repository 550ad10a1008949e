"""Reading the file exporter's OTLP/JSON lines and flattening them into comparable points.

The file exporter (``format: json``) writes one ``ExportMetricsServiceRequest`` per line in
protobuf's JSON mapping (https://protobuf.dev/programming-guides/json/; the contrib file
exporter's README); each line is parsed with
``google.protobuf.json_format`` so a field the mapping does not know fails the test.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

Hashable = object
Attrs = tuple[tuple[str, Hashable], ...]


def read_requests(path: Path) -> list[ExportMetricsServiceRequest]:
    """Every complete line of ``path`` parsed as an ExportMetricsServiceRequest (a last line
    still being written, without its newline, is left for the next read). Missing file: []."""
    return _read(path, ExportMetricsServiceRequest)


def read_log_requests(path: Path) -> list[ExportLogsServiceRequest]:
    """Every complete line of ``path`` (the logs pipeline's file) as an ExportLogsServiceRequest."""
    return _read(path, ExportLogsServiceRequest)


M = TypeVar("M", bound=Message)


def _read(path: Path, message: type[M]) -> list[M]:
    return JsonlFollower(path, message).new()


class JsonlFollower(Generic[M]):
    """The requests of a file exporter's file, read as it grows: each :meth:`new` call parses
    only the complete lines written since the previous one (a long test never parses a line
    twice)."""

    def __init__(self, path: Path, message: type[M]) -> None:
        self.path, self.message = path, message
        self._offset = 0
        self._line = 0

    def new(self) -> list[M]:
        """The requests of the complete lines added since the last call (missing file: [])."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1  # the part after the last newline is incomplete
        self._offset += end
        requests = []
        for line in chunk[:end].decode().split("\n")[:-1]:
            self._line += 1
            if not line.strip():
                continue
            request = self.message()
            try:
                json_format.Parse(line, request)
            except json_format.ParseError as e:
                raise AssertionError(f"{self.path}:{self._line}: not OTLP/JSON: {e}") from e
            requests.append(request)
        return requests


def any_value(value: AnyValue) -> Hashable:
    """An OTLP AnyValue as a hashable Python value (lists and maps become tuples)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(any_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return attrs(value.kvlist_value.values)
    return getattr(value, kind)


def attrs(kvs: Iterable[KeyValue]) -> Attrs:
    """Attributes as a sorted tuple of (key, value) pairs."""
    return tuple(sorted((kv.key, any_value(kv.value)) for kv in kvs))


@dataclass(frozen=True)
class FlatPoint:
    """One data point with everything that identifies it.

    ``value`` is the number (``as_int``/``as_double``), or the count for histogram-like points.
    Times are ns since the Unix epoch. ``request`` is the line index in the file.
    """

    resource: Attrs
    scope: str
    metric: str
    attributes: Attrs
    time_unix_nano: int
    start_time_unix_nano: int
    value: Hashable
    request: int

    @property
    def key(self) -> tuple[Attrs, str, str, Attrs, int]:
        """What must never repeat: the same series at the same time is a duplicated point."""
        return (self.resource, self.scope, self.metric, self.attributes, self.time_unix_nano)

    def resource_attr(self, key: str) -> Hashable:
        """A resource attribute's value, or None."""
        return dict(self.resource).get(key)

    def attr(self, key: str) -> Hashable:
        """A point attribute's value, or None."""
        return dict(self.attributes).get(key)


def flatten(requests: Iterable[ExportMetricsServiceRequest]) -> list[FlatPoint]:
    """Every data point of every request, in order."""
    points = []
    for index, request in enumerate(requests):
        for rm in request.resource_metrics:
            resource = attrs(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    if kind is None:
                        continue
                    for dp in getattr(metric, kind).data_points:
                        if kind in ("gauge", "sum"):
                            value = getattr(dp, dp.WhichOneof("value") or "as_int")
                        else:
                            value = dp.count
                        points.append(
                            FlatPoint(
                                resource,
                                sm.scope.name,
                                metric.name,
                                attrs(dp.attributes),
                                dp.time_unix_nano,
                                dp.start_time_unix_nano,
                                value,
                                index,
                            )
                        )
    return points


def duplicates(points: Iterable[FlatPoint]) -> dict[tuple[object, ...], int]:
    """Keys seen more than once, with their counts."""
    counts = Counter(p.key for p in points)
    return {k: n for k, n in counts.items() if n > 1}


def process_resources(requests: Iterable[ExportMetricsServiceRequest]) -> list[dict[str, AnyValue]]:
    """The raw attributes of every per-process resource (one with ``process.pid``), in order."""
    found = []
    for request in requests:
        for rm in request.resource_metrics:
            raw = {kv.key: kv.value for kv in rm.resource.attributes}
            if "process.pid" in raw:
                found.append(raw)
    return found


@dataclass(frozen=True)
class FlatRecord:
    """One log record with its resource and scope (attributes as a dict of plain values)."""

    resource: dict[str, Hashable]
    scope: str
    event_name: str
    severity_text: str
    severity_number: int
    body: str
    attributes: dict[str, Hashable]
    time_unix_nano: int
    observed_time_unix_nano: int
    request: int


def record_key(r: FlatRecord) -> tuple[object, ...]:
    """What identifies one log record (its observed time is the sidecar's receipt, in ns)."""
    return (
        tuple(sorted(r.resource.items())),
        r.scope,
        r.event_name,
        r.body,
        tuple(sorted(r.attributes.items())),
        r.time_unix_nano,
        r.observed_time_unix_nano,
    )


def flatten_logs(requests: Iterable[ExportLogsServiceRequest]) -> list[FlatRecord]:
    """Every log record of every request, in order."""
    records = []
    for index, request in enumerate(requests):
        for rl in request.resource_logs:
            resource = dict(attrs(rl.resource.attributes))
            for sl in rl.scope_logs:
                for r in sl.log_records:
                    records.append(
                        FlatRecord(
                            resource,
                            sl.scope.name,
                            r.event_name,
                            r.severity_text,
                            r.severity_number,
                            r.body.string_value,
                            dict(attrs(r.attributes)),
                            r.time_unix_nano,
                            r.observed_time_unix_nano,
                            index,
                        )
                    )
    return records
