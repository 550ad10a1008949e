"""Reading a process's OTEP 4719 process context (its ``OTEL_CTX`` mapping) from outside.

Layout, publication and reader protocol: OTEP 4719 ("Header Structure", "Reading Protocol",
https://github.com/open-telemetry/opentelemetry-specification/blob/main/oteps/profiles/4719-process-ctx.md),
opentelemetry-proto's notes
(https://github.com/open-telemetry/opentelemetry-proto/blob/main/docs/process-context/process-context.md),
the C publisher in open-telemetry/sig-profiling (``process-context/c-and-cpp/``) and the eBPF
profiler's reader (``processcontext/processcontext.go`` in
open-telemetry/opentelemetry-ebpf-profiler).

1. Find the mapping in ``<proc_root>/<pid>/maps``: the first non-executable line whose pathname
   starts with ``[anon_shmem:OTEL_CTX]``, ``[anon:OTEL_CTX]`` or ``/memfd:OTEL_CTX`` (so
   ``/memfd:OTEL_CTX (deleted)`` matches). Its start address is the header address. The address
   is cached per (pid, start time); a pid without a mapping is scanned again after
   ``rescan_interval_ns`` (late publication).
2. Read the 32-byte header with ``os.pread`` on ``<proc_root>/<pid>/mem`` (the file offset is the
   virtual address): signature ``OTEL_CTX`` (8 bytes, no NUL) at 0, version ``u32`` = 2 at 8,
   payload size ``u32`` at 12 (1..65 536), ``monotonic_published_at_ns`` ``u64`` at 16 (0 = update
   in progress: retry), payload address ``u64`` at 24; native byte order (little-endian hosts).
3. If the timestamp equals the cached one, the cached payload is still valid (no payload read).
4. Otherwise read ``payload_size`` bytes at the payload address, re-read the timestamp; if it
   changed, retry from 2. At most ``max_attempts`` attempts; if they are all torn, the previous
   context (if any) is kept, as the eBPF profiler does.
5. Decode the ``ProcessContext`` protobuf (:mod:`gpumetrics.identity.ctxproto`).

Reading another process's memory needs ptrace-read access (same uid and Yama ``ptrace_scope``
allowing it, or ``CAP_SYS_PTRACE``); ``EACCES``, ``EIO``, ``ESRCH`` and short reads (the process
exited mid-read) all end in "no context" (:attr:`ReadStatus.UNREADABLE`), never an exception.
The caller must only pass pids of the procfs's own pid namespace (see
:class:`gpumetrics.identity.procfs.ProcfsReader`).
"""

from __future__ import annotations

import enum
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpumetrics.identity.attrs import AttrValue
from gpumetrics.identity.ctxproto import ProcessContextDecodeError, decode_process_context

HEADER_SIZE = 32
SIGNATURE = b"OTEL_CTX"
VERSION = 2
MAX_PAYLOAD_BYTES = 65536
"""Largest accepted ``payload_size`` (the eBPF profiler's limit)."""
MAPPING_PREFIXES = ("[anon_shmem:OTEL_CTX]", "[anon:OTEL_CTX]", "/memfd:OTEL_CTX")
_HEADER = struct.Struct("=8sIIQQ")  # native byte order, no padding: offsets 0, 8, 12, 16, 24
_U64 = struct.Struct("=Q")
_TS_OFFSET = 16
_MAX_MAPS_BYTES = 64 << 20


class ReadStatus(enum.Enum):
    """Outcome of one :meth:`ProcessContextReader.read`."""

    OK = "ok"
    NO_MAPPING = "no_mapping"
    UNREADABLE = "unreadable"
    BAD_SIGNATURE = "bad_signature"
    BAD_VERSION = "bad_version"
    BAD_SIZE = "bad_size"
    IN_PROGRESS = "in_progress"
    CONCURRENT_UPDATE = "concurrent_update"
    DECODE_ERROR = "decode_error"


