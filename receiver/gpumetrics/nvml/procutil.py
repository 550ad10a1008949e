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

from array import array
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from itertools import compress, filterfalse, repeat
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
_HUNDRED = 100.0  # ratio = percent / 100.0, as _HUNDRED.__rtruediv__ computes it


@dataclass
class ProcessSamples:
    """One successful per-process utilisation answer, as columns.

    Attributes:
        pids: the pid of each validated sample.
        stamps: each validated sample's driver timestamp (µs, the driver's clock domain).
        percents: per task in :data:`_TASKS` order (sm, enc, dec, mem), each validated
            sample's percentage (0-100).
        sampled: every pid the answer had a sample for, dropped ones included.

    """

    pids: Sequence[int] = ()
    stamps: Sequence[int] = ()
    percents: tuple[Sequence[int], ...] = ((), (), (), ())
    sampled: set[int] = field(default_factory=set)

    @property
    def kept(self) -> list[tuple[int, int, list[int]]]:
        """The validated samples as ``(pid, timestamp µs, [sm, enc, dec, mem] %)`` (tests)."""
        return [
            (pid, ts, list(pcts))
            for pid, ts, *pcts in zip(self.pids, self.stamps, *self.percents, strict=True)
        ]


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
    if not tick.wants(
        names.MetricProcessUtilization,
        names.MetricProcessMemoryCopyUtilization,
        names.MetricProcessEnergy,
    ):
        return None
    got = _read(dev, tick)
    if got is None:
        return None
    function, samples = got
    if not samples:
        return ProcessSamples()
    pids, stamps, sm, mem, enc, dec = zip(*samples, strict=True)
    dev.cursors.advance(CURSOR, max(stamps))
    pid_max = tick.ctx.pid_max
    out = ProcessSamples(pids, stamps, (sm, enc, dec, mem), set(pids))
    if min(pids) >= 1 and max(pids) <= pid_max and max(map(max, sm, enc, dec, mem)) <= 100:
        return out  # every sample valid: the common case, C-level scans only
    keep: list[tuple[int, int, int, int, int, int]] = []
    for pid, ts, s_, m_, e_, d_ in samples:
        if not 1 <= pid <= pid_max:
            dev.calls.drop(function, "invalid_pid", detail=str(pid))
            continue
        if s_ > 100 or e_ > 100 or d_ > 100 or m_ > 100:  # unsigned: never below 0
            values = [s_, e_, d_, m_]
            dev.calls.drop(function, convert.OUT_OF_RANGE, detail=f"pid {pid}: {values}")
            continue
        keep.append((pid, ts, s_, e_, d_, m_))
    if not keep:
        return ProcessSamples(sampled=out.sampled)
    k_pids, k_stamps, *k_percents = zip(*keep, strict=True)
    return ProcessSamples(k_pids, k_stamps, tuple(k_percents), out.sampled)


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
    pids: Sequence[int] = samples.pids
    stamps: Sequence[int] = samples.stamps
    percents = samples.percents
    if live_pids is not None and pids and not all(map(live_pids.__contains__, pids)):
        keep = list(map(live_pids.__contains__, pids))
        pids = list(compress(pids, keep))
        stamps = list(compress(stamps, keep))
        percents = tuple(list(compress(col, keep)) for col in percents)
    # typed columns from C-level iteration: the producer takes them as they are
    pid_col = array("q", pids)
    times = array("q", tick.ctx.timebase.to_unix_ns_all(stamps))
    ratios = [array("d", map(_HUNDRED.__rtruediv__, percents[i])) for i, _, _ in tasks]
    if live_pids is not None:  # running, no sample: idle in the whole window (F27)
        idle = list(filterfalse(samples.sampled.__contains__, live_pids))
        if idle:
            pid_col.extend(idle)
            times.extend(repeat(tick.now_ns, len(idle)))
            for r in ratios:
                r.extend(repeat(0.0, len(idle)))
    for (_, metric, attrs), values in zip(tasks, ratios, strict=True):
        tick.points.block(metric, attrs, pid_col, values, times)
