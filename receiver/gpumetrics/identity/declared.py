"""The declared store: what profilers told us about each process, keyed by (pid, start time).

A reused pid never inherits a dead process's identity (NVML field case F16, pid reuse): a
declaration whose start time differs from the live process's (read from procfs through the
injected ``start_time_reader``) is not returned, and is released. The store is bounded: at
``max_processes`` a new pid first makes the store release exited or reused entries (a sweep over
procfs, at most once per ``sweep_interval_ns``), then the least recently declared ones; both are
counted. Exits and resynchronisations (``ProfilerIntegrationService``) release entries too.

Thread-safe: the gRPC servicer declares from several threads while the producer looks up. The
lock is never held during procfs reads or protobuf decoding.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gpumetrics.identity.declaration import (
    PID_MAX_LIMIT,
    DeclarationError,
    DeclarationInput,
    DeclarationLimits,
    Declared,
    validate_declaration,
    validate_pid,
    validate_start_time,
)

log = logging.getLogger(__name__)

StartTimeReader = Callable[[int], "int | None"]
"""pid → live start time in clock ticks (``/proc/<pid>/stat`` field 22), None if unknown."""


@dataclass(frozen=True, slots=True)
class DeclaredStoreStats:
    """Counters of a :class:`DeclaredStore` (cumulative, except ``processes``)."""

    processes: int
    max_processes: int
    declared: int
    rejected: int
    released_exit: int
    released_resync: int
    released_stale: int
    """Found stale by a lookup (the live process has another start time)."""
    evicted_stale: int
    """Released by a full-store sweep: exited or reused pid."""
    evicted_oldest: int


@dataclass(slots=True)
class _Entry:
    declared: Declared
    seq: int


@dataclass(slots=True)
class _Resync:
    begin_seq: int
    touched: set[int]


class DeclaredStore:
    """Bounded, thread-safe store of :class:`Declared` processes.

    Args:
        max_processes: most processes held (>= 1).
        max_process_context_bytes: largest accepted ``process_context`` payload.
        max_environment_bytes: largest sum of environment names and values per declaration.
        max_profiler_resource_bytes: largest accepted ``profiler_resource``.
        pid_max: largest accepted pid (default the kernel's ``PID_MAX_LIMIT``).
        clock: ns since the Unix epoch (``declared_at_ns`` and the sweep interval).
        start_time_reader: live start time of a pid; None disables pid-reuse checks.
        sweep_interval_ns: least time between two procfs sweeps of a full store.
        max_resyncs: most resynchronisations in progress at once (one per declarer); declarer
            names come from clients, so this bounds the state they can create.

    Raises:
        ValueError: a limit is not positive.

    """

    def __init__(
        self,
        max_processes: int = 100_000,
        max_process_context_bytes: int = 65536,
        max_environment_bytes: int = 65536,
        *,
        max_profiler_resource_bytes: int = 65536,
        pid_max: int = PID_MAX_LIMIT,
        clock: Callable[[], int] = time.time_ns,
        start_time_reader: StartTimeReader | None = None,
        sweep_interval_ns: int = 10_000_000_000,
        max_resyncs: int = 64,
    ) -> None:
        for name, value in (
            ("max_processes", max_processes),
            ("max_process_context_bytes", max_process_context_bytes),
            ("max_environment_bytes", max_environment_bytes),
            ("max_profiler_resource_bytes", max_profiler_resource_bytes),
            ("pid_max", pid_max),
            ("max_resyncs", max_resyncs),
        ):
            if value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value}")
        self._max = max_processes
        self._limits = DeclarationLimits(
            pid_max=pid_max,
            max_process_context_bytes=max_process_context_bytes,
            max_environment_bytes=max_environment_bytes,
            max_profiler_resource_bytes=max_profiler_resource_bytes,
        )
        self._clock = clock
        self._reader = start_time_reader
        self._sweep_ns = sweep_interval_ns
        self._last_sweep: int | None = None
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._resync: dict[str, _Resync] = {}
        self._max_resyncs = max_resyncs
        self._seq = 0
        self._lock = threading.Lock()
        self._n = dict.fromkeys(
            (
                "declared",
                "rejected",
                "released_exit",
                "released_resync",
                "released_stale",
                "evicted_stale",
                "evicted_oldest",
            ),
            0,
        )

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> DeclaredStoreStats:
        """Return the current counters."""
        with self._lock:
            return DeclaredStoreStats(
                processes=len(self._entries), max_processes=self._max, **self._n
            )

    def declare(
        self,
        pid: int,
        start_time_ticks: int,
        process_context: bytes,
        environment: Sequence[tuple[str, bytes]],
        profiler_resource: bytes,
        declarer: str = "",
    ) -> Declared:
        """Validate and hold one declaration (replacing what ``pid`` had).

        Args:
            pid: host pid, 1..``pid_max``.
            start_time_ticks: ``/proc/<pid>/stat`` field 22; 0 = unknown (matched on pid alone).
            process_context: serialized OTEP 4719 ``ProcessContext`` (b"" = none), ≤ the limit.
            environment: ``(name, raw value)`` pairs; names ``OTEL_*``, unique.
            profiler_resource: serialized ``opentelemetry.proto.resource.v1.Resource`` (b"" = none).
            declarer: id of the declaring connection (for resynchronisation).

        Returns:
            The held :class:`Declared`.

        Raises:
            DeclarationError: naming the field; nothing already held changes. During a resync
                of ``declarer`` a rejected pid still counts as re-declared, so its previous
                declaration is kept rather than released.

        """
        try:
            declared = validate_declaration(
                pid,
                start_time_ticks,
                process_context,
                environment,
                profiler_resource,
                declarer=declarer,
                declared_at_ns=self._clock(),
                limits=self._limits,
            )
        except DeclarationError:
            with self._lock:
                self._n["rejected"] += 1
                state = self._resync.get(declarer)
                if state is not None and isinstance(pid, int):
                    state.touched.add(pid)
            raise
        if pid not in self._entries and len(self._entries) >= self._max:
            self._maybe_sweep()
        with self._lock:
            self._seq += 1
            old = self._entries.pop(pid, None)
            if old is None:
                while len(self._entries) >= self._max:
                    self._entries.popitem(last=False)
                    self._n["evicted_oldest"] += 1
            self._entries[pid] = _Entry(declared, self._seq)
            self._n["declared"] += 1
            state = self._resync.get(declarer)
            if state is not None:
                state.touched.add(pid)
        return declared

    def _maybe_sweep(self) -> None:
        """Release exited/reused entries, reading procfs outside the lock."""
        if self._reader is None:
            return
        now = self._clock()
        with self._lock:
            if self._last_sweep is not None and now - self._last_sweep < self._sweep_ns:
                return
            self._last_sweep = now
            snapshot = [(pid, e) for pid, e in self._entries.items()]
        stale = []
        for pid, entry in snapshot:
            live = self._reader(pid)
            if live is None or (
                entry.declared.start_time_ticks and live != entry.declared.start_time_ticks
            ):
                stale.append((pid, entry))
        with self._lock:
            for pid, entry in stale:
                if self._entries.get(pid) is entry:
                    del self._entries[pid]
                    self._n["evicted_stale"] += 1

    def exit(self, pid: int, start_time_ticks: int = 0) -> int:
        """Release ``pid`` after it exited.

        Args:
            pid: the pid, 1..``pid_max``.
            start_time_ticks: 0 releases whatever ``pid`` holds; otherwise only a declaration
                with that start time (or with an unknown one).

        Returns:
            The number of declarations released (0 or 1).

        Raises:
            DeclarationError: field ``pid`` or ``start_time_ticks`` out of range.

        """
        validate_pid(pid, self._limits.pid_max)
        validate_start_time(start_time_ticks)
        with self._lock:
            entry = self._entries.get(pid)
            if entry is None:
                return 0
            held = entry.declared.start_time_ticks
            if start_time_ticks and held and held != start_time_ticks:
                return 0
            del self._entries[pid]
            self._n["released_exit"] += 1
            return 1

    def begin_resync(self, declarer: str) -> None:
        """Start a resynchronisation of ``declarer``.

        Its declarations until :meth:`end_resync` are its complete view. A second begin
        restarts it.

        Raises:
            DeclarationError: field ``resync_begin`` when ``max_resyncs`` other declarers are
                already resynchronising.

        """
        with self._lock:
            if declarer not in self._resync and len(self._resync) >= self._max_resyncs:
                raise DeclarationError(
                    "resync_begin",
                    f"{self._max_resyncs} resynchronisations already in progress",
                )
            self._resync[declarer] = _Resync(self._seq, set())

    def abort_resync(self, declarer: str) -> bool:
        """Abandon ``declarer``'s resynchronisation without releasing anything.

        Used when the stream that began it ends before ``ResyncEnd``: what was declared stays
        held, and the next begin starts afresh.

        Returns:
            True when a resynchronisation was in progress.

        """
        with self._lock:
            return self._resync.pop(declarer, None) is not None

    def end_resync(self, declarer: str) -> int:
        """End a resynchronisation of ``declarer``.

        Releases what ``declarer`` declared before it began and did not declare since.

        Returns:
            The number of declarations released.

        Raises:
            DeclarationError: field ``resync_end`` when no resync of ``declarer`` is in progress.

        """
        with self._lock:
            state = self._resync.pop(declarer, None)
            if state is None:
                raise DeclarationError("resync_end", "no resynchronisation in progress")
            gone = [
                pid
                for pid, e in self._entries.items()
                if e.declared.declarer == declarer
                and e.seq <= state.begin_seq
                and pid not in state.touched
            ]
            for pid in gone:
                del self._entries[pid]
            self._n["released_resync"] += len(gone)
            return len(gone)

    def replace_all(
        self,
        declarer: str,
        declarations: Iterable[DeclarationInput],
        on_error: Callable[[int, DeclarationError], None] | None = None,
    ) -> int:
        """Declare a batch that is ``declarer``'s complete view (``replace_all=true``).

        Each entry is validated on its own; a rejected one is passed to ``on_error(index,
        error)`` (or logged at WARNING when None) and never affects the others.

        Returns:
            The number of earlier declarations released because the batch omitted them.

        """
        self.begin_resync(declarer)
        for index, item in enumerate(declarations):
            pid, start, ctx, env, res = item
            try:
                self.declare(pid, start, ctx, env, res, declarer)
            except DeclarationError as exc:
                if on_error is not None:
                    on_error(index, exc)
                else:
                    log.warning("declaration %d (pid %s) rejected: %s", index, pid, exc)
        return self.end_resync(declarer)

    def lookup(self, pid: int) -> tuple[Declared | None, bool]:
        """Return ``(declared, True)`` for a live declared ``pid``, else ``(None, False)``.

        The seed's ``DeclaredLookup``. The live start time is read through
        ``start_time_reader``; see :meth:`get`.
        """
        live = self._reader(pid) if self._reader is not None else None
        return self.get(pid, live)

    def get(self, pid: int, live_start_time_ticks: int | None) -> tuple[Declared | None, bool]:
        """Like :meth:`lookup`, with the live start time already read by the caller.

        A declaration with a known start time that differs from ``live_start_time_ticks`` belongs
        to a dead process whose pid was reused: it is released and not returned. When the live
        start time is unknown (None: process gone or not visible) it cannot be disproved and is
        returned.
        """
        with self._lock:
            entry = self._entries.get(pid)
            if entry is None:
                return None, False
            held = entry.declared.start_time_ticks
            if held and live_start_time_ticks is not None and held != live_start_time_ticks:
                del self._entries[pid]
                self._n["released_stale"] += 1
                return None, False
            return entry.declared, True
