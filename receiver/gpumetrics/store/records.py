"""What a :class:`~gpumetrics.store.BatchStore` holds: its batches and its consumers' records.

Kept apart from the store's logic so that the durable copy (:mod:`gpumetrics.store.state`,
:mod:`gpumetrics.store.journal`) reads and writes the same records the store keeps in memory.
"""

from __future__ import annotations

__all__ = ["Batch", "Consumer"]


class Batch:
    """One stored batch.

    Attributes:
        seq: its sequence in the store's epoch (1, 2, 3...).
        data: one serialized export request of the store's signal (at most ``max_batch_bytes``).
        points: the units it holds (data points, log records).
        t: when it was appended, on the store's monotonic clock (s); ages are measured from it.

    """

    __slots__ = ("seq", "data", "points", "t")

    def __init__(self, seq: int, data: bytes, points: int, t: float) -> None:
        self.seq, self.data, self.points, self.t = seq, data, points, t


class Consumer:
    """One registered consumer's cursor and accounting (``ConsumerStats`` gives the meanings).

    Attributes:
        name: the consumer name.
        base: the cursor it was registered with (the oldest batch held, minus one).
        acked: its cursor, the highest sequence acknowledged (or dropped before it was).
        delivered: the end of the contiguous run of batches it was sent.
        acked_points, dropped_total: units acknowledged while held; units dropped for it.
        pending_dropped, pending_reasons: the drop report its next pull carries.
        last_seen: its last pull, on the store's monotonic clock (s); never persisted.
        points_before_base: units appended before it registered (for ``offered_points``).

    """

    __slots__ = (
        "name",
        "base",
        "acked",
        "delivered",
        "acked_points",
        "dropped_total",
        "pending_dropped",
        "pending_reasons",
        "last_seen",
        "points_before_base",
    )

    def __init__(self, name: str, base: int, now: float, points_before_base: int) -> None:
        self.name = name
        self.base = self.acked = self.delivered = base
        self.acked_points = self.dropped_total = self.pending_dropped = 0
        self.pending_reasons: dict[str, None] = {}
        self.last_seen = now
        self.points_before_base = points_before_base
