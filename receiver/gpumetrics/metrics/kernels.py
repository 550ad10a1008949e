"""The inner loops of the bulk OTLP encoder, in pure Python (the reference implementation).

:mod:`gpumetrics.metrics.bulk` calls these two functions, or their compiled twins in
``gpumetrics.metrics._wire`` (``_wire.c``, built when a C compiler is present at install time),
which return the same values; the tests compare the two (``tests/unit/test_kernels.py``).
Pure Python here means C-level iteration only where it can: ``struct`` packing driven by
``map``, ``itemgetter`` gathers, one ``join``; about 0.5-1 µs per data point, against tens of
nanoseconds compiled (docs/performance.md).

Data point layout (opentelemetry-proto ``NumberDataPoint``; protobuf "Encoding" guide,
https://protobuf.dev/programming-guides/encoding/): a head (``0x0a``, the point's length, its
serialized attributes: field 7), then ``start_time_unix_nano`` (field 2, ``0x11`` fixed64) when
the point has one, ``time_unix_nano`` (field 3, ``0x19`` fixed64) and ``as_int`` (field 6,
``0x31`` sfixed64) or ``as_double`` (field 4, ``0x21`` double), all little-endian.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Sequence
from functools import cache
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

from gpumetrics.wire import varint

__all__ = ["frame_resources", "order_runs", "pack_points"]

START_TAG, TIME_TAG, DOUBLE_TAG, INT_TAG = 0x11, 0x19, 0x21, 0x31
_BODY = {
    (False, False): struct.Struct("<BqBd"),  # time, as_double
    (False, True): struct.Struct("<BqBq"),  # time, as_int (sfixed64)
    (True, False): struct.Struct("<BqBqBd"),  # start, time, as_double
    (True, True): struct.Struct("<BqBqBq"),  # start, time, as_int
}
BODY_LEN = {False: 18, True: 27}
"""Bytes after a point's head, without and with a start time."""


@cache
def _with_head(head_len: int, with_start: bool, as_int: bool) -> struct.Struct:
    body = _BODY[(with_start, as_int)].format
    return struct.Struct(f"<{head_len}s{body[1:]}")


def _gather(order: Sequence[int] | None, column: Sequence[Any]) -> Sequence[Any]:
    if order is None:
        return column
    if len(order) == 1:
        return (column[order[0]],)
    return itemgetter(*order)(column)  # type: ignore[no-any-return]


def pack_points(
    heads: list[bytes],
    head_index: Sequence[int] | None,
    times: Sequence[int],
    values: Sequence[Any],
    starts: Sequence[int] | None,
    as_int: bool,
    order: Sequence[int] | None = None,
) -> bytes:
    """Serialize data points from columns, one per row (see the module docstring).

    Args:
        heads: point heads (``bulk.point_head``), built with a start time exactly when
            ``starts`` is given.
        head_index: each row's head as an index into ``heads`` (``array('I')``), or None when
            ``heads`` holds one head per row.
        times: each row's ``time_unix_nano`` (int64).
        values: each row's value (int64 for ``as_int``, else double).
        starts: each row's ``start_time_unix_nano`` (int64), or None for points without one.
        as_int: write ``as_int`` rather than ``as_double``.
        order: the rows to write, in this order (row indexes); None: every row in order.

    Returns:
        The data points, each a ``data_points`` entry (field 1, LEN), concatenated.

    Raises:
        IndexError: a row or head index out of range.
        struct.error: a value that does not fit its field.

    """
    if order is not None and len(order) == 0:
        return b""
    rows = _gather(order, range(len(times)))
    if head_index is None:
        hs: Any = map(heads.__getitem__, rows)
    else:
        hs = map(heads.__getitem__, _gather(order, head_index))
    times = _gather(order, times)
    values = _gather(order, values)
    if starts is not None:
        starts = _gather(order, starts)
    n = len(times)
    tag = repeat(INT_TAG if as_int else DOUBLE_TAG, n)
    lengths = {len(h) for h in heads}
    with_start = starts is not None
    if len(lengths) == 1:  # one struct call per point writes the head too
        body = _with_head(lengths.pop(), with_start, as_int).pack
        if starts is None:
            return b"".join(map(body, hs, repeat(TIME_TAG, n), times, tag, values))
        start_tags, time_tags = repeat(START_TAG, n), repeat(TIME_TAG, n)
        return b"".join(map(body, hs, start_tags, starts, time_tags, times, tag, values))
    pack = _BODY[(with_start, as_int)].pack
    if starts is None:
        bodies = map(pack, repeat(TIME_TAG, n), times, tag, values)
    else:
        bodies = map(pack, repeat(START_TAG, n), starts, repeat(TIME_TAG, n), times, tag, values)
    return b"".join(chain.from_iterable(zip(hs, bodies, strict=True)))