@dataclass(frozen=True, slots=True)
class Header:
    """The 32-byte ``OTEL_CTX`` header."""

    signature: bytes
    version: int
    payload_size: int
    published_at_ns: int
    """``CLOCK_BOOTTIME`` ns of publication; 0 while an update is in progress."""
    payload_addr: int


@dataclass(frozen=True, slots=True)
class ProcessContext:
    """A process context read from a live process."""

    resource: dict[str, AttrValue]
    attributes: dict[str, AttrValue]
    published_at_ns: int


@dataclass(frozen=True, slots=True)
class ContextRead:
    """What a read found: ``context`` (None when there is none to use) and why."""

    context: ProcessContext | None
    status: ReadStatus
    cached: bool = False


class MemFile(Protocol):
    """An open ``/proc/<pid>/mem``."""

    def pread(self, size: int, offset: int) -> bytes:
        """Read up to ``size`` bytes at virtual address ``offset`` (OSError on failure)."""

    def close(self) -> None:
        """Release the file."""


class _OsMemFile:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def close(self) -> None:
        os.close(self._fd)


def parse_header(data: bytes) -> Header:
    """Parse 32 header bytes (fixed offsets 0/8/12/16/24, native byte order)."""
    sig, version, size, ts, addr = _HEADER.unpack(data)
    return Header(sig, version, size, ts, addr)


def find_mapping(maps_path: str, max_bytes: int = _MAX_MAPS_BYTES) -> int | None:
    """Return the start address of the ``OTEL_CTX`` mapping listed in ``maps_path``, or None.

    None also when the file is unreadable or the first ``max_bytes`` bytes have no such line.
    """
    try:
        with open(maps_path, "rb") as fh:
            seen = 0
            for line in fh:
                seen += len(line)
                if seen > max_bytes:
                    return None
                if b"OTEL_CTX" not in line:
                    continue
                parts = line.rstrip(b"\n").split(None, 5)
                if len(parts) < 6 or len(parts[1]) < 3 or parts[1][2:3] == b"x":
                    continue
                name = parts[5].decode("utf-8", "replace")
                if not name.startswith(MAPPING_PREFIXES):
                    continue
                start_s, _, end_s = parts[0].partition(b"-")
                try:
                    start, end = int(start_s, 16), int(end_s, 16)
                except ValueError:
                    continue
                if end - start >= HEADER_SIZE:
                    return start
    except OSError:
        return None
    return None


@dataclass(slots=True)
class _Entry:
    start_time_ticks: int
    addr: int | None
    scanned_at_ns: int
    context: ProcessContext | None = None


