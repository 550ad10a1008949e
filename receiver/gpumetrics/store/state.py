"""A :class:`~gpumetrics.store.BatchStore`'s state apart from its batches, as one JSON document.

What a restart must keep besides the batches themselves (``docs/protocol.md``, "What survives a
restart"): the epoch and the last sequence, so numbering goes on; every consumer's cursor,
delivered sequence, drop totals and the drop report its next pull carries; the delivered
sequences of recently forgotten consumers; and the store's counters, so that the accounting
identities of :mod:`gpumetrics.store.batchstore` hold across the restart. Consumers' last-seen
times are monotonic-clock readings of one process and are not kept: a consumer's TTL starts again
at the restart.

The document is small (at most ``max_consumers`` consumers and ``4 × max_consumers`` forgotten
names, each name at most 128 bytes) and is written whole with every durable change.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gpumetrics.store.records import Consumer
from gpumetrics.store.results import CONSUMER_NAME_RE, DROP_REASONS

__all__ = ["StoreState"]

_CONSUMER_FIELDS = (
    "base",
    "acked",
    "delivered",
    "acked_points",
    "dropped_total",
    "pending_dropped",
    "points_before_base",
)


@dataclass
class StoreState:
    """Everything of a store but its batches (see the module docstring).

    Attributes:
        epoch: the store life's id.
        last_sequence: the newest batch's sequence (0 before the first).
        appended: ``[batches, points, bytes]`` ever appended in this epoch.
        released: ``[batches, points]`` released after every consumer acknowledged them.
        dropped_batches: batches dropped (limits, and data that never became a batch).
        dropped: points dropped per reason (every :data:`~gpumetrics.store.DROP_REASONS` key).
        forgotten: consumers forgotten after ``consumer_ttl_s``.
        acked_hw: the highest sequence any consumer acknowledged.
        consumers: the registered consumers, in registration order.
        forgotten_delivered: delivered sequence of each recently forgotten consumer, oldest first.

    """

    epoch: str
    last_sequence: int = 0
    appended: list[int] = field(default_factory=lambda: [0, 0, 0])
    released: list[int] = field(default_factory=lambda: [0, 0])
    dropped_batches: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    forgotten: int = 0
    acked_hw: int = 0
    consumers: list[Consumer] = field(default_factory=list)
    forgotten_delivered: OrderedDict[str, int] = field(default_factory=OrderedDict)

    def encode(self) -> str:
        """Return the state as compact JSON (deterministic: equal states give equal text)."""
        doc = {
            "epoch": self.epoch,
            "last_sequence": self.last_sequence,
            "appended": self.appended,
            "released": self.released,
            "dropped_batches": self.dropped_batches,
            "dropped": self.dropped,
            "forgotten": self.forgotten,
            "acked_hw": self.acked_hw,
            "consumers": [
                {
                    "name": c.name,
                    **{f: getattr(c, f) for f in _CONSUMER_FIELDS},
                    "pending_reasons": list(c.pending_reasons),
                }
                for c in self.consumers
            ],
            "forgotten_delivered": [[n, d] for n, d in self.forgotten_delivered.items()],
        }
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str, now: float) -> StoreState:
        """Parse :meth:`encode`'s output; consumers are seen at ``now`` (monotonic s).

        Raises:
            ValueError: naming what is missing or malformed (the document is damaged).

        """
        try:
            doc = json.loads(text)
            state = cls(
                epoch=_str(doc["epoch"]),
                last_sequence=_count(doc["last_sequence"]),
                appended=[_count(v) for v in doc["appended"]],
                released=[_count(v) for v in doc["released"]],
                dropped_batches=_count(doc["dropped_batches"]),
                dropped={r: _count(doc["dropped"].get(r, 0)) for r in DROP_REASONS},
                forgotten=_count(doc["forgotten"]),
                acked_hw=_count(doc["acked_hw"]),
                consumers=[_consumer(c, now) for c in doc["consumers"]],
                forgotten_delivered=OrderedDict(
                    (_name(n), _count(d)) for n, d in doc["forgotten_delivered"]
                ),
            )
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"store state: {type(exc).__name__}: {exc}") from None
        if len(state.appended) != 3 or len(state.released) != 2:
            raise ValueError("store state: appended/released have the wrong length")
        return state


def _consumer(doc: Any, now: float) -> Consumer:
    c = Consumer(_name(doc["name"]), 0, now, 0)
    for f in _CONSUMER_FIELDS:
        setattr(c, f, _count(doc[f]))
    c.pending_reasons = {_reason(r): None for r in doc["pending_reasons"]}
    return c


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"store state: {value!r} is not a count")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"store state: {value!r} is not an epoch")
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str) or CONSUMER_NAME_RE.fullmatch(value) is None:
        raise ValueError(f"store state: {value!r} is not a consumer name")
    return value


def _reason(value: Any) -> str:
    if value not in DROP_REASONS:
        raise ValueError(f"store state: {value!r} is not a drop reason")
    return str(value)
