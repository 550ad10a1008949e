"""GPM sample buffers (``nvmlGpmSampleAlloc`` / ``…Free`` / ``…SampleGet``) and their metrics.

A real sample is an opaque buffer of counter snapshots; ``nvmlGpmMetricsGet`` turns two of
them into ratios and rates over the interval between them (NVML API reference, "GPM
Functions"). Here a sample records *which* source it snapshot (a GPU, or a MIG GPU instance of
one) and *when*; the metric is the mean of the scenario's value over the two samples' interval,
which is what counter differences give on hardware. The store counts live buffers, so a test
can check that a program frees what it allocated.

NVML documents that the two samples should be more than 100 ms apart "due to the internal sample
refresh rate"; closer samples give 0 here, the value DCGM's documentation reports for
profiling fields sampled too fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nvmlsim.model.values import Dyn, Ramp, Sine, Square, Trace, evaluate
from nvmlsim.world import Timeline

__all__ = ["GpmSample", "GpmStore", "MIN_INTERVAL_US", "interval_mean"]

MIN_INTERVAL_US = 100_000
"""Samples closer than this give 0 (NVML: the interval "should be greater than 100ms")."""


@dataclass
class GpmSample:
    """What one buffer holds: nothing yet, or a snapshot of (device index, GI id or None)."""

    device: int | None = None
    gpu_instance: int | None = None
    time_us: int | None = None


class GpmStore:
    """Sample buffers by their (fake) address; addresses are never reused within a driver."""

    def __init__(self, base: int) -> None:
        self._base = base
        self._next = 0
        self.samples: dict[int, GpmSample] = {}
        self.allocated = 0
        self.freed = 0

    def alloc(self) -> int:
        """Allocate a buffer and return its address."""
        self._next += 1
        address = self._base + 64 * self._next
        self.samples[address] = GpmSample()
        self.allocated += 1
        return address

    def free(self, address: int | None) -> bool:
        """Free the buffer at ``address``; False when it is not a live buffer."""
        if address is None or self.samples.pop(address, None) is None:
            return False
        self.freed += 1
        return True

    @property
    def live(self) -> int:
        """Buffers allocated and not yet freed."""
        return len(self.samples)


def _square_time(value: Square, x: float) -> float:
    """Seconds of ``first`` in ``[0, x]`` of a square wave (``x`` includes the phase)."""
    high = value.duty * value.period_s
    periods = math.floor(x / value.period_s)
    return periods * high + min(x - periods * value.period_s, high)


def _trace_mean(value: Trace, t0_us: int, t1_us: int, timeline: Timeline) -> float:
    """Mean of a recorded series: the time-weighted values of the steps the interval crosses."""
    if value.per == "cycle":
        edges = [
            timeline.cycle_start_us(c)
            for c in range(timeline.cycle(t0_us) + 1, timeline.cycle(t1_us) + 1)
        ]
    else:
        step_us = round(value.step_s * 1e6)
        first = (t0_us - timeline.start_us) // step_us + 1
        last = (t1_us - timeline.start_us) // step_us
        edges = [timeline.start_us + k * step_us for k in range(first, last + 1)]
    total, at = 0.0, t0_us
    for edge in [*(e for e in edges if t0_us < e < t1_us), t1_us]:
        total += evaluate(value, timeline.seconds(at), timeline.cycle(at)) * (edge - at)
        at = edge
    return total / (t1_us - t0_us)


def interval_mean(value: Dyn, t0_us: int, t1_us: int, timeline: Timeline) -> float:
    """Mean of ``value`` over ``[t0_us, t1_us]`` (µs since the epoch), computed exactly.

    Constants are themselves; a ramp's mean is its value at the midpoint; a sine's and a square
    wave's come from their integrals; a trace's is the time-weighted mean of the steps the
    interval crosses. An empty interval gives the value at its end.
    """
    if isinstance(value, int | float):
        return float(value)
    if t1_us <= t0_us:
        return evaluate(value, timeline.seconds(t1_us), timeline.cycle(t1_us))
    a, b = timeline.seconds(t0_us), timeline.seconds(t1_us)
    if isinstance(value, Ramp):
        return value.start + value.per_s * (a + b) / 2
    if isinstance(value, Sine):
        w = 2 * math.pi / value.period_s
        integral = (math.cos(w * (a + value.phase_s)) - math.cos(w * (b + value.phase_s))) / w
        return value.min + (value.max - value.min) * (1 + integral / (b - a)) / 2
    if isinstance(value, Square):
        high = _square_time(value, b + value.phase_s) - _square_time(value, a + value.phase_s)
        return value.rest + (value.first - value.rest) * high / (b - a)
    return _trace_mean(value, t0_us, t1_us, timeline)
