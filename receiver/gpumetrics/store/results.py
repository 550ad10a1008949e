"""Values the :class:`~gpumetrics.store.BatchStore` accepts and returns: names, errors, results."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_CONSUMER = "default"
"""The consumer name used when a pull names none (``PullRequest.consumer == ""``)."""

CONSUMER_NAME_RE = re.compile(r"[A-Za-z0-9._:/-]{1,128}")
"""Allowed consumer names (``pull.proto``): 1 to 128 bytes of ``[A-Za-z0-9._:/-]``."""

DROP_REASONS = (
    "max_age",
    "max_data_points",
    "max_bytes",
    "max_batch_bytes",
    "max_collection_bytes",
    "split_error",
)
"""Why points (or log records) are dropped: named after the limit that forced them out (the
:class:`StoreLimits` fields; ``max_batch_bytes``, a point whose envelope alone exceeds the batch
size; ``max_collection_bytes``, left out of a collection over the producer's budget), or
``split_error``, an oversized batch that failed to be split (a defect, logged)."""


class TooManyConsumersError(Exception):
    """A new consumer would exceed ``StoreLimits.max_consumers`` (gRPC: RESOURCE_EXHAUSTED)."""


@dataclass(frozen=True)
class Delivery:
    """What one pull changed in its consumer's delivery record (for :meth:`BatchStore.undo_pull`).

    Attributes:
        consumer: the consumer name.
        delivered_before, delivered_after: its delivered sequence before and after the pull.
        dropped_data_points, drop_reasons: the drop report the pull carried (and cleared).

    """

    consumer: str
    delivered_before: int
    delivered_after: int
    dropped_data_points: int
    drop_reasons: tuple[str, ...]


@dataclass(frozen=True)
class PullResult:
    """What one :meth:`BatchStore.pull` returns (the fields of ``gpumetrics.v1.PullResponse``).

    Attributes:
        parts: the serialized batches of the answer, oldest first; their concatenation is one
            serialized ``ExportMetricsServiceRequest`` (see :attr:`data`). Empty when nothing
            is new. Kept apart so a server can copy them once, straight into its message.
        epoch: the store's epoch, to echo as ``ack_epoch``.
        first_sequence, last_sequence: the batches in ``parts`` (both 0 when none).
        more: batches are waiting after ``last_sequence``.
        data_points: data points in ``parts``.
        dropped_data_points: points this consumer lost since its previous pull.
        dropped_data_points_total: points this consumer lost since it registered in this epoch.
        drop_reasons: the limits behind ``dropped_data_points`` (subset of :data:`DROP_REASONS`).
        delivery: what the pull recorded, to undo if the answer never reached the consumer.

    """

    parts: tuple[bytes, ...]
    epoch: str
    first_sequence: int
    last_sequence: int
    more: bool
    data_points: int
    dropped_data_points: int
    dropped_data_points_total: int
    drop_reasons: tuple[str, ...]
    delivery: Delivery | None = None

    @property
    def data(self) -> bytes:
        """The answer as one serialized ``ExportMetricsServiceRequest`` (``b""`` when empty)."""
        return b"".join(self.parts)

    @property
    def size(self) -> int:
        """Serialized size of :attr:`data` (By), without joining the parts."""
        return sum(len(p) for p in self.parts)


@dataclass(frozen=True)
class ConsumerStats:
    """One consumer's cursor and accounting.

    ``offered_points == acked_points + dropped_points_total + unacked_held_points`` always holds:
    every point appended after ``base_sequence`` was acknowledged, charged as a drop, or is still
    held for this consumer.

    Attributes:
        name: consumer name.
        base_sequence: the cursor it was registered with (oldest batch held, minus one).
        acked_sequence: its cursor: everything up to here is acknowledged (or was dropped).
        delivered_sequence: every batch up to here was sent to it, acknowledged or dropped
            (a contiguous prefix: batches skipped with ``read_after_sequence`` do not count);
            acknowledgements are clamped to it.
        offered_points: points of every batch after ``base_sequence``.
        acked_points: points it acknowledged while they were held.
        dropped_points_total: points dropped before it acknowledged them.
        unacked_held_points: points held after ``acked_sequence``.
        idle_s: seconds since its last pull (store clock).

    """

    name: str
    base_sequence: int
    acked_sequence: int
    delivered_sequence: int
    offered_points: int
    acked_points: int
    dropped_points_total: int
    unacked_held_points: int
    idle_s: float


@dataclass(frozen=True)
class StoreStats:
    """Store-wide counters (``appended = released + dropped + held``, in batches and in points)."""

    epoch: str
    last_sequence: int
    appended_batches: int
    appended_points: int
    appended_bytes: int
    released_batches: int
    released_points: int
    dropped_batches: int
    dropped_points: Mapping[str, int]
    held_batches: int
    held_points: int
    held_bytes: int
    consumers: tuple[ConsumerStats, ...]
    forgotten_consumers: int
