"""NVML accounting statistics → ``nvidia.gpu.process.time`` and ``nvidia.gpu.process.memory.max``.

The driver's per-process accounting (NVML API reference, "Accounting Statistics",
https://docs.nvidia.com/deploy/nvml-api/group__nvmlAccountingStats.html) keeps a record of
every compute or graphics process that ran on the GPU, in a circular buffer of
``nvmlDeviceGetAccountingBufferSize`` processes, also after the process ended; so it shows
processes that started and ended between two collections, which the running-process lists
and the utilisation samples never see.

**Mode.** ``nvmlDeviceGetAccountingMode`` is read at the device's first tick; the sidecar never
calls ``nvmlDeviceSetAccountingMode`` (it needs root and changes the node: ``nvidia-smi -am 1``
is the administrator's decision). NOT_SUPPORTED (the device has no accounting, MIG is enabled)
disables the source with the gate's one INFO line; DISABLED gives one INFO line and the mode is
read again every :data:`RECHECK_S` seconds (one call), so turning accounting on takes effect
without a restart. Nothing is emitted while it is off. Turned off while the sidecar reads it,
the pid call's NOT_SUPPORTED stops the source (the gate's INFO line) until a restart.

**What is reported.** The driver reports ``time`` (ms the compute context was active) as 0
until the process ends, so a running process has no run time to report: each process gets one
``nvidia.gpu.process.time`` point (s, a cumulative Sum whose start is the record's
``startTime``) and one ``nvidia.gpu.process.memory.max`` point (``maxMemoryUsage``, By; the
not-available value gives none), on its own per-process resource, when its **final** record
(``isRunning`` 0) is first read. The live memory of running processes is
``nvidia.gpu.process.memory.usage``.

**Exactly once, with pid reuse.** A record is keyed by ``(pid, startTime)``: NVML answers
``nvmlDeviceGetAccountingStats(pid)`` with the newest process of a pid ("in case of pid
collision stats of only the latest process will be reported"), so a reused pid shows a new
``startTime``. Per device the reader keeps ``running`` (pid → startTime of records last read
as running) and ``done`` (pid → startTime of final records already reported), both pruned to
the pids the buffer still lists (a record overwritten in the circular buffer never comes back),
so they hold at most ``buffer size`` pids each. Every ``accounting_interval_s`` (10 s; the
records stay in the driver's buffer after the processes end, so a slow cadence loses nothing
unless more processes than it holds start in one interval) the reader reads the pid list (one
C call into a kept buffer) and asks ``nvmlDeviceGetAccountingStats`` only for pids that are

- new to the reader (a process that started since the last read, short-lived ones included);
- ``running`` but no longer in this tick's running-process lists (it ended: its final record);
- ``done`` but back in the running-process lists (the pid was reused by a running process);

so a process that keeps running costs nothing. Without readable process lists every
pid not ``done`` is asked. A final record is emitted only when its key differs from ``done``'s.

**Limits (documented in docs/energy.md).** A pid reused by a process that also started and
ended within one interval, after its previous holder's final record was reported, is not
asked again and so missed; a process whose record the circular buffer overwrote before a tick
read it (more than ``buffer size`` processes in one interval) is missed; at the device's first
tick, final records of processes that ended before it (``startTime + time`` earlier than that
tick) are marked done without being reported: they ended while no sidecar (or an earlier one,
which reported them) was watching. A sidecar restart therefore does not report them twice.
"""

from __future__ import annotations

from array import array
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpumetrics.metrics import names
from gpumetrics.nvml import records
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.convert import U64_NA
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.query import ErrorKind, QueryError

MODE = "nvmlDeviceGetAccountingMode"
SIZE = "nvmlDeviceGetAccountingBufferSize"
PIDS = "nvmlDeviceGetAccountingPids"
STATS = "nvmlDeviceGetAccountingStats"
RECHECK_S = 60.0
"""How often (s) the mode is read again while accounting is disabled."""
_MS_PER_S = 1000.0


@dataclass
class AccountingState:
    """One device's accounting reader state (kept in ``Device.state["accounting"]``).

    Attributes:
        capacity: the driver's buffer size (``nvmlDeviceGetAccountingBufferSize``), 0 until
            the mode was found enabled.
        since_us: the first read's time (µs since the epoch); final records that ended before
            it are not reported.
        checked_ns: monotonic time of the last mode read.
        running: pid → startTime (µs) of records last read as running.
        done: pid → startTime (µs) of final records already reported.

    """

    capacity: int = 0
    since_us: int = 0
    checked_ns: int | None = None
    running: dict[int, int] = field(default_factory=dict)
    done: dict[int, int] = field(default_factory=dict)


