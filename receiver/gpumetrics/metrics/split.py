"""Splitting an OTLP ``ExportMetricsServiceRequest`` into pieces of a bounded serialized size.

The batch store keeps every batch small enough to be sent in one gRPC message (a Pull answer or a
push ``Export``), so a collection larger than that is split when it is stored, never refused at
send time. A piece is itself a valid ``ExportMetricsServiceRequest``; the pieces, in order, hold
every data point of the original exactly once, in the original order. Splitting happens at the
coarsest level that helps: whole ``ResourceMetrics`` are packed together first; a
``ResourceMetrics`` that alone is too large is halved by its scopes, then a lone scope by its
metrics, then a lone metric by its data points. Every part keeps its resource, scope, schema
URLs and the metric's name, description, unit, metadata, temporality and monotonicity, so a
receiver sees the same series (OTLP allows one resource in several ``ResourceMetrics``).

The only piece that can exceed the bound is one data point whose envelope (resource, scope and
metric header) alone is larger: :func:`split_request` returns it alone, and the caller decides
(the store drops it, counted as ``max_batch_bytes``).
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from gpumetrics.wire import varint

__all__ = ["field_size", "split_request"]

_Request = metrics_service_pb2.ExportMetricsServiceRequest


def field_size(length: int) -> int:
    """Return the size (By) of a length-delimited field numbered 1–15 holding ``length`` bytes."""
    return 1 + len(varint(length)) + length


def _resource_like(rm: metrics_pb2.ResourceMetrics) -> metrics_pb2.ResourceMetrics:
    out = metrics_pb2.ResourceMetrics(schema_url=rm.schema_url)
    out.resource.CopyFrom(rm.resource)
    return out


def _with_scopes(
    rm: metrics_pb2.ResourceMetrics, scopes: Sequence[metrics_pb2.ScopeMetrics]
) -> metrics_pb2.ResourceMetrics:
    out = _resource_like(rm)
    for sm in scopes:
        out.scope_metrics.add().CopyFrom(sm)
    return out


def _with_metrics(
    rm: metrics_pb2.ResourceMetrics,
    sm: metrics_pb2.ScopeMetrics,
    metrics: Sequence[metrics_pb2.Metric],
) -> metrics_pb2.ResourceMetrics:
    out = _resource_like(rm)
    part = out.scope_metrics.add(schema_url=sm.schema_url)
    part.scope.CopyFrom(sm.scope)
    for m in metrics:
        part.metrics.add().CopyFrom(m)
    return out


def _halve(
    rm: metrics_pb2.ResourceMetrics,
) -> tuple[metrics_pb2.ResourceMetrics, metrics_pb2.ResourceMetrics] | None:
    """Two halves of ``rm`` at the coarsest level with two or more items; None if indivisible."""
    scopes = rm.scope_metrics
    if len(scopes) > 1:
        mid = len(scopes) // 2
        return _with_scopes(rm, scopes[:mid]), _with_scopes(rm, scopes[mid:])
    if not scopes:
        return None
    sm = scopes[0]
    if len(sm.metrics) > 1:
        mid = len(sm.metrics) // 2
        return _with_metrics(rm, sm, sm.metrics[:mid]), _with_metrics(rm, sm, sm.metrics[mid:])
    if not sm.metrics:
        return None
    metric = sm.metrics[0]
    kind = metric.WhichOneof("data")
    if kind is None or len(getattr(metric, kind).data_points) < 2:
        return None
    mid = len(getattr(metric, kind).data_points) // 2
    first, second = metrics_pb2.Metric(), metrics_pb2.Metric()
    first.CopyFrom(metric)
    second.CopyFrom(metric)
    del getattr(first, kind).data_points[mid:]
    del getattr(second, kind).data_points[:mid]
    return _with_metrics(rm, sm, [first]), _with_metrics(rm, sm, [second])


def _split_resource(
    rm: metrics_pb2.ResourceMetrics, max_bytes: int
) -> list[metrics_pb2.ResourceMetrics]:
    if field_size(rm.ByteSize()) <= max_bytes:
        return [rm]
    halves = _halve(rm)
    if halves is None:
        return [rm]  # one data point with its envelope: cannot be made smaller
    return [*_split_resource(halves[0], max_bytes), *_split_resource(halves[1], max_bytes)]


def split_request(request: _Request, max_bytes: int) -> list[_Request]:
    """Split ``request`` into requests of at most ``max_bytes`` serialized bytes each.

    Args:
        request: an ``ExportMetricsServiceRequest`` (not modified).
        max_bytes: the bound on each piece's ``ByteSize()`` (By, > 0).

    Returns:
        ``[request]`` itself when it fits; otherwise the pieces in order (see the module
        docstring). A piece larger than ``max_bytes`` holds one indivisible data point.

    Raises:
        ValueError: ``max_bytes`` is not positive.

    """
    if max_bytes <= 0:
        raise ValueError(f"max_bytes: must be > 0, got {max_bytes}")
    if request.ByteSize() <= max_bytes:
        return [request]
    pieces: list[_Request] = []
    current: _Request | None = None
    size = 0
    for rm in request.resource_metrics:
        for part in _split_resource(rm, max_bytes):
            n = field_size(part.ByteSize())
            if current is not None and size + n > max_bytes:
                pieces.append(current)
                current = None
            if current is None:
                current, size = _Request(), 0
            current.resource_metrics.add().CopyFrom(part)
            size += n
    if current is not None:
        pieces.append(current)
    return pieces
