"""The metric encoder written with the protobuf API, for ``benchmarks/encode_bench.py``.

:func:`encode_metric_api` fills the same ``Metric`` as ``gpumetrics.metrics.encode.encode_metric``
(the benchmark checks that both serialize to the same bytes), with the same attribute cache of
serialized ``NumberDataPoint.attributes`` entries, but sets every other field through the
protobuf API (``data_points.add()``, field assignments) instead of writing wire tags by hand.

``python -m benchmarks.encode_variant ARGS...`` runs the ``gpumetrics`` command line with it in
place of the hand-written encoder (the producer and the self-telemetry use it), so a whole
sidecar can be measured with either.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from gpumetrics.metrics import encode
from gpumetrics.metrics.buffer import Point
from gpumetrics.metrics.spec import MetricSpec, ValueType
from opentelemetry.proto.metrics.v1 import metrics_pb2

_CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE


def encode_metric_api(
    target: metrics_pb2.Metric,
    spec: MetricSpec,
    points: Sequence[Point],
    cache: encode.AttributeCache | None = None,
) -> int:
    """``encode_metric`` through the protobuf API (same arguments, result and errors)."""
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
            attrs = encode._attributes_blob(p.attributes, cache)  # noqa: SLF001 - the same cache
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
        except (encode.EncodingError, ValueError, TypeError) as exc:
            raise encode.EncodingError(f"metric {spec.name!r}: {exc}") from None
    return len(points)


def install() -> None:
    """Make the producer and the self-telemetry encode with :func:`encode_metric_api`."""
    from gpumetrics import selftelemetry
    from gpumetrics.metrics import producer

    encode.encode_metric = encode_metric_api
    producer.encode_metric = encode_metric_api  # type: ignore[attr-defined]
    selftelemetry.encode_metric = encode_metric_api  # type: ignore[attr-defined]


def main() -> int:
    """Run ``gpumetrics ARGS...`` with the protobuf-API encoder installed."""
    install()
    from gpumetrics.cli import main as cli_main

    sys.argv = ["gpumetrics", *sys.argv[1:]]
    return int(cli_main() or 0)


if __name__ == "__main__":
    sys.exit(main())
