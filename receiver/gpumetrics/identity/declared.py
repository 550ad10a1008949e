"""The declared store: what profilers told us about each process, keyed by (pid, start time).

A reused pid never inherits a dead process's identity (NVML field case F16, pid reuse): a
declaration whose start time differs from the live process's (read from procfs through the
injected ``start_time_reader``) is not returned, and is released. Exits and resynchronisations
(``ProfilerIntegrationService``) release entries too.

The store is bounded twice:

* by **count**: at ``max_processes`` a new pid first makes the store release exited or reused
  entries (a sweep over procfs, at most once per ``sweep_interval_ns``), then the least recently
  declared ones; both are counted;
* by **bytes held**: every entry is charged its decoded size
  (:func:`~gpumetrics.identity.footprint.declared_bytes`), and a declaration that would take the
  total past ``max_bytes`` is rejected (after the same sweep), naming the limit; nothing held is
  evicted to make room for it.

A resynchronisation is a :class:`Resync` handle owned by whoever began it (one stream, one
``replace_all`` call): two streams of the same declarer, say an agent that reconnected while its
old stream is still open, each have their own. It holds no per-pid state: a re-declaration gets a
newer sequence, and a *rejected* re-declaration of a pid the declarer holds marks that entry as
re-declared too, so what it had is kept; ending the resync releases the declarer's entries older
than its beginning.

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
from gpumetrics.identity.footprint import declared_bytes
from gpumetrics.identity.limits import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_ENVIRONMENT_BYTES,
    DEFAULT_MAX_PROCESS_CONTEXT_BYTES,
    DEFAULT_MAX_PROCESSES,
    DEFAULT_MAX_PROFILER_RESOURCE_BYTES,
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
    held_bytes: int = 0
    """Estimated memory of the declarations held (By)."""
    max_bytes: int = 0
    rejected_bytes: int = 0
    """Declarations rejected because they did not fit ``max_bytes`` (part of ``rejected``)."""


@dataclass(slots=True)
class _Entry:
    declared: Declared
    seq: int
    size: int


@dataclass(slots=True, eq=False)
class Resync:
    """A resynchronisation in progress, returned by :meth:`DeclaredStore.begin_resync`.

    Attributes:
        declarer: whose declarations it replaces.
        begin_seq: the store's sequence when it began; the declarer's entries not re-declared
            since (sequence <= this) are released by :meth:`DeclaredStore.end_resync`.

    """

    declarer: str
    begin_seq: int


def _wire_size(process_context: object, environment: object, profiler_resource: object) -> int:
    """Bytes of the declaration's fields as received (0 when a field is not bytes-like)."""
    try:
        total = len(process_context) + len(profiler_resource)  # type: ignore[arg-type]
        for name, value in environment:  # type: ignore[attr-defined]
            total += len(name) + len(value)
    except (TypeError, ValueError):
        return 0  # the validation names the field
    return total


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
        max_resyncs: most resynchronisations in progress at once (one per open stream or
            ``replace_all`` call); each holds two fields, whatever its declarer does.
        max_bytes: most memory (By) the decoded declarations may hold, estimated by
            :func:`~gpumetrics.identity.footprint.declared_bytes`.

    Raises:
        ValueError: a limit is not positive.

    """

    def __init__(
        self,
        max_processes: int = DEFAULT_MAX_PROCESSES,
        max_process_context_bytes: int = DEFAULT_MAX_PROCESS_CONTEXT_BYTES,
        max_environment_bytes: int = DEFAULT_MAX_ENVIRONMENT_BYTES,
        *,
        max_profiler_resource_bytes: int = DEFAULT_MAX_PROFILER_RESOURCE_BYTES,
        pid_max: int = PID_MAX_LIMIT,
        clock: Callable[[], int] = time.time_ns,
        start_time_reader: StartTimeReader | None = None,
        sweep_interval_ns: int = 10_000_000_000,
        max_resyncs: int = 64,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        for name, value in (
            ("max_bytes", max_bytes),
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
        self._resyncs: set[Resync] = set()
        self._max_resyncs = max_resyncs
        self._max_bytes = max_bytes
        self._bytes = 0
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
                "rejected_bytes",
            ),
            0,
        )

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held_bytes(self) -> int:
        """Estimated memory of the declarations held (By)."""
        return self._bytes

    def stats(self) -> DeclaredStoreStats:
        """Return the current counters."""
        with self._lock:
            return DeclaredStoreStats(
                processes=len(self._entries),
                max_processes=self._max,
                held_bytes=self._bytes,
                max_bytes=self._max_bytes,
                **self._n,
            )

    def declare(
        self,
        pid: int,
        start_time_ticks: int,
        process_context: bytes,
        environment: Sequence[tuple[str, bytes]],
        profiler_resource: bytes,
        declarer: str = "",
        schema_url: str = "",
    ) -> Declared:
        """Validate and hold one declaration (replacing what ``pid`` had).

        Args:
            pid: host pid, 1..``pid_max``.
            start_time_ticks: ``/proc/<pid>/stat`` field 22; 0 = unknown (matched on pid alone).
            process_context: serialized OTEP 4719 ``ProcessContext`` (b"" = none), ≤ the limit.
            environment: ``(name, raw value)`` pairs; names non-empty, without ``=`` or NUL,
                unique (any captured variable, not only ``OTEL_*``).
            profiler_resource: serialized ``opentelemetry.proto.resource.v1.Resource`` (b"" = none).
            declarer: id of the declaring connection (for resynchronisation).
            schema_url: the schema URL of ``profiler_resource`` ("" = none), at most
                :data:`~gpumetrics.identity.declaration.MAX_SCHEMA_URL_BYTES` bytes.

        Returns:
            The held :class:`Declared`.

        Raises:
            DeclarationError: naming the field; nothing already held changes. A declaration
                that does not fit ``max_bytes`` is rejected as a whole (empty ``field``), with
                a reason naming ``identity.declared.max_bytes``. When ``pid`` already holds a
                declaration of the same ``declarer``, a rejected one counts as a re-declaration
                for the resynchronisations in progress, so what it had is kept.

        """
        wire = _wire_size(process_context, environment, profiler_resource)
        if wire and not self._may_fit(pid, wire):
            # decoded attributes take at least their wire size: refuse before decoding
            self._reject(pid, declarer, rejected_bytes=True)
            raise self._too_big(f"at least {wire} bytes", pid)
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
                schema_url=schema_url,
            )
        except DeclarationError:
            self._reject(pid, declarer)
            raise
        size = declared_bytes(declared)
        with self._lock:
            full = size > self._free_for(pid) or (
                pid not in self._entries and len(self._entries) >= self._max
            )
        if full:
            self._maybe_sweep()
        with self._lock:
            if size <= self._free_for(pid):
                old = self._entries.get(pid)
                self._seq += 1
                if old is not None:
                    self._remove(pid)
                else:
                    while len(self._entries) >= self._max:
                        self._remove(next(iter(self._entries)))
                        self._n["evicted_oldest"] += 1
                self._entries[pid] = _Entry(declared, self._seq, size)
                self._bytes += size
                self._n["declared"] += 1
                return declared
        self._reject(pid, declarer, rejected_bytes=True)
        raise self._too_big(f"about {size} bytes once decoded", pid)

    def _free_for(self, pid: object) -> int:
        """Bytes a declaration of ``pid`` may take (what it replaces counts as free)."""
        held = self._entries.get(pid) if isinstance(pid, int) else None
        return self._max_bytes - self._bytes + (held.size if held else 0)

    def _may_fit(self, pid: object, wire: int) -> bool:
        """Whether ``wire`` bytes could fit, after releasing exited and reused pids if needed."""
        with self._lock:
            if wire <= self._free_for(pid):
                return True
        self._maybe_sweep()
        with self._lock:
            return wire <= self._free_for(pid)

    def _too_big(self, needs: str, pid: object) -> DeclarationError:
        with self._lock:
            free = max(0, self._free_for(pid))
        return DeclarationError(
            "",
            f"needs {needs} and only {free} of {self._max_bytes} bytes are free "
            "(identity.declared.max_bytes); declare fewer or smaller attributes, or raise the "
            "limit",
        )

    def _reject(self, pid: object, declarer: str, rejected_bytes: bool = False) -> None:
        """Count a rejected declaration; keep a same-declarer entry of ``pid`` for resyncs."""
        with self._lock:
            self._n["rejected"] += 1
            self._n["rejected_bytes"] += rejected_bytes
            entry = self._entries.get(pid) if isinstance(pid, int) else None
            if entry is not None and entry.declared.declarer == declarer:
                self._seq += 1
                entry.seq = self._seq

    def _remove(self, pid: int) -> None:
        """Forget ``pid`` and its bytes (under the lock)."""
        entry = self._entries.pop(pid)
        self._bytes -= entry.size

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
                    self._remove(pid)
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
            self._remove(pid)
            self._n["released_exit"] += 1
            return 1

    def begin_resync(self, declarer: str) -> Resync:
        """Start a resynchronisation of ``declarer``; return its handle.

        The declarer's declarations from now until :meth:`end_resync` of this handle are its
        complete view. Each caller (a stream, a ``replace_all`` call) has its own handle: another
        stream of the same declarer neither restarts nor ends it.

        Raises:
            DeclarationError: field ``resync_begin`` when ``max_resyncs`` are in progress.

        """
        with self._lock:
            if len(self._resyncs) >= self._max_resyncs:
                raise DeclarationError(
                    "resync_begin",
                    f"{self._max_resyncs} resynchronisations already in progress",
                )
            resync = Resync(declarer, self._seq)
            self._resyncs.add(resync)
            return resync

    def abort_resync(self, resync: Resync) -> bool:
        """Abandon ``resync`` without releasing anything.

        Used when the stream that began it ends before ``ResyncEnd``, or begins another one:
        what was declared stays held.

        Returns:
            True when it was in progress.

        """
        with self._lock:
            if resync in self._resyncs:
                self._resyncs.discard(resync)
                return True
            return False

    def end_resync(self, resync: Resync) -> int:
        """End ``resync``: release what its declarer declared before it began and not since.

        Returns:
            The number of declarations released.

        Raises:
            DeclarationError: field ``resync_end`` when ``resync`` is not in progress.

        """
        with self._lock:
            if resync not in self._resyncs:
                raise DeclarationError("resync_end", "no resynchronisation in progress")
            self._resyncs.discard(resync)
            gone = [
                pid
                for pid, e in self._entries.items()
                if e.declared.declarer == resync.declarer and e.seq <= resync.begin_seq
            ]
            for pid in gone:
                self._remove(pid)
            self._n["released_resync"] += len(gone)
            return len(gone)

    @property
    def resyncs_in_progress(self) -> int:
        """Resynchronisations begun and not yet ended or abandoned."""
        with self._lock:
            return len(self._resyncs)

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
        resync = self.begin_resync(declarer)
        try:
            for index, item in enumerate(declarations):
                pid, start, ctx, env, res, schema = item
                try:
                    self.declare(pid, start, ctx, env, res, declarer, schema)
                except DeclarationError as exc:
                    if on_error is not None:
                        on_error(index, exc)
                    else:
                        log.warning("declaration %d (pid %s) rejected: %s", index, pid, exc)
        except BaseException:
            self.abort_resync(resync)
            raise
        return self.end_resync(resync)

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
                self._remove(pid)
                self._n["released_stale"] += 1
                return None, False
            return entry.declared, True
