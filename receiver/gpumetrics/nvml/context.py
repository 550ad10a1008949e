"""What every reader needs for one tick: clocks, settings, telemetry and the point sink.

:class:`Context` lives as long as the collector; :class:`Tick` is built for one device per tick
and collects that device's points (:class:`~gpumetrics.metrics.columns.Points`: device points
as per-metric columns, per-process points as whole tables) so the collector can commit them to
the producer only when the whole device read finished before its deadline; the producer checks
them against ``MetricBuffer.add``'s rules, column by column, when it commits.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpumetrics.metrics.columns import Points
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