def _enabled(dev: Device, tick: Tick, st: AccountingState) -> bool:
    """Read the mode when due; True when accounting is on and the buffer size is known."""
    if st.capacity:
        return True
    c = dev.calls
    if not (c.enabled(MODE) and c.enabled(PIDS)):
        return False
    if st.checked_ns is not None and tick.mono_ns - st.checked_ns < round(RECHECK_S * 1e9):
        return False
    st.checked_ns = tick.mono_ns
    mode = c.get(MODE, MODE, pynvml.nvmlDeviceGetAccountingMode, dev.handle)
    if mode is None:
        return False  # NOT_SUPPORTED: disabled by the gate with its one INFO line
    if mode != pynvml.NVML_FEATURE_ENABLED:
        c.note(
            MODE,
            "accounting mode is disabled: nvidia.gpu.process.time and "
            "nvidia.gpu.process.memory.max are not reported (an administrator enables it "
            "with nvidia-smi -am 1; the sidecar never changes it)",
        )
        return False
    size = c.get(SIZE, SIZE, pynvml.nvmlDeviceGetAccountingBufferSize, dev.handle)
    if not size:
        return False
    st.capacity = int(size)
    st.since_us = tick.now_ns // 1000
    return True


def _candidates(st: AccountingState, listed: set[int], live: Collection[int] | None) -> list[int]:
    """Return the listed pids whose record must be read this tick (set operations, no loop)."""
    if live is None:
        return sorted(listed.difference(st.done))
    live_set = live if isinstance(live, set | frozenset) else set(live)
    new = listed.difference(st.running, st.done)
    ended = listed.intersection(st.running).difference(live_set)
    reused = listed.intersection(st.done).intersection(live_set)
    return sorted(new | ended | reused)


def collect_accounting(dev: Device, tick: Tick, live_pids: Collection[int] | None) -> None:
    """Add the final accounting records of processes that ended since the last tick.

    Args:
        dev: a physical GPU without MIG (accounting is unsupported with MIG enabled).
        tick: the current tick.
        live_pids: the pids of this tick's running-process lists, or None when unreadable.

    """
    if not tick.wants(names.MetricProcessTime, names.MetricProcessMemoryMax):
        return
    st: AccountingState | None = dev.state.get("accounting")
    if st is None:
        st = dev.state["accounting"] = AccountingState()
    if not tick.due(dev.state, "accounting_ns", tick.ctx.settings.accounting_interval_s):
        return  # every accounting_interval_s (0: off)
    if not _enabled(dev, tick, st):
        return
    c = dev.calls
    try:
        pids = c.query(PIDS, PIDS, records.accounting_pids, dev.handle, dev.records, st.capacity)
    except QueryError as err:
        if err.kind is ErrorKind.UNSUPPORTED:
            st.capacity = 0  # accounting was turned off
        return
    listed = set(pids)
    for book in (st.running, st.done):
        for gone in book.keys() - listed:
            del book[gone]  # overwritten in the circular buffer: it cannot come back
    out_pids = array("q")
    seconds = array("d")
    mem_pids = array("q")
    max_bytes = array("q")
    starts = array("q")
    for pid in _candidates(st, listed, live_pids):
        stats: Any = c.get(STATS, STATS, pynvml.nvmlDeviceGetAccountingStats, dev.handle, pid)
        if stats is None:
            continue  # NOT_FOUND: overwritten between the list and the read
        start_us = int(stats.startTime)
        if stats.isRunning:
            st.running[pid] = start_us
            st.done.pop(pid, None)  # a reused pid runs again
            continue
        st.running.pop(pid, None)
        if st.done.get(pid) == start_us:
            continue  # this final record was reported already
        st.done[pid] = start_us
        run_ms = int(stats.time)
        if start_us + run_ms * 1000 < st.since_us:
            continue  # ended before the first read: not this sidecar's to report
        out_pids.append(pid)
        seconds.append(run_ms / _MS_PER_S)
        starts.append(start_us * 1000)
        mem = stats.maxMemoryUsage
        if mem is not None and mem != U64_NA:
            mem_pids.append(pid)
            max_bytes.append(int(mem))
    if not out_pids:
        return
    if tick.wants(names.MetricProcessTime):
        tick.points.block(
            names.MetricProcessTime, dev.id_attrs, out_pids, seconds, tick.now_ns, starts
        )
    if mem_pids and tick.wants(names.MetricProcessMemoryMax):
        tick.points.block(
            names.MetricProcessMemoryMax, dev.id_attrs, mem_pids, max_bytes, tick.now_ns
        )
