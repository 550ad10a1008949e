"""Running-process lists (compute, graphics, MPS) → process memory and per-list counts.

The metrics are ``nvidia.gpu.process.memory.usage`` and ``nvidia.gpu.process.count``.

**Which symbol.** For each list the newest symbol the driver exports is used, decided from the
symbols probed at init, never from the version number (F04, F05): ``…RunningProcesses_v3``
(24-byte records with MIG ids), else ``_v2`` (same layout), else the unversioned v1 symbol,
read with its own 16-byte record (``pid`` u32, ``usedGpuMemory`` u64; MIG ids absent), since
nvidia-ml-py 13.x has no v1 wrapper and its unversioned wrapper calls ``_v3`` (F02, F04 on 440).
Every list is read with one C call into a kept buffer once its size is known
(:mod:`gpumetrics.nvml.records`).
A symbol that answers FUNCTION_NOT_FOUND at run time (or ``NVMLLibraryMismatchError``) is
disabled and the next older one is tried in the same tick. A driver without any of them gives
no process metrics and one WARNING naming the missing symbols. A list that answers
NOT_SUPPORTED (Jetson, F30) or NO_PERMISSION is a capability of the device: the older symbols
of that list are disabled with it, and nothing claims a symbol is missing.

**Growing lists.** The list can grow between the sizing and the data call; nvidia-ml-py then
raises INSUFFICIENT_SIZE without retrying. The call is retried up to
``insufficient_size_attempts`` times (default 3); intermediate INSUFFICIENT_SIZE answers are not
errors; exhausting the attempts drops the device's process lists for the tick, counted as an
error and as ``values.dropped{reason=insufficient_size}`` (F20).

**Validation (F01).** R535.43–~535.86 write 32-byte records into 24-byte strides without a
version bump, which reads as pid, 0, 0xFFFFFFFF... Every entry is checked: pid within
1..``pid_max``; memory the not-available value (→ None) or at most the device total; MIG ids
0xFFFFFFFF (→ None) or small. If any entry fails, all of this device's process lists are dropped
for the tick and counted as ``values.dropped{reason=process_struct_mismatch}``, logged once with
the driver version; device metrics are unaffected.

**Merging.** A pid in several lists (a "C+G" process) is one process; its memory is the first
known value (compute, graphics, MPS order), so it is never counted twice. The per-list count
(``nvidia.gpu.process.count``) counts each list's entries, so a C+G process is in two.
"""

from __future__ import annotations

import ctypes
import logging
import struct
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from typing import Any, cast

import pynvml

from gpumetrics.metrics import names
from gpumetrics.metrics.buffer import Attributes
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.convert import U32_NA, U64_NA
from gpumetrics.nvml.device import MAX_MIG_ID, Device
from gpumetrics.nvml.query import ErrorKind, QueryError, binding
from gpumetrics.nvml.records import PROCESS_V2, layout, running_processes

LISTS = ("Compute", "Graphics", "MPSCompute")
LIST_TYPES = {"Compute": "compute", "Graphics": "graphics", "MPSCompute": "mps"}
"""Each list's ``nvidia.gpu.process.type``."""
INSUFFICIENT_SIZE = frozenset({pynvml.NVML_ERROR_INSUFFICIENT_SIZE})


@dataclass(frozen=True, slots=True)
class ProcessEntry:
    """One validated process-list entry.

    Attributes:
        pid: host pid (NVML always reports host pids, F15).
        used_bytes: GPU memory used, or None when NVML says not available.
        gpu_instance_id / compute_instance_id: MIG ids, or None (not MIG, or a v1 record).

    """

    pid: int
    used_bytes: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None


class _ProcessInfoV1(ctypes.Structure):
    """``nvmlProcessInfo_v1_t``: 16 bytes on x86-64 (u32 pid, 4 bytes padding, u64 memory)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


PROCESS_V1 = layout(_ProcessInfoV1)
"""The records of the unversioned (v1) symbols, which nvidia-ml-py 13.x has no wrapper for."""


def _symbols(kind: str) -> tuple[tuple[str, Callable[..., Any] | None], ...]:
    """Return the list's symbols, newest first, each with its reader (None: not in the binding)."""
    base = f"nvmlDeviceGet{kind}RunningProcesses"
    return (
        (f"{base}_v3", _reader(f"{base}_v3", PROCESS_V2)),
        (f"{base}_v2", _reader(f"{base}_v2", PROCESS_V2)),
        (base, partial(running_processes, base, record=PROCESS_V1)),
    )