def order_runs(keys: Sequence[int]) -> tuple[Sequence[int], list[tuple[int, int, int]]]:
    """Order rows by key, stably, and find each key's run.

    Returns:
        ``(order, runs)``: the row indexes that sort ``keys`` ascending (rows with equal keys
        keep their order), and ``(key, start, end)`` per distinct key, ascending, with
        positions in ``order``.

    """
    n = len(keys)
    order = sorted(range(n), key=keys.__getitem__)
    ordered = _gather(order, keys) if n else ()
    runs = []
    i = 0
    while i < n:
        key = ordered[i]
        j = bisect_right(ordered, key, i)
        runs.append((key, i, j))
        i = j
    return order, runs


Run = tuple[int, int, int, int]
"""``(pid, start, end, points)``: a process's data points in a metric's buffer, by byte range."""


def frame_resources(
    first: list[bytes] | None,
    first_points: int,
    pids: list[int],
    resources: list[bytes],
    scope_head: bytes,
    scope_tail: bytes,
    metrics: list[tuple[bytes, bytes, bytes, list[Run]]],
    budget: int,
) -> tuple[list[tuple[bytes, int]], list[tuple[int, int]]]:
    """Frame one ``ResourceMetrics`` per process, each a request of its own, within a budget.

    Args:
        first: the first ``resource_metrics`` field (the host's, serialized with its tag) as
            the list of its pieces, written in order (never joined on their own), or None.
        first_points: the data points in ``first``.
        pids: the processes to write, ascending.
        resources: each pid's ``resource`` field (serialized with its tag), followed by any
            other field of its ``ResourceMetrics`` that is not a scope (``schema_url``).
        scope_head: a ``ScopeMetrics``' bytes before its metrics (its ``scope``).
        scope_tail: a ``ScopeMetrics``' bytes after its metrics (its ``schema_url``).
        metrics: per metric ``(header, trailer, blob, runs)``: the ``Metric``'s bytes before
            and after its data (``bulk.MetricHeads``), the buffer of every process's data
            points, and each process's run in it, by pid ascending (pids without a resource,
            dropped by relabeling, are skipped).
        budget: the most bytes of all parts together (By), 0 for no limit. ``first`` is always
            kept; then each process in pid order when its part fits what is left (first fit:
            a later, smaller one may still fit).

    Returns:
        ``(parts, dropped)``: ``(request bytes, points)`` per resource kept, ``first`` first,
        each one serialized ``ExportMetricsServiceRequest`` holding one ``resource_metrics``
        entry; and ``(pid, points)`` per process left out for the budget.

    """
    parts: list[tuple[bytes, int]] = []
    dropped: list[tuple[int, int]] = []
    used = 0
    if first:
        head = b"".join(first)
        if head:
            parts.append((head, first_points))
            used = len(head)
    cursors = [0] * len(metrics)
    for pid, resource in zip(pids, resources, strict=True):
        body: list[bytes] = []
        points = 0
        for k, (header, trailer, blob, runs) in enumerate(metrics):
            i = cursors[k]
            while i < len(runs) and runs[i][0] < pid:
                i += 1  # a pid without a resource (dropped by relabeling)
            if i < len(runs) and runs[i][0] == pid:
                _, start, end, count = runs[i]
                data = blob[start:end]
                metric = header + varint(len(data) + len(trailer)) + data + trailer
                body.append(b"\x12" + varint(len(metric)) + metric)
                points += count
                i += 1
            cursors[k] = i
        scope = scope_head + b"".join(body) + scope_tail
        rm = resource + b"\x12" + varint(len(scope)) + scope
        entry = b"\x0a" + varint(len(rm)) + rm
        if budget > 0 and used + len(entry) > budget:
            dropped.append((pid, points))
            continue
        parts.append((entry, points))
        used += len(entry)
    return parts, dropped
