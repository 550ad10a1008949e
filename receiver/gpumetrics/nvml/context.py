"""What every reader needs for one tick: clocks, settings, telemetry and the point sink.

:class:`Context` lives as long as the collector; :class:`Tick` is built for one device per tick
and collects that device's points (:class:`Points`) so the collector can commit them to the
producer only when the whole device read finished before its deadline. Points are
``metrics.buffer.Point`` tuples grouped by metric; the collector validates them through
``MetricBuffer.extend`` (the same rules as ``MetricBuffer.add``) when it commits.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpumetrics.metrics.buffer import Attributes, Point
from gpumetrics.nvml.library import Session
from gpumetrics.nvml.samples import Sample, TimeBase, read_samples
from gpumetrics.nvml.settings import CollectionSettings
from gpumetrics.selftelemetry import SelfTelemetry

DEFAULT_PID_MAX = 4_194_304
"""Linux's largest ``pid_max`` (2^22), used when ``/proc/sys/kernel/pid_max`` is unreadable."""


def read_pid_max(proc_root: str) -> int:
    """``<proc_root>/sys/kernel/pid_max``, or :data:`DEFAULT_PID_MAX` when unreadable."""
    try:
        with open(os.path.join(proc_root, "sys", "kernel", "pid_max"), encoding="ascii") as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        return DEFAULT_PID_MAX
    return value if value > 0 else DEFAULT_PID_MAX


@dataclass
class Context:
    """Collector-wide collaborators shared by every reader.

    Attributes:
        settings: the collection settings.
        session: the NVML session (symbols probed at init, driver version).
        telemetry: self-telemetry sink.
        log: the collector's logger.
        clock_ns: wall clock, Unix-epoch ns (point times).
        monotonic_ns: monotonic clock, ns (cadences, back-off).
        timebase: driver sample timestamps → Unix-epoch ns.
        pid_max: the largest valid pid.

    """

    settings: CollectionSettings
    session: Session
    telemetry: SelfTelemetry
    log: logging.Logger
    clock_ns: Callable[[], int]
    monotonic_ns: Callable[[], int]
    timebase: TimeBase
    pid_max: int


_new = tuple.__new__


class Points:
    """Points gathered by one device's tick, committed together or not at all.

    Held as :class:`~gpumetrics.metrics.buffer.Point` lists per metric name (device points)
    and per pid and metric name (per-process points), the shape ``MetricBuffer.extend`` takes,
    so committing a cycle appends whole lists instead of re-reading every point.

    Attributes:
        host: device points by metric name.
        processes: per-process points by pid, then metric name.

    """

    __slots__ = ("host", "processes")

    def __init__(self) -> None:
        self.host: dict[str, list[Point]] = {}
        self.processes: dict[int, dict[str, list[Point]]] = {}

    def add(
        self, metric: str, value: int | float, time_ns: int, attrs: Attributes, start_ns: int = 0
    ) -> None:
        """Add a device point."""
        pts = self.host.get(metric)
        if pts is None:
            pts = self.host[metric] = []
        pts.append(_new(Point, (value, time_ns, attrs, start_ns)))

    def add_process(
        self,
        pid: int,
        metric: str,
        value: int | float,
        time_ns: int,
        attrs: Attributes,
        start_ns: int = 0,
    ) -> None:
        """Add a per-process point for ``pid``."""
        self.process_list(pid, metric).append(_new(Point, (value, time_ns, attrs, start_ns)))

    def process_list(self, pid: int, metric: str) -> list[Point]:
        """Return the point list of ``metric`` for ``pid`` (for readers that add many)."""
        by_metric = self.processes.get(pid)
        if by_metric is None:
            by_metric = self.processes[pid] = {}
        pts = by_metric.get(metric)
        if pts is None:
            pts = by_metric[metric] = []
        return pts

    def extend(self, other: Points) -> None:
        """Append ``other``'s points."""
        _merge(self.host, other.host)
        for pid, by_metric in other.processes.items():
            mine = self.processes.get(pid)
            if mine is None:
                self.processes[pid] = by_metric
            else:
                _merge(mine, by_metric)

    def __len__(self) -> int:
        """Return the number of points held."""
        n = sum(len(p) for p in self.host.values())
        for by_metric in self.processes.values():
            n += sum(len(p) for p in by_metric.values())
        return n


def _merge(into: dict[str, list[Point]], other: dict[str, list[Point]]) -> None:
    for metric, pts in other.items():
        mine = into.get(metric)
        if mine is None:
            into[metric] = pts
        else:
            mine.extend(pts)


@dataclass
class Tick:
    """One device's tick: when it runs, what is due, and where its points go.

    Attributes:
        ctx: the collector context.
        now_ns: the tick's wall-clock time (Unix-epoch ns), the time of snapshot readings.
        mono_ns: the tick's monotonic time (cadences).
        check_index: verify the device's NVML index first (some GPU is failed, so indexes may
            have moved: F11 variant B).
        points: this device's points.

    """

    ctx: Context
    now_ns: int
    mono_ns: int
    check_index: bool = False
    points: Points = field(default_factory=Points)

    def due(self, state: dict[str, Any], key: str, interval_s: float) -> bool:
        """Return True (and note the time under ``state[key]``) when a cadence is due.

        ``interval_s`` 0 means off. Due at the first tick and then every ``interval_s`` on the
        monotonic clock.
        """
        if not interval_s:
            return False
        last = state.get(key)
        if last is not None and self.mono_ns - last < round(interval_s * 1e9):
            return False
        state[key] = self.mono_ns
        return True

    def wants(self, *metrics: str) -> bool:
        """Return True when at least one of ``metrics`` is collected."""
        return self.ctx.settings.wants(*metrics)

    def samples(self, dev: Any, sampling_type: int) -> list[Sample] | None:
        """Read ``dev``'s samples of ``sampling_type`` (see :func:`samples.read_samples`)."""
        window = round(self.ctx.settings.interval_s * 1e9)
        return read_samples(
            dev.calls,
            dev.handle,
            dev.cursors,
            sampling_type,
            self.ctx.timebase,
            self.now_ns,
            window,
            dev.records,
        )
