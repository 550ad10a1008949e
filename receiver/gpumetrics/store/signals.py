"""The two OTLP signals a :class:`~gpumetrics.store.BatchStore` holds, and where their items sit.

An OTLP export request nests the same way for every signal (``opentelemetry/proto/collector``):
the request's field 1 is a repeated ``Resource<Signal>`` (its resource and a repeated
``Scope<Signal>``), a ``Scope<Signal>`` holds its scope and a repeated list of *items*. For
metrics an item is a ``Metric``, which holds the data points the store counts; for logs an item
is a ``LogRecord``, counted itself. A :class:`Signal` names those fields, so splitting
(:mod:`gpumetrics.store.split`) and counting are written once for both, and a store parses a
batch only as the request type of its own signal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

__all__ = ["LOGS", "METRICS", "Signal"]


def _metric_points(metric: metrics_pb2.Metric) -> int:
    kind = metric.WhichOneof("data")
    return 0 if kind is None else len(getattr(metric, kind).data_points)


def _halve_metric(metric: metrics_pb2.Metric) -> tuple[Any, Any] | None:
    """Two copies of ``metric`` holding the first and the second half of its data points."""
    kind = metric.WhichOneof("data")
    if kind is None or len(getattr(metric, kind).data_points) < 2:
        return None
    mid = len(getattr(metric, kind).data_points) // 2
    first, second = metrics_pb2.Metric(), metrics_pb2.Metric()
    first.CopyFrom(metric)
    second.CopyFrom(metric)
    del getattr(first, kind).data_points[mid:]
    del getattr(second, kind).data_points[:mid]
    return first, second


@dataclass(frozen=True)
class Signal:
    """Where one signal's items sit in its export request (see the module docstring).

    Attributes:
        name: ``metrics`` or ``logs`` (the ``signal`` attribute of the store's self-telemetry).
        request: the export request message class.
        resources: the request's repeated ``Resource<Signal>`` field (field number 1).
        scopes: a resource entry's repeated ``Scope<Signal>`` field.
        items: a scope entry's repeated item field (``metrics``, ``log_records``).
        unit: what the store counts, in words (``data points``, ``log records``).
        item_count: the counted units in one item (a ``Metric``'s data points; 1 per record).
        halve_item: one item split in two, or None when it cannot be split (a lone data point,
            any log record).

    """

    name: str
    request: type[Any]
    resources: str
    scopes: str
    items: str
    unit: str
    item_count: Callable[[Any], int]
    halve_item: Callable[[Any], tuple[Any, Any] | None]

    def count(self, request: Any) -> int:
        """Return the units (data points, log records) in one export request of this signal."""
        return sum(self.count_resource(r) for r in getattr(request, self.resources))

    def count_resource(self, resource: Any) -> int:
        """Return the units in one ``Resource<Signal>`` entry."""
        n = 0
        for scope in getattr(resource, self.scopes):
            for item in getattr(scope, self.items):
                n += self.item_count(item)
        return n

    def parse(self, data: bytes) -> Any:
        """Parse ``data`` as this signal's export request.

        Raises:
            google.protobuf.message.DecodeError: ``data`` is not one.

        """
        return self.request.FromString(data)


METRICS = Signal(
    name="metrics",
    request=metrics_service_pb2.ExportMetricsServiceRequest,
    resources="resource_metrics",
    scopes="scope_metrics",
    items="metrics",
    unit="data points",
    item_count=_metric_points,
    halve_item=_halve_metric,
)
"""``ExportMetricsServiceRequest``: data points of ``Metric`` items (gauge, sum, histogram, ...)."""

LOGS = Signal(
    name="logs",
    request=logs_service_pb2.ExportLogsServiceRequest,
    resources="resource_logs",
    scopes="scope_logs",
    items="log_records",
    unit="log records",
    item_count=lambda record: 1,
    halve_item=lambda record: None,
)
"""``ExportLogsServiceRequest``: ``LogRecord`` items, each counted once and never split."""
