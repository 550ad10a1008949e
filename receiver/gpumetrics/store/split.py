"""Splitting an OTLP export request (metrics or logs) into pieces of a bounded serialized size.

The batch store keeps every batch small enough to be sent in one gRPC message (a Pull answer or a
push ``Export``), so a collection larger than that is split when it is stored, never refused at
send time. A piece is itself a valid export request of the same signal
(:class:`~gpumetrics.store.signals.Signal`); the pieces, in order, hold every data point (metrics)
or log record (logs) of the original exactly once, in the original order.

Splitting happens at the coarsest level that helps: whole ``Resource<Signal>`` entries are packed
together first; an entry that alone is too large is halved by its scopes, then a lone scope by
its items (``Metric``, ``LogRecord``), then a lone metric by its data points. Every part keeps its
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


def _with_items(signal: Signal, entry: Any, scope: Any, items: Sequence[Any]) -> Any:
    out = _like(entry)
    part = getattr(out, signal.scopes).add(schema_url=scope.schema_url)
    part.scope.CopyFrom(scope.scope)
    for item in items:
        getattr(part, signal.items).add().CopyFrom(item)
    return out


def _halve(signal: Signal, entry: Any) -> tuple[Any, Any] | None:
    """Two halves of ``entry`` at the coarsest level with two or more items; None if indivisible.

    Scopes without items are left out first (they hold nothing to keep).
    """
    scopes = [s for s in getattr(entry, signal.scopes) if len(getattr(s, signal.items))]
    if len(scopes) > 1:
        mid = len(scopes) // 2
        return _with_scopes(signal, entry, scopes[:mid]), _with_scopes(signal, entry, scopes[mid:])
    if not scopes:
        return None
    scope = scopes[0]
    items = getattr(scope, signal.items)
    if len(items) > 1:
        mid = len(items) // 2
        return (
            _with_items(signal, entry, scope, items[:mid]),
            _with_items(signal, entry, scope, items[mid:]),
        )
    halves = signal.halve_item(items[0])
    if halves is None:
        return None
    return _with_items(signal, entry, scope, [halves[0]]), _with_items(
        signal, entry, scope, [halves[1]]
    )


def split_entry(entry: Any, max_bytes: int, signal: Signal = METRICS) -> Iterator[Any]:
    """Yield one ``Resource<Signal>`` entry in parts (the module docstring's halving).

    Each part, framed as field 1 of an export request (:func:`field_size`), is at most
    ``max_bytes`` long, unless it holds one indivisible data point or log record. A part
    (or the entry) that holds no point or record is left out.
    """
    if not signal.count_resource(entry):
        return
    if field_size(entry.ByteSize()) <= max_bytes:
        yield entry
        return
    halves = _halve(signal, entry)
    if halves is None:
        yield entry  # one point or record with its envelope: cannot be made smaller
        return
    first, second = halves
    del halves
    yield from split_entry(first, max_bytes, signal)
    del first  # only the half still to split stays held
    yield from split_entry(second, max_bytes, signal)


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
