"""OTLP metrics encoded in bulk from columns: serialized bytes written by hand, no I/O.

What this module writes is an ``ExportMetricsServiceRequest`` (opentelemetry-proto,
https://github.com/open-telemetry/opentelemetry-proto/blob/main/opentelemetry/proto/collector/metrics/v1/metrics_service.proto)
as protobuf wire bytes ("Encoding" guide, https://protobuf.dev/programming-guides/encoding/),
built from
:class:`~gpumetrics.metrics.columns.MetricColumns` without one protobuf object per data point:

- what never changes is serialized once and cached: a metric's header (``name``,
  ``description``, ``unit``, the ``Gauge``/``Sum`` tag, temporality and monotonicity, per
  :class:`MetricSpec`; shapes as in :mod:`gpumetrics.metrics.encode`), a point attribute
  tuple's ``KeyValue`` entries with the data point's tag and length (:class:`PointHeads`),
  resources and scopes;
- per data point only its time, value and start time are written, by one ``struct`` call per
  point made from C (``map``), and the pieces are joined once per metric.

Fields inside a data point are written attributes first (then ``start_time_unix_nano``,
``time_unix_nano``, ``as_double``/``as_int``): protobuf parsers accept fields in any order
("Field Order" in the encoding guide), so the message decodes to exactly what
:func:`gpumetrics.metrics.encode.encode_metric` writes through the protobuf API; the tests
check that on every golden scenario (``tests/nvml/test_bulk_encode.py``).

Attribute values and resources are still encoded through the protobuf API
(:func:`~gpumetrics.metrics.encode.encode_attributes`), once per distinct tuple, so keys and
values are written by one set of rules (invalid UTF-8 replaced, ``None`` left out, duplicate
or empty keys refused with :class:`~gpumetrics.metrics.encode.EncodingError`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from itertools import accumulate
from typing import Any

from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from gpumetrics.metrics import kernels
from gpumetrics.metrics.columns import MetricColumns, ProcessColumns
from gpumetrics.metrics.encode import EncodingError, encode_attributes
from gpumetrics.metrics.spec import MetricSpec, Scope
from gpumetrics.wire import len_field, varint

__all__ = [
    "KERNELS",
    "MetricHeads",
    "PointHeads",
    "encode_columns",
    "ProcessMetric",
    "encode_process_metrics",
    "metric_pieces",
    "scope_pieces",
    "frame_resources",
    "kernels_in_use",
    "use_kernels",
    "resource_bytes",
    "scope_bytes",
]

try:  # the compiled kernels (_wire.c), built at install time when a C compiler is present
    from gpumetrics.metrics import _wire as _compiled  # type: ignore[attr-defined]
except ImportError:  # no compiler at install time: the pure-Python kernels, the same bytes
    _compiled = None

_kernels: Any = _compiled if _compiled is not None else kernels
_TAG_POINT = b"\x0a"  # Gauge.data_points / Sum.data_points = 1, LEN
_TEMPORALITY_CUMULATIVE = b"\x10" + bytes((metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE,))
_MONOTONIC = b"\x18\x01"


KERNELS = ("compiled", "python")
"""The implementations of the inner loops: ``_wire.c`` (when it was built) and :mod:`.kernels`."""


def kernels_in_use() -> str:
    """Return which kernels encode: ``compiled`` or ``python``."""
    return "compiled" if _kernels is _compiled else "python"


def use_kernels(which: str) -> str:
    """Encode with the ``compiled`` or the ``python`` kernels (``auto``: compiled if built).

    For tests and benchmarks, which compare the two; both give the same bytes. Returns the
    kernels now in use.

    Raises:
        ValueError: ``which`` is not one of ``auto``, ``compiled``, ``python``, or the
            compiled kernels were not built.

    """
    global _kernels
    if which == "python" or (which == "auto" and _compiled is None):
        _kernels = kernels
    elif which in ("compiled", "auto"):
        if _compiled is None:
            raise ValueError(
                "kernels: the compiled kernels (gpumetrics.metrics._wire) are not built"
            )
        _kernels = _compiled
    else:
        raise ValueError(f"kernels: {which!r} is not auto, compiled or python")
    return kernels_in_use()


class PointHeads(dict[Any, bytes]):
    """Attribute tuple → the bytes that open a data point with those attributes.

    ``0x0a``, the point's length, then its serialized ``attributes`` entries (field 7): the same
    bytes for every point with this tuple, so they are written once per :class:`PointHeads`
    (one per batch), whatever the number of points. Keys are attribute tuples (hashable);
    ``with_start`` says whether the points carry ``start_time_unix_nano``.
    """

    __slots__ = ("with_start",)

    def __init__(self, with_start: bool) -> None:
        super().__init__()
        self.with_start = with_start

    def __missing__(self, attributes: Any) -> bytes:
        head = point_head(attributes, self.with_start)
        self[attributes] = head
        return head


def point_head(attributes: Any, with_start: bool) -> bytes:
    """Return the bytes that open a data point with ``attributes`` (see :class:`PointHeads`).

    Raises:
        EncodingError: an attribute that cannot be encoded (duplicate or empty key, a value
            of an unsupported type, an int outside int64).

    """
    holder = metrics_pb2.NumberDataPoint()
    encode_attributes(holder.attributes, attributes)
    blob = holder.SerializeToString()
    return _TAG_POINT + varint(len(blob) + kernels.BODY_LEN[with_start]) + blob


class MetricHeads(dict[str, tuple[bytes, bytes]]):
    """Metric name → ``(header, trailer)``: a ``Metric``'s bytes around its data points.

    The header holds ``name``, ``description`` and ``unit`` (empty strings are left out, as
    proto3 serializes them) and the ``Gauge`` (field 5) or ``Sum`` (field 7) tag; the trailer
    the ``Sum``'s cumulative temporality and, for Counters, ``is_monotonic``.
    """

    __slots__ = ()

    def of(self, spec: MetricSpec) -> tuple[bytes, bytes]:
        """Return the header and trailer of ``spec``'s metric (built on first use)."""
        got = self.get(spec.name)
        if got is None:
            got = self[spec.name] = _metric_head(spec)
        return got