def _reader(symbol: str, record: struct.Struct) -> Callable[..., Any] | None:
    # the binding's wrapper must exist (the versions it knows), though the call goes to the
    # C symbol directly with a kept buffer (gpumetrics.nvml.records)
    if binding(symbol) is None:
        return None
    return partial(running_processes, symbol, record=record)


_SYMBOLS = {kind: _symbols(kind) for kind in LISTS}


class ListUnavailable(Exception):
    """A device's process lists cannot be trusted this tick (retries exhausted, mismatch)."""


def _read_list(dev: Device, tick: Tick, kind: str) -> list[Any] | None:
    """Raw entries of one list from the newest working symbol; None when no symbol works."""
    c = dev.calls
    attempts = tick.ctx.settings.insufficient_size_attempts
    symbols = _SYMBOLS[kind]
    for n, (symbol, fn) in enumerate(symbols):
        if fn is None or not c.enabled(symbol):
            continue
        for _ in range(attempts):
            try:
                return c.query(
                    symbol,
                    symbol,
                    fn,
                    dev.handle,
                    dev.records,
                    missing_level=logging.DEBUG,
                    retry_codes=INSUFFICIENT_SIZE,
                )
            except QueryError as err:
                if err.code in INSUFFICIENT_SIZE:
                    last = err
                    continue
                if err.kind is ErrorKind.FUNCTION_MISSING:
                    break
                if err.kind is ErrorKind.NOT_FOUND:
                    return []
                if err.kind in (ErrorKind.UNSUPPORTED, ErrorKind.NO_PERMISSION):
                    # the device cannot list these processes: the older symbols read the same
                    # list and would say the same (a capability, not a missing symbol; F30)
                    for older, _ in symbols[n + 1 :]:
                        c.disable(older, err.kind)
                return None
        else:
            c.record(last)
            c.drop(symbol, "insufficient_size", detail=f"after {attempts} attempts")
            raise ListUnavailable(symbol)
    disabled = c.disabled()
    missing = [
        s for s, fn in symbols if fn is None or disabled.get(s) is ErrorKind.FUNCTION_MISSING
    ]
    if len(missing) == len(symbols) and not dev.state.get(f"no_{kind}_symbol"):
        dev.state[f"no_{kind}_symbol"] = True
        tick.ctx.log.warning(
            "GPU %s: no usable %s process-list symbol (%s missing); %s process metrics absent",
            dev.uuid,
            kind,
            ", ".join(missing),
            kind.lower(),
        )
    return None


def _entry(raw: tuple[Any, ...], pid_max: int, total: int | None) -> ProcessEntry | None:
    """Validate one record ``(pid, usedGpuMemory[, gpuInstanceId, computeInstanceId])``."""
    pid, mem = raw[0], raw[1]
    if mem == U64_NA:
        mem = None
    if not 1 <= pid <= pid_max:
        return None
    if mem is not None and total is not None and mem > total:
        return None
    if len(raw) < 4:  # a v1 record: no MIG ids
        return ProcessEntry(pid, mem, None, None)
    ids: list[int | None] = []
    for v in raw[2:4]:
        if v == U32_NA:
            ids.append(None)
        elif 0 <= v < MAX_MIG_ID:
            ids.append(v)
        else:
            return None
    return ProcessEntry(pid, mem, ids[0], ids[1])


class ProcessTable:
    """The running processes of one device in one tick, merged over its lists: a row per pid.

    Columns, in the order the lists gave the pids (compute, then graphics, then MPS):

    Attributes:
        pids: host pids (NVML always reports host pids, F15), each once.
        used_bytes: GPU memory used per pid, or None where NVML says not available.
        gpu_instance_ids / compute_instance_ids: MIG ids per pid, or None (not MIG, v1 record).

    """

    __slots__ = ("pids", "used_bytes", "gpu_instance_ids", "compute_instance_ids", "_set")

    def __init__(
        self,
        pids: Sequence[int],
        used_bytes: Sequence[int | None],
        gpu_instance_ids: Sequence[int | None],
        compute_instance_ids: Sequence[int | None],
    ) -> None:
        self.pids = pids
        self.used_bytes = used_bytes
        self.gpu_instance_ids = gpu_instance_ids
        self.compute_instance_ids = compute_instance_ids
        self._set: frozenset[int] | None = None

    def keys(self) -> frozenset[int]:
        """Return the pids, as a set."""
        if self._set is None:
            self._set = frozenset(self.pids)
        return self._set

    def __contains__(self, pid: object) -> bool:
        return pid in self.keys()

    def __len__(self) -> int:
        return len(self.pids)

    def entries(self) -> dict[int, ProcessEntry]:
        """Return the rows as :class:`ProcessEntry` by pid (tests and diagnostics)."""
        return {
            pid: ProcessEntry(pid, used, gi, ci)
            for pid, used, gi, ci in zip(
                self.pids,
                self.used_bytes,
                self.gpu_instance_ids,
                self.compute_instance_ids,
                strict=True,
            )
        }

    @classmethod
    def of(cls, entries: Iterable[ProcessEntry]) -> ProcessTable:
        """Build a table from entries (one per pid)."""
        rows = list(entries)
        return cls(
            [e.pid for e in rows],
            [e.used_bytes for e in rows],
            [e.gpu_instance_id for e in rows],
            [e.compute_instance_id for e in rows],
        )