class ProcessContextReader:
    """Reads and caches OTEP 4719 process contexts of live processes.

    Args:
        proc_root: procfs root (``/proc`` or ``/host/proc``).
        max_attempts: seqlock attempts per read (the eBPF profiler uses 3).
        max_payload_bytes: largest accepted ``payload_size``.
        rescan_interval_ns: how long "no mapping" is remembered before ``maps`` is scanned again.
        cache_size: processes remembered (least recently read evicted first).
        clock: monotonic ns clock for the rescan interval.
        opener: opens ``<proc_root>/<pid>/mem`` (tests inject faults here).

    Thread-safe.

    """

    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        max_attempts: int = 3,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
        rescan_interval_ns: int = 30_000_000_000,
        cache_size: int = 16384,
        clock: Callable[[], int] = time.monotonic_ns,
        opener: Callable[[str], MemFile] = _OsMemFile,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts: must be >= 1")
        self._root = proc_root.rstrip("/") or "/"
        self._attempts = max_attempts
        self._max_payload = max_payload_bytes
        self._rescan_ns = rescan_interval_ns
        self._cache_size = cache_size
        self._clock = clock
        self._open = opener
        self._cache: OrderedDict[int, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._counts: dict[ReadStatus, int] = dict.fromkeys(ReadStatus, 0)

    def stats(self) -> dict[str, int]:
        """Return reads by outcome (``ReadStatus`` value → count) and ``cached_processes``."""
        with self._lock:
            out = {s.value: n for s, n in self._counts.items()}
            out["cached_processes"] = len(self._cache)
        return out

    def forget(self, pid: int) -> None:
        """Drop what is cached for ``pid`` (e.g. when it exited)."""
        with self._lock:
            self._cache.pop(pid, None)

    def read(self, pid: int, start_time_ticks: int) -> ContextRead:
        """Return the current process context of ``pid`` (whose stat start time is given)."""
        entry = self._entry(pid, start_time_ticks)
        result = self._read(pid, entry)
        with self._lock:
            self._counts[result.status] += 1
            if result.status is ReadStatus.OK:
                entry.context = result.context
            elif result.status is ReadStatus.UNREADABLE:
                self._cache.pop(pid, None)
            elif result.status not in (ReadStatus.IN_PROGRESS, ReadStatus.CONCURRENT_UPDATE):
                entry.context = None
        return result

    def _entry(self, pid: int, start: int) -> _Entry:
        now = self._clock()
        with self._lock:
            entry = self._cache.get(pid)
            if entry is not None and entry.start_time_ticks == start:
                self._cache.move_to_end(pid)
                if entry.addr is not None or now - entry.scanned_at_ns < self._rescan_ns:
                    return entry
        addr = find_mapping(f"{self._root}/{pid}/maps")
        with self._lock:
            old = self._cache.get(pid)
            keep = old.context if old is not None and old.start_time_ticks == start else None
            entry = _Entry(start, addr, now, keep)
            self._cache[pid] = entry
            self._cache.move_to_end(pid)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return entry

    def _read(self, pid: int, entry: _Entry) -> ContextRead:
        if entry.addr is None:
            return ContextRead(None, ReadStatus.NO_MAPPING)
        try:
            mem = self._open(f"{self._root}/{pid}/mem")
        except OSError:
            return ContextRead(None, ReadStatus.UNREADABLE)
        try:
            return self._seqlock_read(mem, entry, entry.addr)
        finally:
            mem.close()

    def _seqlock_read(self, mem: MemFile, entry: _Entry, addr: int) -> ContextRead:
        status = ReadStatus.IN_PROGRESS
        for _ in range(self._attempts):
            raw = _pread(mem, HEADER_SIZE, addr)
            if raw is None:
                return ContextRead(None, ReadStatus.UNREADABLE)
            hdr = parse_header(raw)
            if hdr.signature != SIGNATURE:
                entry.addr, entry.scanned_at_ns = None, 0  # rescan next time
                return ContextRead(None, ReadStatus.BAD_SIGNATURE)
            if hdr.version != VERSION:
                return ContextRead(None, ReadStatus.BAD_VERSION)
            if hdr.published_at_ns == 0:
                status = ReadStatus.IN_PROGRESS
                continue
            if not 0 < hdr.payload_size <= self._max_payload:
                return ContextRead(None, ReadStatus.BAD_SIZE)
            cached = entry.context
            if cached is not None and cached.published_at_ns == hdr.published_at_ns:
                return ContextRead(cached, ReadStatus.OK, cached=True)
            payload = _pread(mem, hdr.payload_size, hdr.payload_addr)
            again = _pread(mem, 8, addr + _TS_OFFSET)
            if again is None:
                return ContextRead(None, ReadStatus.UNREADABLE)
            if _U64.unpack(again)[0] != hdr.published_at_ns:
                status = ReadStatus.CONCURRENT_UPDATE
                continue
            if payload is None:
                return ContextRead(None, ReadStatus.UNREADABLE)
            try:
                decoded = decode_process_context(payload)
            except ProcessContextDecodeError:
                return ContextRead(None, ReadStatus.DECODE_ERROR)
            ctx = ProcessContext(decoded.resource, decoded.attributes, hdr.published_at_ns)
            return ContextRead(ctx, ReadStatus.OK)
        return ContextRead(entry.context, status)


def _pread(mem: MemFile, size: int, offset: int) -> bytes | None:
    try:
        data = mem.pread(size, offset)
    except (OSError, OverflowError):
        return None
    return data if len(data) == size else None
