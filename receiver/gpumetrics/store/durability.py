"""Whether a store's batches are on disk, and what happens when the disk fails.

A :class:`~gpumetrics.store.BatchStore` with a journal (:mod:`gpumetrics.store.journal`, the
``store.path`` setting) writes every change before it becomes visible: a batch is committed to
the file before a Pull can return it, a consumer's delivered sequence before the answer leaves,
and an acknowledgement releases the batches from the file in the same transaction that records
it. :class:`Durability` runs that and decides what a fault means; the store's answers never
depend on the disk:

* **Corrupt file** when opened (SQLite says so, a batch fails its CRC, the sequences have a
  gap): the file is moved aside (``<file>.corrupt-<UTC time>``), a fresh one begins, one
  WARNING names both. The store starts a new epoch: what the old file held is not served.
* **Disk full, read-only filesystem, a path that cannot be written or created, another process
  holding the file, any other I/O error** (at open or later): the store keeps serving from
  memory, one WARNING says why and what it means, and
  ``gpumetrics.store.durable{state="failed"}`` is 1. A store that fails after it opened
  continues under a **new epoch**: the file keeps an older state with the old epoch, and a
  sidecar restarted on it must not resume sequences it never wrote (a consumer's later
  acknowledgement would skip them); with the new epoch a consumer is sent again what it had
  not acknowledged, so nothing is lost or skipped, and a restart on the older file re-delivers
  at worst. Every :data:`RETRY_S` seconds (with an append) the store tries to write its whole
  content to the file again; when that succeeds, it is durable again (logged at INFO).

The state gauge ``gpumetrics.store.durable{state}`` (set with the store's other gauges, after
each append, pull and expiry) is 1 for the current state and 0 for the other two: ``ok`` (on
disk), ``failed`` (memory only after a fault), ``disabled`` (no ``store.path``). Health is never
changed: a store in memory serves as before.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence

from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry
from gpumetrics.store.journal import (
    JournalError,
    Loaded,
    SqliteJournal,
    StorePathError,
    StoreRefusedError,
)
from gpumetrics.store.records import Batch

__all__ = ["DURABLE_STATES", "RETRY_S", "Durability"]

log = logging.getLogger(__name__)

DURABLE_STATES = ("ok", "failed", "disabled")
"""The values of ``gpumetrics.store.durable``'s ``state`` attribute."""

RETRY_S = 60.0
"""Seconds between attempts to write a failed store's content to its file again."""

_WHY = {
    "full": "the disk is full",
    "read_only": "the filesystem or the file is read-only",
    "unwritable": "it cannot be created or written (permissions?)",
    "locked": "another process holds it (a second sidecar on the same store.path?)",
    "io": "an I/O error",
    "corrupt": "the file is damaged",
}


