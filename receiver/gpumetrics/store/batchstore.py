"""The :class:`BatchStore`: bounded, sequenced batches of serialized OTLP metrics or logs.

Each batch is one serialized export request of the store's signal
(:class:`~gpumetrics.store.signals.Signal`: ``ExportMetricsServiceRequest`` for the metric store,
``ExportLogsServiceRequest`` for the log store of GPU events), stored once as bytes, at most
``max_batch_bytes`` long. A collection is appended resource entry by resource entry: each entry
is serialized on its own and consecutive entries are packed into batches of at most
``max_batch_bytes``, so no copy of the whole collection is ever made; an entry larger than that is
split (:mod:`gpumetrics.store.split`), as its own signal, into consecutive batches, so every batch
can always be sent in one gRPC message. Because a protobuf message's serialization is the
concatenation of its fields, concatenating serialized export requests gives a valid serialized
request whose resource entries are the concatenation of theirs, so a pull answer is the batches'
bytes side by side (:attr:`PullResult.parts`) and never re-parsed.

Delivery is at-least-once (``docs/protocol.md``): every named consumer has its own cursor, which
is its acknowledged sequence; a pull returns the batches after its *read position*,
``max(read_after_sequence, cursor)``. The store keeps no delivery state beyond the highest
sequence sent (which bounds acknowledgements): a consumer drains a backlog in several pulls by
passing the previous answer's ``last_sequence`` as ``read_after_sequence``, and a pull that reads
from the cursor again (``read_after_sequence = 0``) gets what was sent but not acknowledged sent
again. The sequence sent is a contiguous prefix: a pull that skips ahead with
``read_after_sequence`` does not extend it, so a consumer can never acknowledge (release) a batch
it was not sent, and an answer that never reached its consumer can be taken back
(:meth:`BatchStore.undo_pull`). A batch is released only when every registered consumer has
acknowledged it. When a
limit (:class:`~gpumetrics.store.StoreLimits`) forces the oldest batches out, each consumer that
had not acknowledged them is charged their points, which its next pull reports. Data that never
became a batch is charged the same way: a data point or log record too large for any batch
(``max_batch_bytes``), what a failed split could not store (``split_error``), and what the
producer left out of a collection (:meth:`BatchStore.charge_unstored`, ``max_collection_bytes``).
Accounting is exact and exposed through :meth:`BatchStore.stats`:

* store: ``appended_points == released_points + sum(dropped_points.values()) + held_points``;
* each consumer: ``offered_points == acked_points + dropped_points_total + unacked_held_points``.

"Points" are the signal's units: data points for metrics, log records for logs.

With a journal (:mod:`gpumetrics.store.journal`, ``store.path``) the store is durable: every
change is committed to the file before the lock is released, so before a pull can see a batch
and before a pull's answer (its delivered sequence) leaves; an acknowledgement releases batches
from the file in the transaction that records it. A store built on an existing file resumes its
epoch, sequences, cursors, drop reports and counters (:mod:`gpumetrics.store.state`), so both
identities above hold across a restart; the batches keep their age. What a disk fault means is
:mod:`gpumetrics.store.durability`'s: the store then serves from memory, under a new epoch.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry
from gpumetrics.store.durability import RETRY_S, Durability
from gpumetrics.store.journal import JournalError, Loaded, SqliteJournal
from gpumetrics.store.limits import DEFAULT_MAX_BATCH_BYTES, StoreLimits
from gpumetrics.store.records import Batch, Consumer
from gpumetrics.store.results import (
    CONSUMER_NAME_RE,
    DEFAULT_CONSUMER,
    DROP_REASONS,
    ConsumerStats,
    Delivery,
    PullResult,
    StoreStats,
    TooManyConsumersError,
)
from gpumetrics.store.signals import METRICS, Signal
from gpumetrics.store.split import field_size, split_entry
from gpumetrics.store.state import StoreState
from gpumetrics.wire import varint

log = logging.getLogger(__name__)

_Part = tuple[bytes, bytes, int]
"""One framed resource entry (or a whole serialized request): (tag and length, body, units)."""

_ENTRY_TAG = b"\x0a"
"""Field 1, wire type LEN: the resource entries of every OTLP export request."""


def validate_consumer(name: str) -> str:
    """Return the consumer name to use: ``name``, or :data:`DEFAULT_CONSUMER` for ``""``.

    Raises:
        ValueError: ``consumer: ...`` when ``name`` is not 1–128 bytes of ``[A-Za-z0-9._:/-]``.

    """
    if name == "":
        return DEFAULT_CONSUMER
    if not isinstance(name, str) or CONSUMER_NAME_RE.fullmatch(name) is None:
        shown = name[:40] + "…" if isinstance(name, str) and len(name) > 40 else name
        raise ValueError(
            f"consumer: must be 1 to 128 characters of [A-Za-z0-9._:/-], got {shown!r}"
        )
    return name


class BatchStore:
    """Bounded, sequenced batches with per-consumer cursors (see the module docstring).

    Args:
        limits: bounds (default :class:`StoreLimits` defaults).
        telemetry: receives gauges ``gpumetrics.store.batches`` / ``.bytes`` / ``.points`` /
            ``.consumers`` and the counter ``gpumetrics.store.points.dropped{reason}``.
        clock: monotonic seconds (injectable for tests); ages and consumer TTLs use it.
        epoch: this store life's id (default: 16 random hex digits).
        max_batch_bytes: largest serialized batch kept (By); a larger collection is split into
            consecutive batches when it is appended, so that every batch fits one gRPC message
            (:mod:`gpumetrics.store.split`). The runtime sets it to what a default Pull
            answer and a push export may carry. A single data point or log record whose
            envelope alone is larger is dropped (drop reason ``max_batch_bytes``).
        signal: what the batches hold, :data:`~gpumetrics.store.signals.METRICS` (default) or
            :data:`~gpumetrics.store.signals.LOGS`; oversized data is parsed and split as
            that signal's request, and its units counted.
        journal: the store's file (``store.path``); None (default) keeps it in memory only.
            An existing file is loaded (``epoch`` is then ignored), a damaged one moved aside;
            telemetry also receives ``gpumetrics.store.durable{state}``.
        retry_s: seconds between attempts to write to the file again after a disk fault.

    Raises:
        StoreRefusedError: the journal's file belongs to another node, signal or format.
        StorePathError: the journal's directory or file exists as something else.

    Thread-safe: one lock guards everything; a pull costs O(batches returned + consumers),
    an acknowledgement O(batches acknowledged); with a journal each change also costs one
    SQLite transaction (an fsync), made under the lock.

    """

    def __init__(
        self,
        limits: StoreLimits | None = None,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        clock: Callable[[], float] = time.monotonic,
        epoch: str | None = None,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        signal: Signal = METRICS,
        journal: SqliteJournal | None = None,
        retry_s: float = RETRY_S,
    ) -> None:
        if max_batch_bytes <= 0:
            raise ValueError(f"max_batch_bytes: must be > 0, got {max_batch_bytes}")
        self.limits = limits or StoreLimits()
        self.max_batch_bytes = max_batch_bytes
        self.signal = signal
        self._split_error_logged = False
        self.epoch = epoch if epoch is not None else secrets.token_hex(8)
        self._telemetry = telemetry
        self._clock = clock
        self._lock = threading.Lock()
        self._batches: deque[Batch] = deque()
        self._consumers: dict[str, Consumer] = {}
        self._last_seq = 0
        self._held_points = self._held_bytes = 0
        self._appended = [0, 0, 0]  # batches, points, bytes
        self._released = [0, 0]  # batches, points
        self._dropped_batches = 0
        self._dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._forgotten = 0
        # delivered sequence of forgotten consumers, so one that returns (consumer_ttl_s) may
        # still acknowledge what it was sent before; bounded, oldest forgotten first out
        self._forgotten_delivered: OrderedDict[str, int] = OrderedDict()
        self._acked_hw = 0  # highest sequence any consumer has acknowledged (not via a drop)
        self._durability = Durability(journal, telemetry, signal.name, clock, retry_s)
        loaded = self._durability.open(self.epoch)
        if loaded is not None:
            with self._lock:
                self._restore(loaded)

    @property
    def durable_state(self) -> str:
        """``ok`` (on disk), ``failed`` (memory only after a disk fault) or ``disabled``."""
        return self._durability.state

    @property
    def durable_path(self) -> str | None:
        """The store's file (None in memory only)."""
        return self._durability.path

    @property
    def moved_aside(self) -> str | None:
        """Where a corrupt file was moved when the store opened it (None: it was not)."""
        return self._durability.moved_aside

    def close(self) -> None:
        """Close the store's file: its last state is on disk.

        The store stays usable in memory, but what changes after this is no longer written.
        """
        with self._lock:
            self._durability.close()

    @property
    def last_sequence(self) -> int:
        """Sequence of the newest batch appended (0 before the first append)."""
        with self._lock:
            return self._last_seq

    def append(self, request: Any) -> int:
        """Append one export request of the store's signal; return the sequence of its last batch.

        Its resource entries are serialized one at a time and packed, in order, into consecutive
        batches of at most ``max_batch_bytes`` (sequences 1, 2, 3… per epoch); an entry larger
        than that is split as its signal (:func:`~gpumetrics.store.split.split_entry`). The
        limits are applied right after each batch: a batch is dropped (and counted) when it
        alone exceeds ``max_bytes`` or ``max_data_points``, and a piece that cannot be split
        below ``max_batch_bytes`` (one data point or log record with a larger envelope) is
        dropped as ``max_batch_bytes`` without a sequence. If serializing or splitting fails,
        what was not stored is dropped as ``split_error`` (logged once). A request with no
        resource entry is stored as one empty batch.
        """
        total = self.signal.count(request)
        return self._pack(self._entries(request), total)

    def append_serialized(self, data: bytes, points: int) -> int:
        """Append a serialized export request of the store's signal holding ``points`` units.

        Data larger than ``max_batch_bytes`` is parsed as the store's signal and split as
        :meth:`append` does; data that cannot be parsed then is dropped as ``split_error``
        (all ``points`` of it, logged once).

        Raises:
            ValueError: ``points`` is negative or ``data`` is not bytes.

        """
        return self.append_parts([(data, points)])

    def append_parts(self, parts: Iterable[tuple[bytes, int]]) -> int:
        """Append consecutive serialized export requests, packed into as few batches as fit.

        Args:
            parts: ``(data, units)`` pairs: each ``data`` a serialized export request of the
                store's signal (usually one resource entry, as
                ``gpumetrics.metrics.Producer.collect_parts`` makes them) holding ``units`` data
                points or log records. Consecutive parts share a batch while it stays within
                ``max_batch_bytes``; a part larger than that is parsed and split (see
                :meth:`append_serialized`).

        Returns:
            The sequence of the last batch (the current last sequence when nothing was stored).

        Raises:
            ValueError: a ``units`` is negative or a ``data`` is not bytes (nothing is stored).

        """
        checked = list(parts)
        for data, points in checked:
            if not isinstance(data, bytes):
                raise ValueError(f"data: must be bytes, got {type(data).__name__}")
            if isinstance(points, bool) or not isinstance(points, int) or points < 0:
                raise ValueError(f"points: must be an int >= 0, got {points!r}")
        total = sum(points for _, points in checked)
        return self._pack(self._serialized(checked), total)

    def charge_unstored(self, points: int, reason: str) -> None:
        """Count ``points`` that were left out before they could be appended, under ``reason``.

        For data the producer dropped to stay within a budget of its own (``Producer``'s
        ``max_collection_bytes``): they count as appended and dropped, and every registered
        consumer is charged them (its next pull reports them), as for a batch dropped by a
        limit.

        Raises:
            ValueError: ``points`` is negative, or ``reason`` is not one of
                :data:`~gpumetrics.store.DROP_REASONS`.

        """
        if isinstance(points, bool) or not isinstance(points, int) or points < 0:
            raise ValueError(f"points: must be an int >= 0, got {points!r}")
        if reason not in DROP_REASONS:
            raise ValueError(f"reason: must be one of {', '.join(DROP_REASONS)}, got {reason!r}")
        if points:
            self._charge(points, reason)

    # -- packing resource entries into batches -------------------------------------------------

    def _entries(self, request: Any) -> Iterator[_Part]:
        """Each resource entry of ``request`` framed as a request of its own (split if needed)."""
        for entry in getattr(request, self.signal.resources):
            body = entry.SerializeToString()
            if field_size(len(body)) <= self.max_batch_bytes:
                yield _ENTRY_TAG + varint(len(body)), body, self.signal.count_resource(entry)
                continue
            del body
            for part in split_entry(entry, self.max_batch_bytes, self.signal):
                body = part.SerializeToString()
                yield _ENTRY_TAG + varint(len(body)), body, self.signal.count_resource(part)

    def _serialized(self, parts: list[tuple[bytes, int]]) -> Iterator[_Part]:
        """Yield the parts as they are, or, for one larger than a batch, its entries (parsed)."""
        for data, points in parts:
            if len(data) <= self.max_batch_bytes:
                yield b"", data, points
            else:
                yield from self._entries(self.signal.parse(data))

    def _pack(self, parts: Iterator[_Part], total: int) -> int:
        """Append ``parts`` in order, packed into batches; count what a failure leaves unstored."""
        stored = 0  # units appended or dropped through _append
        chunk: list[bytes] = []
        size = points = 0
        any_batch = False
        try:
            for head, body, n in parts:
                length = len(head) + len(body)
                if chunk and size + length > self.max_batch_bytes:
                    self._append(b"".join(chunk), points)
                    stored, chunk, size, points, any_batch = stored + points, [], 0, 0, True
                if length > self.max_batch_bytes:  # indivisible: _append drops and counts it
                    self._append(head + body, n)
                    stored, any_batch = stored + n, True
                    continue
                chunk += (head, body) if head else (body,)
                size, points = size + length, points + n
            if chunk or not any_batch:
                self._append(b"".join(chunk), points)
                stored += points
        except Exception as exc:  # noqa: BLE001 - whatever failed, what was lost is counted
            self._split_failed(max(0, total - stored), exc)
        return self.last_sequence

    def _split_failed(self, points: int, exc: Exception) -> None:
        level = logging.DEBUG if self._split_error_logged else logging.ERROR
        self._split_error_logged = True
        log.log(
            level,
            "could not store a %s batch (%s: %s): %d %s dropped, counted as split_error "
            "(logged once)",
            self.signal.name,
            type(exc).__name__,
            exc,
            points,
            self.signal.unit,
        )
        self._charge(points, "split_error")

    def _charge(self, points: int, reason: str) -> None:
        """Count ``points`` that never became a batch as one appended and dropped batch."""
        with self._lock:
            self._appended[0] += 1
            self._appended[1] += points
            self._drop_unsequenced(points, reason)
            self._persist()
            self._publish()

    def _append(self, data: bytes, points: int) -> int:
        with self._lock:
            now = self._clock()
            self._appended[0] += 1
            self._appended[1] += points
            self._appended[2] += len(data)
            added: tuple[Batch, ...] = ()
            if len(data) > self.max_batch_bytes:
                self._drop_unsequenced(points, "max_batch_bytes")
            else:
                self._last_seq += 1
                added = (Batch(self._last_seq, data, points, now),)
                self._batches.append(added[0])
                self._held_points += points
                self._held_bytes += len(data)
            self._expire_consumers(now)
            self._enforce_limits(now)
            self._persist(added, appending=True)  # on disk before a pull can see it
            self._publish()
            return self._last_seq

    def expire(self) -> None:
        """Apply the age limit and the consumer TTL now (appends and pulls also do it)."""
        with self._lock:
            now = self._clock()
            self._expire_consumers(now)
            self._enforce_limits(now)
            self._persist()
            self._publish()

    def pull(
        self,
        consumer: str,
        ack_sequence: int = 0,
        ack_epoch: str = "",
        max_points: int = 0,
        max_bytes: int = 0,
        ack_only: bool = False,
        read_after_sequence: int = 0,
    ) -> PullResult:
        """Acknowledge, then return the batches after the consumer's read position.

        Args:
            consumer: consumer name (``""`` = :data:`DEFAULT_CONSUMER`); registered on its first
                pull with its cursor just before the oldest batch held.
            ack_sequence: everything up to here has been durably taken; applied only when
                ``ack_epoch`` equals :attr:`epoch`, never moves the cursor back, and is clamped
                to the consumer's delivered sequence, the end of the contiguous run of batches
                it was sent (nothing unseen is released, skipped batches included).
            ack_epoch: the epoch ``ack_sequence`` and ``read_after_sequence`` belong to.
            max_points: cap on the data points in the answer (0 = none).
            max_bytes: cap on the answer's serialized size (0 = none). The first batch is
                returned even when it alone exceeds a cap.
            ack_only: apply the acknowledgement and report drops, but return no data.
            read_after_sequence: the read position: the answer holds batches with sequence
                greater than ``max(read_after_sequence, acknowledged cursor)``; 0 means right
                after the cursor. Ignored (treated as 0) when ``ack_epoch`` is not :attr:`epoch`.
                Beyond the newest batch: an empty answer with ``more`` False. It releases
                nothing and moves no cursor; an answer that starts after the delivered sequence
                (batches skipped) does not count as delivered.

        Raises:
            ValueError: naming ``consumer``, ``ack_sequence``, ``max_points``, ``max_bytes`` or
                ``read_after_sequence``.
            TooManyConsumersError: a new consumer while ``max_consumers`` are registered.

        """
        name = validate_consumer(consumer)
        for field, value in (
            ("ack_sequence", ack_sequence),
            ("max_points", max_points),
            ("max_bytes", max_bytes),
            ("read_after_sequence", read_after_sequence),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{field}: must be an int >= 0, got {value!r}")
        with self._lock:
            now = self._clock()
            c = self._consumers.get(name)
            if c is not None:
                c.last_seen = now  # seen now: never forgotten by its own pull
            self._expire_consumers(now)
            self._enforce_limits(now)
            if c is None:
                c = self._register(name, now)
            current = ack_epoch == self.epoch
            if current and ack_sequence > c.acked:
                self._ack(c, min(ack_sequence, c.delivered))
                self._release()
            position = max(read_after_sequence, c.acked) if current else c.acked
            dropped, reasons = c.pending_dropped, tuple(c.pending_reasons)
            c.pending_dropped = 0
            c.pending_reasons = {}
            parts: list[bytes] = []
            first = last = points = size = 0
            start = position + 1 - self._batches[0].seq if self._batches else 0
            before = c.delivered
            if not ack_only:
                for i in range(start, len(self._batches)):
                    b = self._batches[i]
                    if parts and (
                        (max_points and points + b.points > max_points)
                        or (max_bytes and size + len(b.data) > max_bytes)
                    ):
                        break
                    parts.append(b.data)
                    first = first or b.seq
                    last, points, size = b.seq, points + b.points, size + len(b.data)
                if last and first <= c.delivered + 1:  # contiguous with what it was sent
                    c.delivered = max(c.delivered, last)
            tail = last or position
            more = bool(self._batches) and self._batches[-1].seq > tail
            self._persist()  # the delivered sequence is on disk before the answer leaves
            self._publish()
            total = c.dropped_total
            epoch = self.epoch
            delivery = (
                Delivery(name, before, c.delivered, dropped, reasons)
                if c.delivered != before or dropped or reasons
                else None
            )
        return PullResult(
            parts=tuple(parts),
            epoch=epoch,
            first_sequence=first,
            last_sequence=last,
            more=more,
            data_points=points,
            dropped_data_points=dropped,
            dropped_data_points_total=total,
            drop_reasons=reasons,
            delivery=delivery,
        )

    def undo_pull(self, result: PullResult) -> bool:
        """Take back a pull whose answer never reached its consumer (the send failed).

        The consumer's delivered sequence returns to what it was (unless a later pull or a drop
        changed it since), and the drops the answer reported are reported again by the next
        pull. The acknowledgement the pull carried stays applied: the consumer sent it.

        Returns:
            True when something was restored; False for a result of another epoch, of a
            consumer forgotten since, or one that changed nothing.

        """
        d = result.delivery
        if d is None or result.epoch != self.epoch:
            return False
        with self._lock:
            c = self._consumers.get(d.consumer)
            if c is None:
                return False
            if c.delivered == d.delivered_after:
                c.delivered = max(d.delivered_before, c.acked)
            c.pending_dropped += d.dropped_data_points
            for reason in d.drop_reasons:
                c.pending_reasons[reason] = None
            self._persist()
            return True

    def stats(self) -> StoreStats:
        """Return a consistent snapshot of every counter (O(batches × consumers); tests, logs)."""
        with self._lock:
            now = self._clock()
            consumers = tuple(
                ConsumerStats(
                    name=c.name,
                    base_sequence=c.base,
                    acked_sequence=c.acked,
                    delivered_sequence=c.delivered,
                    offered_points=self._appended[1] - c.points_before_base,
                    acked_points=c.acked_points,
                    dropped_points_total=c.dropped_total,
                    unacked_held_points=sum(b.points for b in self._batches if b.seq > c.acked),
                    idle_s=now - c.last_seen,
                )
                for c in self._consumers.values()
            )
            return StoreStats(
                epoch=self.epoch,
                last_sequence=self._last_seq,
                appended_batches=self._appended[0],
                appended_points=self._appended[1],
                appended_bytes=self._appended[2],
                released_batches=self._released[0],
                released_points=self._released[1],
                dropped_batches=self._dropped_batches,
                dropped_points=dict(self._dropped),
                held_batches=len(self._batches),
                held_points=self._held_points,
                held_bytes=self._held_bytes,
                consumers=consumers,
                forgotten_consumers=self._forgotten,
            )

    # -- internals; every method below runs under self._lock ----------------------------------

    def _state(self) -> StoreState:
        return StoreState(
            epoch=self.epoch,
            last_sequence=self._last_seq,
            appended=list(self._appended),
            released=list(self._released),
            dropped_batches=self._dropped_batches,
            dropped=dict(self._dropped),
            forgotten=self._forgotten,
            acked_hw=self._acked_hw,
            consumers=list(self._consumers.values()),
            forgotten_delivered=self._forgotten_delivered,
        )

    def _persist(self, added: tuple[Batch, ...] = (), appending: bool = False) -> None:
        """Commit what changed to the journal; after a failed write, go on under a new epoch."""
        d = self._durability
        if d.state == "failed":
            if appending and d.retry_due():
                d.recover(list(self._batches), self._state().encode())
            return
        first = self._batches[0].seq if self._batches else self._last_seq + 1
        epoch = d.write(added, first, lambda: self._state().encode())
        if epoch is not None:
            self.epoch = epoch

    def _restore(self, loaded: Loaded) -> None:
        """Resume the state and batches of an existing file (see the module docstring)."""
        if not loaded.state:  # created, never written: a fresh store
            return
        now = self._clock()
        try:
            st = StoreState.decode(loaded.state, now)
            self.epoch, self._last_seq = st.epoch, st.last_sequence
            self._appended, self._released = list(st.appended), list(st.released)
            self._dropped_batches, self._dropped = st.dropped_batches, dict(st.dropped)
            self._forgotten, self._acked_hw = st.forgotten, st.acked_hw
            self._consumers = {c.name: c for c in st.consumers}
            self._forgotten_delivered = st.forgotten_delivered
            for seq, data, points, age_s in loaded.rows():
                if seq > self._last_seq:
                    raise ValueError(f"batch {seq} is after the last sequence {self._last_seq}")
                self._batches.append(Batch(seq, data, points, now - age_s))
                self._held_points += points
                self._held_bytes += len(data)
                self._enforce_limits(now)  # limits lowered since: never more than one over
        except (ValueError, JournalError) as exc:
            self._reset()
            path = self._durability.path or ""
            self._durability.corrupt(
                exc if isinstance(exc, JournalError) else JournalError("corrupt", path, str(exc)),
                self.epoch,
            )
            return
        self._release()
        self._persist()
        self._publish()
        log.info(
            "store.path: the %s store resumes from %s: epoch %s, last sequence %d, %d batch(es) "
            "held, %d consumer(s)",
            self.signal.name,
            self._durability.path,
            self.epoch,
            self._last_seq,
            len(self._batches),
            len(self._consumers),
        )

    def _reset(self) -> None:
        """Forget a half-restored state: a fresh, empty store with a new epoch."""
        self.epoch = secrets.token_hex(8)
        self._batches.clear()
        self._consumers = {}
        self._last_seq = self._held_points = self._held_bytes = 0
        self._appended, self._released = [0, 0, 0], [0, 0]
        self._dropped_batches, self._dropped = 0, dict.fromkeys(DROP_REASONS, 0)
        self._forgotten = self._acked_hw = 0
        self._forgotten_delivered = OrderedDict()

    def _register(self, name: str, now: float) -> Consumer:
        if len(self._consumers) >= self.limits.max_consumers:
            raise TooManyConsumersError(
                f"consumer: {name!r} would be consumer number {len(self._consumers) + 1}; "
                f"at most {self.limits.max_consumers} (store.max_consumers) are kept, and "
                f"idle ones are forgotten after {self.limits.consumer_ttl_s:g} s"
            )
        base = self._batches[0].seq - 1 if self._batches else self._last_seq
        c = Consumer(name, base, now, self._appended[1] - self._held_points)
        remembered = self._forgotten_delivered.pop(name, None)
        if remembered is not None:  # sent to it before it was forgotten: it may acknowledge it
            c.delivered = max(base, min(remembered, self._last_seq))
        self._consumers[name] = c
        return c

    def _ack(self, c: Consumer, upto: int) -> None:
        if upto <= c.acked:
            return
        if self._batches:
            first = self._batches[0].seq
            for i in range(max(c.acked + 1, first) - first, min(upto, self._last_seq) - first + 1):
                c.acked_points += self._batches[i].points
        c.acked = upto
        self._acked_hw = max(self._acked_hw, upto)

    def _release(self) -> None:
        # Released: acknowledged by every registered consumer; with none registered (all
        # forgotten), acknowledged by one that was. Never what nobody acknowledged.
        if self._consumers:
            floor = min(c.acked for c in self._consumers.values())
        else:
            floor = self._acked_hw
        while self._batches and self._batches[0].seq <= floor:
            b = self._batches.popleft()
            self._held_points -= b.points
            self._held_bytes -= len(b.data)
            self._released[0] += 1
            self._released[1] += b.points

    def _expire_consumers(self, now: float) -> None:
        ttl = self.limits.consumer_ttl_s
        stale = [n for n, c in self._consumers.items() if now - c.last_seen > ttl]
        for n in stale:
            self._forgotten_delivered[n] = self._consumers.pop(n).delivered
            self._forgotten_delivered.move_to_end(n)
            while len(self._forgotten_delivered) > 4 * self.limits.max_consumers:
                self._forgotten_delivered.popitem(last=False)
        if stale:
            self._forgotten += len(stale)
            self._release()

    def _enforce_limits(self, now: float) -> None:
        lim = self.limits
        while self._batches and now - self._batches[0].t > lim.max_age_s:
            self._drop("max_age")
        while self._batches and self._held_points > lim.max_data_points:
            self._drop("max_data_points")
        while self._batches and self._held_bytes > lim.max_bytes:
            self._drop("max_bytes")

    def _drop(self, reason: str) -> None:
        b = self._batches.popleft()
        self._held_points -= b.points
        self._held_bytes -= len(b.data)
        self._dropped_batches += 1
        self._dropped[reason] += b.points
        for c in self._consumers.values():
            if c.acked < b.seq:
                c.dropped_total += b.points
                c.pending_dropped += b.points
                c.pending_reasons[reason] = None
                c.acked = b.seq
                c.delivered = max(c.delivered, b.seq)
        if b.points:
            self._telemetry.add("gpumetrics.store.points.dropped", b.points, {"reason": reason})

    def _drop_unsequenced(self, points: int, reason: str) -> None:
        """Drop a batch that was never held (it got no sequence); charge every consumer."""
        self._dropped_batches += 1
        self._dropped[reason] += points
        for c in self._consumers.values():
            c.dropped_total += points
            c.pending_dropped += points
            c.pending_reasons[reason] = None
        if points:
            self._telemetry.add("gpumetrics.store.points.dropped", points, {"reason": reason})

    def _publish(self) -> None:
        t = self._telemetry
        t.set("gpumetrics.store.batches", len(self._batches))
        t.set("gpumetrics.store.bytes", self._held_bytes)
        t.set("gpumetrics.store.points", self._held_points)
        t.set("gpumetrics.store.consumers", len(self._consumers))
        self._durability.publish()