def _none_for(column: Sequence[int], sentinel: int) -> Sequence[int | None]:
    """``column`` with NVML's not-available ``sentinel`` as None (the column itself if none)."""
    if sentinel not in column:
        return column
    return [None if v == sentinel else v for v in column]


def _columns(raw: list[tuple[Any, ...]], pid_max: int, total: int | None) -> ProcessTable | None:
    """Validate one list's records as columns (:func:`_entry`'s rules); None when one fails.

    C-level scans only (``zip(*)``, ``min``/``max``, sets): the records pass or the caller
    looks for the one that fails with :func:`_entry`.
    """
    cols = list(zip(*raw, strict=True))
    pids, mem = cols[0], cols[1]
    if min(pids) < 1 or max(pids) > pid_max:
        return None
    known = [v for v in mem if v != U64_NA] if U64_NA in mem else mem
    if total is not None and known and max(known) > total:
        return None
    if len(cols) < 4:  # v1 records: no MIG ids
        none = [None] * len(pids)
        return ProcessTable(pids, _none_for(mem, U64_NA), none, none)
    ids = []
    for col in cols[2:4]:
        distinct = set(col)
        distinct.discard(U32_NA)
        if distinct and not (min(distinct) >= 0 and max(distinct) < MAX_MIG_ID):
            return None
        ids.append(_none_for(col, U32_NA))
    return ProcessTable(pids, _none_for(mem, U64_NA), ids[0], ids[1])


def _merge(tables: list[ProcessTable]) -> ProcessTable:
    """One row per pid over the lists: a "C+G" process counts once (F05).

    Its memory is the first known value, in list order (compute, graphics, MPS).
    """
    nonempty = [t for t in tables if len(t)]
    if len(nonempty) <= 1:
        table = nonempty[0] if nonempty else ProcessTable([], [], [], [])
        if len(table.keys()) == len(table.pids):
            return table
    merged: dict[int, ProcessEntry] = {}
    for t in nonempty:
        for e in t.entries().values() if len(t.keys()) == len(t.pids) else _rows(t):
            prev = merged.get(e.pid)
            if prev is None or (prev.used_bytes is None and e.used_bytes is not None):
                merged[e.pid] = e
    return ProcessTable.of(merged.values())


def _rows(t: ProcessTable) -> Iterable[ProcessEntry]:
    cols = (t.pids, t.used_bytes, t.gpu_instance_ids, t.compute_instance_ids)
    return (ProcessEntry(*row) for row in zip(*cols, strict=True))


def read_processes(
    dev: Device, tick: Tick, counts: dict[str, int] | None = None
) -> ProcessTable | None:
    """Read, validate and merge every process list of ``dev``.

    Args:
        dev: the device.
        tick: the tick.
        counts: when given, filled with the number of entries of each list read, by
            ``nvidia.gpu.process.type`` (``compute``, ``graphics``, ``mps``); meaningful only
            when the result is not None.

    Returns:
        One row per pid, or None when no list could be read or this tick's lists were dropped
        (struct mismatch, retries exhausted).

    Raises:
        DeviceLost, LibraryDown: as from the gate.

    """
    tables: list[ProcessTable] = []
    any_list = False
    pid_max, total = tick.ctx.pid_max, dev.memory_total_bytes
    for kind in LISTS:
        try:
            raw = _read_list(dev, tick, kind)
        except ListUnavailable:
            return None
        if raw is None:
            continue
        any_list = True
        if counts is not None:
            counts[LIST_TYPES[kind]] = len(raw)
        if not raw:
            continue
        table = _columns(raw, pid_max, total)
        if table is None:
            bad = next(r for r in raw if _entry(r, pid_max, total) is None)
            tick.ctx.log.log(
                logging.DEBUG if dev.state.get("mismatch_logged") else logging.WARNING,
                "GPU %s: implausible %s process entry (pid=%s) from driver %s: "
                "process-info struct mismatch; dropping this device's process lists",
                dev.uuid,
                kind,
                bad[0],
                tick.ctx.session.driver_version,
            )
            dev.state["mismatch_logged"] = True
            dev.calls.drop(f"nvmlDeviceGet{kind}RunningProcesses", "process_struct_mismatch")
            return None
        tables.append(table)
    return _merge(tables) if any_list else None


