"""The metric encoder with hand-written wire tags, for ``benchmarks/encode_bench.py``.

:func:`encode_metric_wire` is the encoder the sidecar used until the measurement in
``benchmarks/encode_bench.py`` showed it no faster than the protobuf API
(``gpumetrics.metrics.encode.encode_metric``, which replaced it): each ``NumberDataPoint`` is
written as wire bytes (the cached attribute entries, fixed64 times, ``as_double`` or sfixed64
``as_int``) and the ``Metric``'s ``gauge`` or ``sum`` is merged in once. The same attribute cache
is used. Kept here so the comparison can be run again.

``python -m benchmarks.encode_variant ARGS...`` runs the ``gpumetrics`` command line with it in
place of the sidecar's encoder (the producer and the self-telemetry use it), so a whole sidecar
can be measured with either.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence

from gpumetrics.metrics import encode
from gpumetrics.metrics.buffer import Point
from gpumetrics.metrics.spec import MetricSpec, ValueType
from gpumetrics.wire import varint
from opentelemetry.proto.metrics.v1 import metrics_pb2

_CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
_PACK_U64 = struct.Struct("<Q").pack
_PACK_I64 = struct.Struct("<q").pack
_PACK_F64 = struct.Struct("<d").pack
# Wire tags (field number << 3 | wire type) of opentelemetry/proto/metrics/v1/metrics.proto.
_TAG_DP_START, _TAG_DP_TIME = b"\x11", b"\x19"  # NumberDataPoint fields 2, 3: fixed64
_TAG_DP_DOUBLE, _TAG_DP_INT = b"\x21", b"\x31"  # fields 4 (double), 6 (sfixed64)
_TAG_DATA_POINT = b"\x0a"  # Gauge/Sum field 1: repeated NumberDataPoint
_SUM_TRAILER = {  # Sum fields 2 (temporality, varint) and 3 (is_monotonic, varint)
    True: b"\x10" + bytes([_CUMULATIVE]) + b"\x18\x01",
    False: b"\x10" + bytes([_CUMULATIVE]),
}
_TAG_GAUGE, _TAG_SUM = b"\x2a", b"\x3a"  # Metric fields 5, 7


def encode_metric_wire(
    target: metrics_pb2.Metric,
    spec: MetricSpec,
    points: Sequence[Point],
    cache: encode.AttributeCache | None = None,
) -> int:
    """``encode_metric`` with hand-written wire bytes (same arguments, result and errors)."""
    pack_value, tag_value = (
        (_PACK_I64, _TAG_DP_INT)
        if spec.value_type is ValueType.INT
        else (_PACK_F64, _TAG_DP_DOUBLE)
    )
    as_int = spec.value_type is ValueType.INT
    entries = []
    for p in points:
        try:
            attrs = encode._attributes_blob(p.attributes, cache)  # noqa: SLF001 - the same cache
            value = pack_value(int(p.value) if as_int else float(p.value))
        except (encode.EncodingError, ValueError, TypeError, struct.error) as exc:
            raise encode.EncodingError(f"metric {spec.name!r}: {exc}") from None
        if p.start_time_unix_nano:
            dp = b"".join(
                (
                    attrs,
                    _TAG_DP_START,
                    _PACK_U64(p.start_time_unix_nano),
                    _TAG_DP_TIME,
                    _PACK_U64(p.time_unix_nano),
                    tag_value,
                    value,
                )
            )
        else:
            dp = b"".join((attrs, _TAG_DP_TIME, _PACK_U64(p.time_unix_nano), tag_value, value))
        entries.append(_TAG_DATA_POINT + varint(len(dp)) + dp)
    if spec.instrument.is_sum:
        entries.append(_SUM_TRAILER[spec.instrument.is_monotonic])
        tag = _TAG_SUM
    else:
        tag = _TAG_GAUGE
    data = b"".join(entries)
    target.name = spec.name
    target.description = spec.description
    target.unit = spec.unit
    target.MergeFromString(tag + varint(len(data)) + data)
    return len(points)


def install() -> None:
    """Make the producer and the self-telemetry encode with :func:`encode_metric_wire`."""
    from gpumetrics import selftelemetry
    from gpumetrics.metrics import producer

    encode.encode_metric = encode_metric_wire
    producer.encode_metric = encode_metric_wire  # type: ignore[attr-defined]
    selftelemetry.encode_metric = encode_metric_wire  # type: ignore[attr-defined]


def main() -> int:
    """Run ``gpumetrics ARGS...`` with the hand-written encoder installed."""
    install()
    from gpumetrics.cli import main as cli_main

    return int(cli_main(sys.argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