def _metric_head(spec: MetricSpec) -> tuple[bytes, bytes]:
    m = metrics_pb2.Metric(name=spec.name, description=spec.description, unit=spec.unit)
    if spec.instrument.is_sum:
        tag = b"\x3a"
        trailer = _TEMPORALITY_CUMULATIVE + (_MONOTONIC if spec.instrument.is_monotonic else b"")
    else:
        tag = b"\x2a"
        trailer = b""
    return m.SerializeToString() + tag, trailer


def _points(mc: MetricColumns, heads: tuple[PointHeads, PointHeads]) -> bytes:
    """Serialize the data points of ``mc`` (field 1 entries of its ``Gauge``/``Sum``)."""
    n = len(mc)
    starts = mc.starts
    with_start = mc.spec.instrument.is_sum or (n > 0 and max(starts) > 0)
    if with_start and not mc.spec.instrument.is_sum and min(starts) == 0:
        return _mixed_points(mc, heads)  # a gauge with start times on some points only
    try:
        row_heads = list(map(heads[with_start].__getitem__, mc.attributes))
    except TypeError:  # an unhashable attribute value (a list): encode without the cache
        row_heads = [point_head(a, with_start) for a in mc.attributes]
    as_int = mc.values.typecode == "q"
    return _kernels.pack_points(
        row_heads, None, mc.times, mc.values, starts if with_start else None, as_int, None
    )


def _mixed_points(mc: MetricColumns, heads: tuple[PointHeads, PointHeads]) -> bytes:
    as_int = mc.values.typecode == "q"
    out = []
    for attrs, t, v, s in zip(mc.attributes, mc.times, mc.values, mc.starts, strict=True):
        with_start = s != 0
        try:
            head = heads[with_start][attrs]
        except TypeError:
            head = point_head(attrs, with_start)
        out.append(
            kernels.pack_points([head], None, (t,), (v,), (s,) if with_start else None, as_int)
        )
    return b"".join(out)