def collect_process_memory(dev: Device, tick: Tick, table: ProcessTable) -> None:
    """Add one ``nvidia.gpu.process.memory.usage`` point per process with known memory.

    Series start: when the pid was first seen on this device; a pid that left the lists and
    came back starts a new series (pid reuse, F16). The points go to the tick as one table
    per MIG id pair (a process on a MIG instance carries its instance's ids).
    """
    starts: dict[int, int] = dev.state.setdefault("process_start", {})
    live = table.keys()
    if len(starts) != len(live) or not live.issuperset(starts):
        for pid in starts.keys() - live:
            del starts[pid]
    now = tick.now_ns
    pids = table.pids
    first_seen = array("q", map(starts.setdefault, pids, repeat(now, len(pids))))
    if not tick.wants(names.MetricProcessMemoryUsage):
        return
    used = table.used_bytes
    gis, cis = table.gpu_instance_ids, table.compute_instance_ids
    if None not in used and all_none(gis) and all_none(cis):  # the common case: one table
        try:  # typed columns from C-level iteration: the producer takes them as they are
            used_col: Sequence[Any] = array("q", cast("Sequence[int]", used))  # no None: checked
        except OverflowError:  # a value int64 cannot hold: the producer refuses it, counted
            used_col = used
        metric = names.MetricProcessMemoryUsage
        tick.points.block(metric, dev.id_attrs, array("q", pids), used_col, now, first_seen)
        return
    groups: dict[tuple[int | None, int | None], tuple[list[int], list[int], list[int]]] = {}
    for pid, mem, gi, ci, start in zip(pids, used, gis, cis, first_seen, strict=True):
        if mem is None:
            continue  # not available (WDDM, WSL2: F28): no point, never a number
        group = groups.get((gi, ci))
        if group is None:
            group = groups[(gi, ci)] = ([], [], [])
        group[0].append(pid)
        group[1].append(mem)
        group[2].append(start)
    for ids, (g_pids, g_used, g_starts) in groups.items():
        tick.points.block(
            names.MetricProcessMemoryUsage, _process_attrs(dev, *ids), g_pids, g_used, now, g_starts
        )


def all_none(column: Sequence[Any]) -> bool:
    """Tell whether every value of ``column`` is None (C-level: a list of Nones)."""
    return not column or (column[0] is None and column.count(None) == len(column))


def collect_process_counts(dev: Device, tick: Tick, counts: dict[str, int]) -> None:
    """Add ``nvidia.gpu.process.count{nvidia.gpu.process.type}``: the entries of each list read.

    A listed process counts whatever NVML reports about it, so one with no memory value and no
    utilisation sample (WDDM, WSL2: ``usedGpuMemory`` is ``NVML_VALUE_NOT_AVAILABLE``) still
    shows that the GPU is in use. A list the device cannot read gives no point (never a 0).
    """
    if not tick.wants(names.MetricGPUProcessCount):
        return
    for label, n in counts.items():
        attrs = dev.attrs + ((names.AttrGPUProcessType, label),)
        tick.points.add(names.MetricGPUProcessCount, n, tick.now_ns, attrs, dev.start_ns)


def _process_attrs(dev: Device, gi: int | None, ci: int | None) -> Attributes:
    """Return the device's identity attributes with the MIG ids a process record carries."""
    attrs = dict(dev.id_attrs)
    if gi is not None:
        attrs.setdefault(names.AttrMIGGPUInstanceID, gi)
    if ci is not None:
        attrs.setdefault(names.AttrMIGComputeInstanceID, ci)
    return tuple(attrs.items())
