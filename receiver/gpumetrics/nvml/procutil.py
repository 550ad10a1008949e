"""Per-process utilisation samples → ``nvidia.gpu.process.utilization`` and memory-copy.

The defect this module exists to avoid: the reference design (polarsignals/gpu-metrics-agent's
``nvidia.go``, and parca-agent's ``gpumetrics`` package after it) passed a pid where
``nvmlDeviceGetProcessUtilization`` expects a last-seen timestamp, then stamped every returned
sample with that one pid. Here:

- **one call per device per tick**, ``nvmlDeviceGetProcessesUtilizationInfo`` where the driver
  has it (~R550+, adds JPEG/OFA) and ``nvmlDeviceGetProcessUtilization`` otherwise (a
  FUNCTION_NOT_FOUND or NOT_SUPPORTED from the newer call switches the device to the older one);
- ``lastSeenTimeStamp`` is the newest sample timestamp from the previous call, kept per device in
  the driver's clock domain; NOT_FOUND (nothing newer, F19) and the SUCCESS-on-sizing quirk mean
  "no samples" and leave it unchanged;
- results are **indexed by each sample's own pid**, and each sample is its own point at its own
  (converted) time: ``smUtil`` → ``hw.gpu.task=general``, ``encUtil`` → encoder, ``decUtil`` →
  decoder, ``memUtil`` → memory-copy utilisation;
- a sample whose pid is impossible or any of whose percentages lies outside 0–100 (``smUtil``
  0xFFFFFFFF, F24) is dropped whole and counted;
- the utilisation call is made before the process lists, and only samples of pids in those
  lists are kept: the driver also returns samples of processes that just exited, and
  capacity-sized buffers can hold stale entries (nvtop #110); a process that stopped using the
  GPU gets no point (when no list is readable, validated samples are all kept);
- **a running process without a sample was idle** (field case F27): NVML returns "one
  utilization sample structure per process running, that had some non-zero utilization during
  the last sample period", so when the call succeeded with samples, every pid in this tick's
  process lists that has no sample in the answer gets 0 for each task and for memory-copy, at
  the tick's time. Nothing is emitted for it when the call failed, is unsupported, answered
  NOT_FOUND for the whole device (nothing was read), or the lists are unreadable; a pid whose
  sample was dropped as garbage had a sample, so it gets no 0 either;
- INSUFFICIENT_SIZE (samples arriving between the sizing and the data call) is retried like the
  process lists (F20).

Not called on MIG-enabled GPUs, where both APIs are documented unsupported (NVML API reference,
``nvmlDeviceGetProcessUtilization``; field case F08).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpumetrics.metrics import names
from gpumetrics.nvml import convert, records
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.query import ErrorKind, QueryError, binding

NEW = "nvmlDeviceGetProcessesUtilizationInfo"
OLD = "nvmlDeviceGetProcessUtilization"
CURSOR = "process_utilization"
_INSUFFICIENT = frozenset({pynvml.NVML_ERROR_INSUFFICIENT_SIZE})
_TASKS = (
    ("smUtil", names.MetricProcessUtilization, ((names.AttrHwGPUTask, names.GPUTaskGeneral),)),
    ("encUtil", names.MetricProcessUtilization, ((names.AttrHwGPUTask, names.GPUTaskEncoder),)),
    ("decUtil", names.MetricProcessUtilization, ((names.AttrHwGPUTask, names.GPUTaskDecoder),)),
    ("memUtil", names.MetricProcessMemoryCopyUtilization, ()),
)
"""Sample fields in the order of :attr:`ProcessSamples.kept` values, their metric and attributes."""
_READERS = {NEW: records.processes_utilization_info, OLD: records.process_utilization}


@dataclass
class ProcessSamples:
    """One successful per-process utilisation answer.

    Attributes:
        kept: validated samples as ``(pid, driver timestamp µs, [sm, enc, dec, mem] %)``.
        sampled: every pid the answer had a sample for, dropped ones included.

    """

    kept: list[tuple[int, int, list[int]]] = field(default_factory=list)
    sampled: set[int] = field(default_factory=set)


def _read(dev: Device, tick: Tick) -> tuple[str, list[Any]] | None:
    c = dev.calls
    cursor = dev.cursors.get(CURSOR)
    for function in (NEW, OLD):
        # the binding's wrapper must exist (as before), though the call goes to the C symbol
        # directly with a kept buffer (gpumetrics.nvml.records)
        if binding(function) is None or not c.enabled(function):
            continue
        fn = _READERS[function]
        last: QueryError | None = None
        for _ in range(tick.ctx.settings.insufficient_size_attempts):
            try:
                return function, c.query(
                    function,
                    function,
                    fn,
                    dev.handle,
                    cursor,
                    dev.records,
                    retry_codes=_INSUFFICIENT,
                )
            except QueryError as err:
                if err.code in _INSUFFICIENT:
                    last = err
                    continue
                if err.kind is ErrorKind.NOT_FOUND:
                    return None  # no process had a sample newer than the cursor: nothing read
                if (
                    err.kind in (ErrorKind.FUNCTION_MISSING, ErrorKind.UNSUPPORTED)
                    and function == NEW
                ):
                    break
                return None
        if last is not None:
            c.record(last)
            c.drop(function, "insufficient_size")
            return None
    return None


def read_process_utilization(dev: Device, tick: Tick) -> ProcessSamples | None:
    """Make this tick's one per-process utilisation call on ``dev``; return its samples.

    Samples with an impossible pid or a percentage outside 0-100 are dropped (counted); the
    cursor moves to the newest timestamp returned. None when nothing was read: the call is
    unavailable or failed, or answered NOT_FOUND (no sample newer than the cursor).
    """
    if not tick.wants(names.MetricProcessUtilization, names.MetricProcessMemoryCopyUtilization):
        return None
    got = _read(dev, tick)
    if got is None:
        return None
    function, samples = got
    newest = None
    pid_max = tick.ctx.pid_max
    out = ProcessSamples()
    kept, sampled = out.kept, out.sampled
    for pid, ts, sm, mem, enc, dec in samples:
        if newest is None or ts > newest:
            newest = ts
        sampled.add(pid)
        if not 1 <= pid <= pid_max:
            dev.calls.drop(function, "invalid_pid", detail=str(pid))
            continue
        if sm > 100 or enc > 100 or dec > 100 or mem > 100:  # unsigned: never below 0
            values = [sm, enc, dec, mem]
            dev.calls.drop(function, convert.OUT_OF_RANGE, detail=f"pid {pid}: {values}")
            continue
        kept.append((pid, ts, [sm, enc, dec, mem]))
    dev.cursors.advance(CURSOR, newest)
    return out


def collect_process_utilization(
    dev: Device, tick: Tick, samples: ProcessSamples, live_pids: Collection[int] | None
) -> None:
    """Add per-process utilisation points: one per sample and task, and 0 for idle processes.

    Args:
        dev: a physical GPU without MIG.
        tick: the current tick.
        samples: from :func:`read_process_utilization` (a successful answer).
        live_pids: pids in this tick's process lists (read after the utilisation call), or
            None when the lists were unavailable: samples of other pids are not emitted, and
            no process is known to be idle.

    """
    # the tasks collected, each with its metric and the attribute tuple all its points share
    tasks = [
        (i, metric, dev.id_attrs + extra)
        for i, (_, metric, extra) in enumerate(_TASKS)
        if tick.wants(metric)
    ]
    if not tasks:
        return
    to_unix_ns = tick.ctx.timebase.to_unix_ns
    pids: list[int] = []
    times: list[int] = []
    ratios: list[list[float]] = [[] for _ in _TASKS]
    for pid, ts, values in samples.kept:
        if live_pids is not None and pid not in live_pids:
            continue
        pids.append(pid)
        times.append(to_unix_ns(ts))
        for i, _, _ in tasks:  # percentages validated (0-100) by the reader
            ratios[i].append(values[i] / 100.0)
    if live_pids is not None:
        now = tick.now_ns
        for pid in live_pids:
            if pid in samples.sampled:
                continue
            pids.append(pid)  # running, no sample: idle in the whole window (F27)
            times.append(now)
            for i, _, _ in tasks:
                ratios[i].append(0.0)
    for i, metric, attrs in tasks:
        tick.points.block(metric, attrs, pids, ratios[i], times)
