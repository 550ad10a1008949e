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
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from functools import cache
from itertools import accumulate, chain, repeat
from operator import itemgetter
from typing import Any

from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from gpumetrics.metrics.columns import MetricColumns, ProcessColumns
from gpumetrics.metrics.encode import EncodingError, encode_attributes
from gpumetrics.metrics.spec import MetricSpec, Scope
from gpumetrics.wire import len_field, varint

__all__ = [
    "MetricHeads",
    "PointHeads",
    "encode_columns",
    "encode_process_metrics",
    "pack_points",
    "len_field",
    "resource_bytes",
    "scope_bytes",
]

_TAG_POINT = b"\x0a"  # Gauge.data_points / Sum.data_points = 1, LEN
_START, _TIME, _DOUBLE, _INT = 0x11, 0x19, 0x21, 0x31  # NumberDataPoint fields 2, 3, 4, 6 (I64)
_BODY = {
    (False, False): struct.Struct("<BqBd"),  # time, as_double
    (False, True): struct.Struct("<BqBq"),  # time, as_int (sfixed64)
    (True, False): struct.Struct("<BqBqBd"),  # start, time, as_double
    (True, True): struct.Struct("<BqBqBq"),  # start, time, as_int
}
_BODY_LEN = {False: 18, True: 27}
_TEMPORALITY_CUMULATIVE = b"\x10" + bytes((metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE,))
_MONOTONIC = b"\x18\x01"


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
    return _TAG_POINT + varint(len(blob) + _BODY_LEN[with_start]) + blob


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
    as_int = mc.values.typecode == "q"
    n = len(mc)
    starts = mc.starts
    with_start = mc.spec.instrument.is_sum or (n > 0 and max(starts) > 0)
    if with_start and not mc.spec.instrument.is_sum and min(starts) == 0:
        return _mixed_points(mc, heads)  # a gauge with start times on some points only
    pack = _BODY[(with_start, as_int)].pack
    value_tag = repeat(_INT if as_int else _DOUBLE, n)
    if with_start:
        bodies = map(
            pack, repeat(_START, n), starts, repeat(_TIME, n), mc.times, value_tag, mc.values
        )
    else:
        bodies = map(pack, repeat(_TIME, n), mc.times, value_tag, mc.values)
    try:
        first = map(heads[with_start].__getitem__, mc.attributes)
        return b"".join(chain.from_iterable(zip(first, bodies, strict=True)))
    except TypeError:  # an unhashable attribute value (a list): encode without the cache
        return _uncached_points(mc, with_start)


def _mixed_points(mc: MetricColumns, heads: tuple[PointHeads, PointHeads]) -> bytes:
    as_int = mc.values.typecode == "q"
    out = []
    for attrs, t, v, s in zip(mc.attributes, mc.times, mc.values, mc.starts, strict=True):
        with_start = s != 0
        try:
            head = heads[with_start][attrs]
        except TypeError:
            head = point_head(attrs, with_start)
        body = _BODY[(with_start, as_int)]
        tag = _INT if as_int else _DOUBLE
        out.append(head)
        out.append(
            body.pack(_START, s, _TIME, t, tag, v) if with_start else body.pack(_TIME, t, tag, v)
        )
    return b"".join(out)


def _uncached_points(mc: MetricColumns, with_start: bool) -> bytes:
    as_int = mc.values.typecode == "q"
    body = _BODY[(with_start, as_int)]
    tag = _INT if as_int else _DOUBLE
    out = []
    for attrs, t, v, s in zip(mc.attributes, mc.times, mc.values, mc.starts, strict=True):
        out.append(point_head(attrs, with_start))
        out.append(
            body.pack(_START, s, _TIME, t, tag, v) if with_start else body.pack(_TIME, t, tag, v)
        )
    return b"".join(out)


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
    spec = mc.spec
    header, trailer = metric_heads.of(spec)
    try:
        data = _points(mc, heads)
    except (EncodingError, ValueError, struct.error) as exc:
        raise EncodingError(f"metric {spec.name!r}: {exc}") from None
    return header + varint(len(data) + len(trailer)) + data + trailer