def metric_pieces(
    mc: MetricColumns, metric_heads: MetricHeads, heads: tuple[PointHeads, PointHeads]
) -> list[bytes]:
    """Return one serialized ``Metric`` (see :func:`encode_columns`) as its pieces, unjoined.

    A batch's messages are joined once, into the request (``kernels.frame_resources``): a large
    message joined at every level of nesting would be copied, and its new pages faulted in, as
    many times.

    Raises:
        EncodingError: naming the metric, when an attribute cannot be encoded.

    """
    spec = mc.spec
    header, trailer = metric_heads.of(spec)
    try:
        data = _points(mc, heads)
    except (EncodingError, ValueError, struct.error) as exc:
        raise EncodingError(f"metric {spec.name!r}: {exc}") from None
    return [header, varint(len(data) + len(trailer)), data, trailer]


def scope_pieces(scope: tuple[bytes, bytes], metrics: list[list[bytes]]) -> list[bytes]:
    """Return one ``ScopeMetrics`` as pieces.

    Its scope, each of ``metrics`` (the pieces of one ``Metric``) as field 2, its schema URL.
    """
    head, tail = scope
    out = [head]
    for m in metrics:
        out.append(b"\x12" + varint(sum(map(len, m))))
        out.extend(m)
    out.append(tail)
    return out


def encode_columns(
    mc: MetricColumns, metric_heads: MetricHeads, heads: tuple[PointHeads, PointHeads]
) -> bytes:
    """Return one serialized ``Metric`` holding every point of ``mc`` (in their order).

    Args:
        mc: the points of one metric for one resource (checked by ``columns.check``).
        metric_heads: the batch's metric headers.
        heads: the batch's point heads without and with start times (``PointHeads(False)``,
            ``PointHeads(True)``).

    Raises:
        EncodingError: naming the metric, when an attribute cannot be encoded.

    """
    return b"".join(metric_pieces(mc, metric_heads, heads))


ProcessMetric = tuple[bytes, bytes, bytes, list[tuple[int, int, int, int]]]
"""One per-process metric, encoded: ``(header, trailer, data points, runs)``.

``header`` and ``trailer`` are the ``Metric``'s bytes around its data points
(:class:`MetricHeads`), ``data points`` one buffer of every process's points ordered by pid, and
``runs`` one ``(pid, start, end, points)`` per process, by pid ascending: its points are
``data points[start:end]``. ``frame_resources`` (the kernels) writes them as each process's
``Metric``.
"""


def encode_process_metrics(
    columns: Iterable[ProcessColumns],
    metric_heads: MetricHeads,
    heads: tuple[PointHeads, PointHeads],
) -> list[ProcessMetric]:
    """Serialize per-process metrics, one :data:`ProcessMetric` per :class:`ProcessColumns`.

    Each :class:`ProcessColumns` is ordered by pid once (a stable sort: a process's points keep
    their order) and its points are written in that order in one pass (the kernels'
    ``pack_points``).

    Raises:
        EncodingError: naming the metric, when an attribute cannot be encoded.

    """
    out: list[ProcessMetric] = []
    for pc in columns:
        if not len(pc):
            continue
        spec = pc.spec
        try:
            blob, runs = _process_runs(pc, heads)
        except (EncodingError, ValueError, struct.error) as exc:
            raise EncodingError(f"metric {spec.name!r}: {exc}") from None
        header, trailer = metric_heads.of(spec)
        out.append((header, trailer, blob, runs))
    return out