class Durability:
    """The on-disk side of one store (see the module docstring).

    Args:
        journal: the store's file, or None for a store in memory only (``disabled``).
        telemetry: receives ``gpumetrics.store.durable{state}``.
        signal: ``metrics`` or ``logs``, for the log lines.
        clock: monotonic seconds (the retry schedule).
        retry_s: seconds between attempts to write again after a fault.

    Called under the store's lock only.

    """

    def __init__(
        self,
        journal: SqliteJournal | None,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        signal: str = "metrics",
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = RETRY_S,
    ) -> None:
        self._journal = journal
        self._telemetry = telemetry
        self._signal = signal
        self._clock = clock
        self._retry_s = retry_s
        self._retry_at = 0.0
        self._state = "disabled" if journal is None else "ok"
        self._first = -1
        self._doc = ""
        self._warned = False
        self._closed = False
        self.moved_aside: str | None = None
        """Where a corrupt file was moved when it was opened (None: it was not)."""
        self.reason: str | None = None
        """Why the store is in memory only (None unless ``state`` is ``failed``)."""

    @property
    def state(self) -> str:
        """``ok``, ``failed`` or ``disabled`` (:data:`DURABLE_STATES`)."""
        return self._state

    @property
    def path(self) -> str | None:
        """The file, or None without one."""
        return None if self._journal is None else self._journal.path

    def open(self, epoch: str) -> Loaded | None:
        """Open the file; return what it holds (None: nothing, or memory only now).

        ``epoch`` is the store's epoch if nothing is loaded (named in the log line).

        Raises:
            StoreRefusedError: the file is another node's, signal's or format's.
            StorePathError: the path exists as something else than a directory and a file.

        """
        journal = self._journal
        if journal is None:
            return None
        loaded = None
        try:
            loaded = journal.open()
        except JournalError as exc:
            if exc.kind != "corrupt":
                self._fail(exc, "open", epoch)
                return None
            self._start_afresh(journal, exc, epoch)
        return loaded

    def _start_afresh(self, journal: SqliteJournal, exc: JournalError, epoch: str) -> None:
        try:
            self.moved_aside = journal.move_aside()
            journal.open()
        except JournalError as again:
            self._fail(again, "open", epoch)
            return
        log.warning(
            "store.path: %s is corrupt (%s); moved aside to %s, and a fresh %s store begins "
            "(new epoch %s): what the old file held is not served",
            exc.path,
            exc.detail,
            self.moved_aside,
            self._signal,
            epoch,
        )

    def corrupt(self, exc: JournalError, epoch: str) -> None:
        """Move the file aside and start afresh: a batch could not be read back while loading.

        ``epoch`` is the fresh store's (named in the log line).
        """
        if self._journal is not None:
            self._start_afresh(self._journal, exc, epoch)

    def write(
        self, added: Sequence[Batch], first_held: int, state: Callable[[], str]
    ) -> str | None:
        """Commit a change (see :meth:`SqliteJournal.write`); skip one that changes nothing.

        ``state`` is called only when the store is on disk. Returns None, or, when this write
        failed, the new epoch the store must continue under (in memory only from now on).
        """
        journal = self._journal
        if journal is None or self._state != "ok" or self._closed:
            return None
        doc = state()
        if not added and first_held == self._first and doc == self._doc:
            return None
        try:
            journal.write(added, first_held, doc, self._clock())
        except JournalError as exc:
            epoch = secrets.token_hex(8)
            self._fail(exc, "write", epoch)
            return epoch
        self._first, self._doc = first_held, doc
        return None

    def retry_due(self) -> bool:
        """Return True when a failed store should try to write its content again now."""
        return (
            self._state == "failed"
            and self._journal is not None
            and not self._closed
            and self._clock() >= self._retry_at
        )

    def recover(self, batches: Sequence[Batch], state: str) -> bool:
        """Write the whole content to the file again; True when the store is durable again."""
        journal = self._journal
        if journal is None:
            return False
        self._retry_at = self._clock() + self._retry_s
        try:
            journal.rewrite(batches, state, self._clock())
        except (JournalError, StoreRefusedError, StorePathError) as exc:
            log.debug("store.path: %s still cannot be written: %s", journal.path, exc)
            return False
        self._state, self.reason = "ok", None
        self._first, self._doc = batches[0].seq if batches else -1, state
        log.info(
            "store.path: %s can be written again: %d batch(es) written; the %s store is on "
            "disk again",
            journal.path,
            len(batches),
            self._signal,
        )
        return True

    def close(self) -> None:
        """Close the file (a final checkpoint); later changes are not written."""
        self._closed = True
        if self._journal is not None:
            self._journal.close()

    def _fail(self, exc: JournalError, doing: str, epoch: str) -> None:
        self._state = "failed"
        self.reason = f"{_WHY.get(exc.kind, exc.kind)}: {exc.detail}"
        self._retry_at = self._clock() + self._retry_s
        if self._journal is not None:
            self._journal.close()
        level = logging.INFO if self._warned else logging.WARNING
        self._warned = True
        log.log(
            level,
            "store.path: cannot %s %s: %s. The %s store serves from memory only, %s %s: what "
            "it holds is lost if the sidecar stops (retried every %g s; "
            'gpumetrics.store.durable{state="failed"})',
            doing,
            exc.path,
            self.reason,
            self._signal,
            "epoch" if doing == "open" else "under a new epoch",
            epoch,
            self._retry_s,
        )

    def publish(self) -> None:
        """Set ``gpumetrics.store.durable{state}`` (the store calls it with its other gauges)."""
        for s in DURABLE_STATES:
            self._telemetry.set("gpumetrics.store.durable", int(s == self._state), {"state": s})