def pack_points(
    heads: Sequence[bytes],
    head_index: Sequence[int],
    times: Sequence[int],
    values: Sequence[Any],
    starts: Sequence[int] | None,
    as_int: bool,
) -> bytes:
    """Serialize data points from columns: ``heads[head_index[i]]`` and row ``i``'s body.

    Args:
        heads: point heads (:func:`point_head`), built ``with_start`` exactly when ``starts``
            is given.
        head_index: each row's head, as an index into ``heads``.
        times: each row's ``time_unix_nano`` (int64).
        values: each row's value (int64 for ``as_int``, else double).
        starts: each row's ``start_time_unix_nano``, or None for points without one.
        as_int: write ``as_int`` (sfixed64) rather than ``as_double``.

    Returns:
        The data points, in row order, each as a ``data_points`` entry (field 1, LEN).

    """
    n = len(times)
    tag = repeat(_INT if as_int else _DOUBLE, n)
    lengths = {len(h) for h in heads}
    hs = map(heads.__getitem__, head_index)
    if len(lengths) == 1:  # one struct call per point writes the head too
        body = _with_head(lengths.pop(), starts is not None, as_int).pack
        if starts is None:
            return b"".join(map(body, hs, repeat(_TIME, n), times, tag, values))
        return b"".join(
            map(body, hs, repeat(_START, n), starts, repeat(_TIME, n), times, tag, values)
        )
    pack = _BODY[(starts is not None, as_int)].pack
    if starts is None:
        bodies = map(pack, repeat(_TIME, n), times, tag, values)
    else:
        bodies = map(pack, repeat(_START, n), starts, repeat(_TIME, n), times, tag, values)
    return b"".join(chain.from_iterable(zip(hs, bodies, strict=True)))


@cache
def _with_head(head_len: int, with_start: bool, as_int: bool) -> struct.Struct:
    body = _BODY[(with_start, as_int)].format
    assert isinstance(body, str) and body.startswith("<")
    return struct.Struct(f"<{head_len}s{body[1:]}")


def encode_process_metrics(
    columns: Iterable[ProcessColumns],
    metric_heads: MetricHeads,
    heads: tuple[PointHeads, PointHeads],
) -> dict[int, list[tuple[bytes, int]]]:
    """Serialize per-process metrics: pid → its ``Metric`` messages, each with its point count.

    Each :class:`ProcessColumns` is ordered by pid once (a stable sort: a process's points keep
    their order), its points are written in that order in one pass (:func:`pack_points`), and
    each process's run of them becomes one ``Metric``. Metrics are listed in the order of
    ``columns``.

    Raises:
        EncodingError: naming the metric, when an attribute cannot be encoded.

    """
    out: dict[int, list[tuple[bytes, int]]] = {}
    for pc in columns:
        n = len(pc)
        if not n:
            continue
        spec = pc.spec
        try:
            runs = _process_runs(pc, heads)
        except (EncodingError, ValueError, struct.error) as exc:
            raise EncodingError(f"metric {spec.name!r}: {exc}") from None
        header, trailer = metric_heads.of(spec)
        extra = len(trailer)
        for pid, data, count in runs:
            metric = header + varint(len(data) + extra) + data + trailer
            got = out.get(pid)
            if got is None:
                out[pid] = [(metric, count)]
            else:
                got.append((metric, count))
    return out


def _process_runs(
    pc: ProcessColumns, heads: tuple[PointHeads, PointHeads]
) -> list[tuple[int, bytes, int]]:
    """``(pid, data points, count)`` per pid of ``pc``, pids ascending."""
    n = len(pc)
    as_int = pc.values.typecode == "q"
    is_sum = pc.spec.instrument.is_sum
    with_start = is_sum or min(pc.starts) > 0
    if not with_start and max(pc.starts) > 0:  # a gauge with start times on some points only
        return _process_runs_mixed(pc, heads)
    order = sorted(range(n), key=pc.pids.__getitem__)
    if n == 1:
        pick: Any = lambda col: (col[0],)  # noqa: E731 - itemgetter(i) returns no tuple
    else:
        pick = itemgetter(*order)
    pids = pick(pc.pids)
    point_heads = heads[with_start]
    try:
        row_heads = [point_heads[a] for a in pc.attributes]
    except TypeError:  # an unhashable attribute value: encoded without the cache
        row_heads = [point_head(a, with_start) for a in pc.attributes]
    index = pick(pc.attrs_index)
    blob = pack_points(
        row_heads,
        index,
        pick(pc.times),
        pick(pc.values),
        pick(pc.starts) if with_start else None,
        as_int,
    )
    body = _BODY_LEN[with_start]
    lengths = {len(h) for h in row_heads}
    if len(lengths) == 1:
        row = lengths.pop() + body
        offsets: Any = None
    else:
        offsets = [0, *accumulate(len(row_heads[i]) + body for i in index)]
    runs = []
    i = 0
    while i < n:
        pid = pids[i]
        j = bisect_right(pids, pid, i)
        if offsets is None:
            data = blob[i * row : j * row]
        else:
            data = blob[offsets[i] : offsets[j]]
        runs.append((pid, data, j - i))
        i = j
    return runs


def _process_runs_mixed(
    pc: ProcessColumns, heads: tuple[PointHeads, PointHeads]
) -> list[tuple[int, bytes, int]]:
    runs = []
    for pid, mc in sorted(pc.by_pid().items()):
        runs.append((pid, _points(mc, heads), len(mc)))
    return runs


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


def scope_metrics(head: bytes, metrics: Iterable[bytes], tail: bytes) -> bytes:
    """Return one serialized ``ScopeMetrics``: ``head``, each metric as field 2, ``tail``."""
    return head + b"".join(len_field(2, m) for m in metrics) + tail