def frame_resources(
    first: list[bytes] | None,
    first_points: int,
    pids: list[int],
    resources: list[bytes],
    scope: tuple[bytes, bytes],
    metrics: list[ProcessMetric],
    budget: int,
) -> tuple[list[tuple[bytes, int]], list[tuple[int, int]]]:
    """Write one ``ResourceMetrics`` per pid, each a request of its own, within ``budget``.

    See ``kernels.frame_resources`` (the kernels'): ``scope`` is ``(head, tail)`` of the
    processes' ``ScopeMetrics`` (:func:`scope_bytes`). Returns ``(parts, dropped)``: the
    ``(request bytes, points)`` of ``first`` and of each process that fits, and
    ``(pid, points)`` of each process left out for the budget (0: none).
    """
    head, tail = scope
    return _kernels.frame_resources(  # type: ignore[no-any-return]
        first, first_points, pids, resources, head, tail, metrics, budget
    )


def _process_runs(
    pc: ProcessColumns, heads: tuple[PointHeads, PointHeads]
) -> tuple[bytes, list[tuple[int, int, int, int]]]:
    """Return ``pc``'s data points ordered by pid and ``(pid, start, end, points)`` per pid."""
    as_int = pc.values.typecode == "q"
    with_start = pc.spec.instrument.is_sum or min(pc.starts) > 0
    if not with_start and max(pc.starts) > 0:  # a gauge with start times on some points only
        return _process_runs_mixed(pc, heads)
    order, runs = _order_runs(pc.pids)
    point_heads = heads[with_start]
    try:
        row_heads = [point_heads[a] for a in pc.attributes]
    except TypeError:  # an unhashable attribute value: encoded without the cache
        row_heads = [point_head(a, with_start) for a in pc.attributes]
    starts = pc.starts if with_start else None
    blob = _kernels.pack_points(
        row_heads, pc.attrs_index, pc.times, pc.values, starts, as_int, order
    )
    body = kernels.BODY_LEN[with_start]
    lengths = {len(h) for h in row_heads}
    if len(lengths) == 1:  # every point the same size: a run's bytes by arithmetic
        row = lengths.pop() + body
        return blob, [(pid, i * row, j * row, j - i) for pid, i, j in runs]
    sizes = [len(h) + body for h in row_heads]
    index = pc.attrs_index
    offsets = [0, *accumulate(sizes[index[r]] for r in order)]
    return blob, [(pid, offsets[i], offsets[j], j - i) for pid, i, j in runs]


def _order_runs(keys: Any) -> tuple[Any, list[tuple[int, int, int]]]:
    order, runs = _kernels.order_runs(keys)
    if isinstance(order, bytes):  # the compiled kernel's native int64 row indexes
        order = memoryview(order).cast("q")
    return order, runs


def _process_runs_mixed(
    pc: ProcessColumns, heads: tuple[PointHeads, PointHeads]
) -> tuple[bytes, list[tuple[int, int, int, int]]]:
    parts, runs, at = [], [], 0
    for pid, mc in sorted(pc.by_pid().items()):
        data = _points(mc, heads)
        parts.append(data)
        runs.append((pid, at, at + len(data), len(mc)))
        at += len(data)
    return b"".join(parts), runs


def scope_bytes(scope: Scope) -> tuple[bytes, bytes]:
    """Return a ``ScopeMetrics``' bytes before and after its metrics, for ``scope``.

    The first part is ``scope`` (an ``InstrumentationScope`` with the name), the second the
    ``schema_url`` (empty when the scope has none).
    """
    head = len_field(1, len_field(1, scope.name.encode()) if scope.name else b"")
    tail = len_field(3, scope.schema_url.encode()) if scope.schema_url else b""
    return head, tail


def resource_bytes(attributes: Iterable[tuple[str, Any]]) -> bytes:
    """Return the ``resource`` field of a ``ResourceMetrics`` with ``attributes`` (b"" if none).

    Raises:
        EncodingError: an attribute that cannot be encoded.

    """
    res = resource_pb2.Resource()
    encode_attributes(res.attributes, attributes)
    if not len(res.attributes):
        return b""
    return len_field(1, res.SerializeToString())
