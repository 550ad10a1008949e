"""Encoding of the internal model into OTLP protobuf messages (no I/O).

``encode_metric`` writes one :class:`MetricSpec` and its points into an OTLP ``Metric``;
``encode_attributes`` turns Python attribute values into ``KeyValue`` lists. Shapes follow the
OpenTelemetry metrics data model (https://opentelemetry.io/docs/specs/otel/metrics/data-model/)
and the SDK's default aggregation per instrument
(https://opentelemetry.io/docs/specs/otel/metrics/sdk/#default-aggregation): Gauge →
``Metric.gauge``; UpDownCounter/Counter →
``Metric.sum`` with ``AGGREGATION_TEMPORALITY_CUMULATIVE`` and ``is_monotonic`` set for Counters
only; ``as_int`` for int metrics, ``as_double`` otherwise. The pull servicer and the push client
both send what this module produces.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from gpumetrics.metrics.buffer import Point
from gpumetrics.metrics.spec import MetricSpec, ValueType

AttrValue = Any
"""``str | bool | int | float | bytes | list[AttrValue] | dict[str, AttrValue]``."""

_CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class EncodingError(ValueError):
    """A value that cannot be written to OTLP; the message names the metric or attribute."""


def _utf8(text: str) -> str:
    """Return ``text`` if it encodes as UTF-8; otherwise replace what does not (lone surrogates)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def set_any_value(target: common_pb2.AnyValue, value: AttrValue, key: str = "") -> None:
    """Write a Python value into an OTLP ``AnyValue``.

    ``bool`` → bool_value, ``int`` → int_value (must fit int64), ``float`` → double_value,
    ``str`` → string_value (invalid UTF-8 replaced), ``bytes`` → bytes_value, ``list``/``tuple``
    → array_value, ``dict`` → kvlist_value.

    Raises:
        EncodingError: naming ``key`` for an unsupported type or an int outside int64.

    """
    if isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise EncodingError(f"attribute {key!r}: int {value} outside int64")
        target.int_value = value
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, str):
        target.string_value = _utf8(value)
    elif isinstance(value, (bytes, bytearray)):
        target.bytes_value = bytes(value)
    elif isinstance(value, (list, tuple)):
        arr = target.array_value
        arr.SetInParent()
        for item in value:
            set_any_value(arr.values.add(), item, key)
    elif isinstance(value, Mapping):
        kvl = target.kvlist_value
        kvl.SetInParent()
        encode_attributes(kvl.values, value.items())
    else:
        raise EncodingError(f"attribute {key!r}: unsupported type {type(value).__name__}")


def encode_attributes(target: Any, attributes: Iterable[tuple[str, AttrValue]]) -> None:
    """Append ``KeyValue`` entries for ``attributes`` to the repeated field ``target``.

    Keys must be unique (OTLP requires it); ``None`` values are skipped (never written as empty).

    Raises:
        EncodingError: a duplicate key, an empty key, or an unsupported value.

    """
    seen: set[str] = set()
    for key, value in attributes:
        if value is None:
            continue
        if not key:
            raise EncodingError("attribute with an empty key")
        if key in seen:
            raise EncodingError(f"attribute {key!r}: duplicate key")
        seen.add(key)
        kv = target.add()
        kv.key = _utf8(key)
        set_any_value(kv.value, value, key)


AttributeCache = dict[Any, bytes]
"""Serialized ``NumberDataPoint.attributes`` entries per attribute tuple, shared by the
``encode_metric`` calls of one ``produce`` (points of a device or process repeat the same tuple)."""


def _attributes_blob(attributes: Any, cache: AttributeCache | None) -> bytes:
    """Return the serialized attribute entries (``NumberDataPoint`` field 7), cached by tuple."""
    if cache is not None:
        try:
            return cache[attributes]
        except KeyError:
            pass
        except TypeError:  # an unhashable value (a list): encode without the cache
            cache = None
    holder = metrics_pb2.NumberDataPoint()
    encode_attributes(holder.attributes, attributes)
    blob = holder.SerializeToString()
    if cache is not None:
        cache[attributes] = blob
    return blob


def encode_metric(
    target: metrics_pb2.Metric,
    spec: MetricSpec,
    points: Sequence[Point],
    cache: AttributeCache | None = None,
) -> int:
    """Fill ``target`` (an empty ``Metric``) with ``spec`` and ``points``; return the point count.

    Each distinct attribute tuple is encoded once per ``cache`` (its serialized ``KeyValue``
    entries, merged into every point that has it); the other fields are set through the
    protobuf API. Writing whole data points as wire bytes by hand was measured against this, with
    the same cache: no gain (``benchmarks/encode_bench.py``, docs/performance.md).

    Raises:
        EncodingError: naming the metric, when a point cannot be encoded.

    """
    target.name = spec.name
    target.description = spec.description
    target.unit = spec.unit
    if spec.instrument.is_sum:
        data = target.sum
        data.aggregation_temporality = _CUMULATIVE
        data.is_monotonic = spec.instrument.is_monotonic
    else:
        data = target.gauge
    data.SetInParent()
    as_int = spec.value_type is ValueType.INT
    add = data.data_points.add
    for p in points:
        try:
            attrs = _attributes_blob(p.attributes, cache)
            dp = add()
            if attrs:
                dp.MergeFromString(attrs)
            if p.start_time_unix_nano:
                dp.start_time_unix_nano = p.start_time_unix_nano
            dp.time_unix_nano = p.time_unix_nano
            if as_int:
                dp.as_int = int(p.value)
            else:
                dp.as_double = float(p.value)
        except (EncodingError, ValueError, TypeError) as exc:
            raise EncodingError(f"metric {spec.name!r}: {exc}") from None
    return len(points)


def count_points(request: Any) -> int:
    """Count the data points (all metric kinds) in an ``ExportMetricsServiceRequest``."""
    n = 0
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                if kind is not None:
                    n += len(getattr(m, kind).data_points)
    return n
