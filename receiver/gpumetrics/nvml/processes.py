"""Running-process lists (compute, graphics, MPS) → ``nvidia.gpu.process.memory.usage``.

**Which symbol.** For each list the newest symbol the driver exports is used, decided from the
symbols probed at init, never from the version number (F04, F05): ``…RunningProcesses_v3``
(24-byte records with MIG ids), else ``_v2`` (same layout), else the unversioned v1 symbol,
read here with its own 16-byte struct (``pid`` u32, ``usedGpuMemory`` u64; MIG ids absent), since
nvidia-ml-py 13.x has no v1 wrapper and its unversioned wrapper calls ``_v3`` (F02, F04 on 440).
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
known value (compute, graphics, MPS order), so it is never counted twice.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from gpumetrics.metrics import names
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.convert import U32_NA, U64_NA
from gpumetrics.nvml.device import MAX_MIG_ID, Device
from gpumetrics.nvml.query import ErrorKind, QueryError, binding

LISTS = ("Compute", "Graphics", "MPSCompute")
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


def v1_running_processes(symbol: str, handle: Any) -> list[Any]:
    """Call an unversioned (v1) process-list symbol with the 16-byte v1 struct.

    The same two-call pattern as nvidia-ml-py's wrappers (NULL buffer to size, then
    ``2n + 5`` records), through the binding's own symbol lookup.

    Raises:
        pynvml.NVMLError: any non-success answer (INSUFFICIENT_SIZE included).

    """
    fn = pynvml._nvmlGetFunctionPointer(symbol)
    count = ctypes.c_uint(0)
    ret = fn(handle, ctypes.byref(count), None)
    if ret == pynvml.NVML_SUCCESS:
        return []
    if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
        raise pynvml.NVMLError(ret)
    count.value = count.value * 2 + 5
    records = (_ProcessInfoV1 * count.value)()
    ret = fn(handle, ctypes.byref(count), records)
    if ret != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(ret)
    return [records[i] for i in range(count.value)]


def _symbols(kind: str) -> tuple[tuple[str, Callable[..., Any] | None], ...]:
    base = f"nvmlDeviceGet{kind}RunningProcesses"
    v1: Callable[..., Any] = lambda handle, _s=base: v1_running_processes(_s, handle)  # noqa: E731
    return (
        (f"{base}_v3", binding(f"{base}_v3")),
        (f"{base}_v2", binding(f"{base}_v2")),
        (base, v1),
    )


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
                return list(
                    c.query(
                        symbol,
                        symbol,
                        fn,
                        dev.handle,
                        missing_level=logging.DEBUG,
                        retry_codes=INSUFFICIENT_SIZE,
                    )
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


def _entry(raw: Any, pid_max: int, total: int | None) -> ProcessEntry | None:
    pid = int(raw.pid)
    mem = getattr(raw, "usedGpuMemory", None)
    mem = None if mem is None or mem == U64_NA else int(mem)
    gi = getattr(raw, "gpuInstanceId", None)
    ci = getattr(raw, "computeInstanceId", None)
    if not 1 <= pid <= pid_max:
        return None
    if mem is not None and total is not None and mem > total:
        return None
    ids: list[int | None] = []
    for v in (gi, ci):
        if v is None or int(v) == U32_NA:
            ids.append(None)
        elif 0 <= int(v) < MAX_MIG_ID:
            ids.append(int(v))
        else:
            return None
    return ProcessEntry(pid, mem, ids[0], ids[1])


def read_processes(dev: Device, tick: Tick) -> dict[int, ProcessEntry] | None:
    """Read, validate and merge every process list of ``dev``.

    Returns:
        Entries by pid, or None when no list could be read or this tick's lists were dropped
        (struct mismatch, retries exhausted).

    Raises:
        DeviceLost, LibraryDown: as from the gate.

    """
    merged: dict[int, ProcessEntry] = {}
    any_list = False
    for kind in LISTS:
        try:
            raw = _read_list(dev, tick, kind)
        except ListUnavailable:
            return None
        if raw is None:
            continue
        any_list = True
        for r in raw:
            e = _entry(r, tick.ctx.pid_max, dev.memory_total_bytes)
            if e is None:
                tick.ctx.log.log(
                    logging.DEBUG if dev.state.get("mismatch_logged") else logging.WARNING,
                    "GPU %s: implausible %s process entry (pid=%s) from driver %s: "
                    "process-info struct mismatch; dropping this device's process lists",
                    dev.uuid,
                    kind,
                    getattr(r, "pid", "?"),
                    tick.ctx.session.driver_version,
                )
                dev.state["mismatch_logged"] = True
                dev.calls.drop(f"nvmlDeviceGet{kind}RunningProcesses", "process_struct_mismatch")
                return None
            prev = merged.get(e.pid)
            if prev is None or (prev.used_bytes is None and e.used_bytes is not None):
                merged[e.pid] = e
    return merged if any_list else None


def collect_process_memory(dev: Device, tick: Tick, entries: dict[int, ProcessEntry]) -> None:
    """Add one ``nvidia.gpu.process.memory.usage`` point per process with known memory.

    Series start: when the pid was first seen on this device; a pid that left the lists and
    came back starts a new series (pid reuse, F16).
    """
    starts: dict[int, int] = dev.state.setdefault("process_start", {})
    for pid in [p for p in starts if p not in entries]:
        del starts[pid]
    for pid, e in entries.items():
        start = starts.setdefault(pid, tick.now_ns)
        if e.used_bytes is None or not tick.wants(names.MetricProcessMemoryUsage):
            continue
        attrs = dict(dev.id_attrs)
        if e.gpu_instance_id is not None:
            attrs.setdefault(names.AttrMIGGPUInstanceID, e.gpu_instance_id)
        if e.compute_instance_id is not None:
            attrs.setdefault(names.AttrMIGComputeInstanceID, e.compute_instance_id)
        tick.points.add_process(
            pid,
            names.MetricProcessMemoryUsage,
            e.used_bytes,
            tick.now_ns,
            tuple(attrs.items()),
            start,
        )
