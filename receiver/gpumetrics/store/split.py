"""Splitting an OTLP export request (metrics or logs) into pieces of a bounded serialized size.

The batch store keeps every batch small enough to be sent in one gRPC message (a Pull answer or a
push ``Export``), so a collection larger than that is split when it is stored, never refused at
send time. A piece is itself a valid export request of the same signal
(:class:`~gpumetrics.store.signals.Signal`); the pieces, in order, hold every data point (metrics)
or log record (logs) of the original exactly once, in the original order.

Splitting happens at the coarsest level that helps: whole ``Resource<Signal>`` entries are packed
together first; an entry that alone is too large is split by its scopes (packed while they
fit), a scope that alone is too large by its items (``Metric``, ``LogRecord``, packed likewise),
and a metric that alone is too large is halved by its data points. Every part keeps its
resource, scope and schema URLs, and a metric keeps its name, description, unit, metadata,
temporality and monotonicity, so a receiver sees the same series (OTLP allows one resource, or
one scope, in several entries). What holds nothing is left out of the pieces of a request that
has to be split: a resource entry, a scope or a metric without any point or record. This is the
nesting opentelemetry-python's OTLP metric exporters keep, pruning empty containers, when they
split by count (``_split_metrics_data`` in ``opentelemetry-exporter-otlp-proto-grpc`` and
``-http``), applied here by size and to logs as well.

The only piece that can exceed the bound is one data point or one log record whose envelope
(resource, scope, and for a point its metric header) alone is larger: it is yielded alone, and
the caller decides (the store drops it, counted as ``max_batch_bytes``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from gpumetrics.store.signals import METRICS, Signal
from gpumetrics.wire import varint

__all__ = ["field_size", "split_entry", "split_request"]


def field_size(length: int) -> int:
    """Return the size (By) of a length-delimited field numbered 1–15 holding ``length`` bytes."""
    return 1 + len(varint(length)) + length


def _like(entry: Any) -> Any:
    """Return an empty copy of a ``Resource<Signal>`` entry: its resource and schema URL."""
    out = type(entry)(schema_url=entry.schema_url)
    out.resource.CopyFrom(entry.resource)
    return out


def _with_scopes(signal: Signal, entry: Any, scopes: Sequence[Any]) -> Any:
    out = _like(entry)
    for scope in scopes:
        getattr(out, signal.scopes).add().CopyFrom(scope)
    return out


def _scope_like(scope: Any) -> Any:
    out = type(scope)(schema_url=scope.schema_url)
    out.scope.CopyFrom(scope.scope)
    return out


def _with_items(signal: Signal, entry: Any, scope: Any, items: Sequence[Any]) -> Any:
    out = _like(entry)
    part = getattr(out, signal.scopes).add()
    part.CopyFrom(_scope_like(scope))
    for item in items:
        getattr(part, signal.items).add().CopyFrom(item)
    return out


def _units(signal: Signal, scope: Any) -> int:
    return sum(signal.item_count(item) for item in getattr(scope, signal.items))


def split_entry(entry: Any, max_bytes: int, signal: Signal = METRICS) -> Iterator[Any]:
    """Yield one ``Resource<Signal>`` entry in parts of at most ``max_bytes`` when framed.

    Each part, framed as field 1 of an export request (:func:`field_size`), is at most
    ``max_bytes`` long, unless it holds one indivisible data point or log record. Whole scopes
    are packed into a part while they fit, then a scope's items, then (metrics) a metric's data
    points are halved; sizes are measured, never estimated. Each part is built when the
    previous one has been taken, so splitting holds one part besides ``entry``. A part (or the
    entry) that holds no point or record is left out.
    """
    if not signal.count_resource(entry):
        return
    if field_size(entry.ByteSize()) <= max_bytes:
        yield entry
        return
    base = _like(entry).ByteSize()
    group: list[Any] = []
    body = base
    for scope in getattr(entry, signal.scopes):
        if not _units(signal, scope):
            continue
        n = field_size(scope.ByteSize())
        if group and field_size(body + n) > max_bytes:
            yield _with_scopes(signal, entry, group)
            group, body = [], base
        if field_size(base + n) <= max_bytes:
            group.append(scope)
            body += n
        else:
            yield from _split_scope(signal, entry, scope, base, max_bytes)
    if group:
        yield _with_scopes(signal, entry, group)


def _split_scope(
    signal: Signal, entry: Any, scope: Any, base: int, max_bytes: int
) -> Iterator[Any]:
    """Parts of ``entry`` holding ``scope``'s items, packed while they fit."""
    head = _scope_like(scope).ByteSize()

    def fits(scope_body: int) -> bool:
        return field_size(base + field_size(scope_body)) <= max_bytes

    group: list[Any] = []
    body = head
    for item in getattr(scope, signal.items):
        if not signal.item_count(item):
            continue
        n = field_size(item.ByteSize())
        if group and not fits(body + n):
            yield _with_items(signal, entry, scope, group)
            group, body = [], head
        if fits(head + n):
            group.append(item)
            body += n
        else:
            yield from _split_item(signal, entry, scope, item, max_bytes)
    if group:
        yield _with_items(signal, entry, scope, group)


def _split_item(signal: Signal, entry: Any, scope: Any, item: Any, max_bytes: int) -> Iterator[Any]:
    """Parts of ``entry`` holding one item too large for a part: a metric halved by its points."""
    halves = signal.halve_item(item)
    if halves is None:
        yield _with_items(signal, entry, scope, [item])  # indivisible: one point or record
        return
    for half in halves:
        part = _with_items(signal, entry, scope, [half])
        if field_size(part.ByteSize()) <= max_bytes:
            yield part
        else:
            del part
            yield from _split_item(signal, entry, scope, half, max_bytes)


def split_request(request: Any, max_bytes: int, signal: Signal = METRICS) -> Iterator[Any]:
    """Yield ``request`` in pieces of at most ``max_bytes`` serialized bytes each.

    Args:
        request: an export request of ``signal`` (not modified).
        max_bytes: the bound on each piece's ``ByteSize()`` (By, > 0).
        signal: :data:`~gpumetrics.store.signals.METRICS` (default) or
            :data:`~gpumetrics.store.signals.LOGS`.

    Yields:
        ``request`` itself when it fits; otherwise the pieces in order (see the module
        docstring), each built when the previous one has been taken. A piece larger than
        ``max_bytes`` holds one indivisible data point or log record.

    Raises:
        ValueError: ``max_bytes`` is not positive (when the first piece is asked for).

    """
    if max_bytes <= 0:
        raise ValueError(f"max_bytes: must be > 0, got {max_bytes}")
    if request.ByteSize() <= max_bytes:
        yield request
        return
    current: Any = None
    size = 0
    for entry in getattr(request, signal.resources):
        for part in split_entry(entry, max_bytes, signal):
            n = field_size(part.ByteSize())
            if current is not None and size + n > max_bytes:
                yield current
                current = None
            if current is None:
                current, size = signal.request(), 0
            getattr(current, signal.resources).add().CopyFrom(part)
            size += n
    if current is not None:
        yield current
