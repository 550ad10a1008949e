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

from dataclasses import dataclass

from nvmlsim.model.values import Dyn, evaluate
from nvmlsim.world import Timeline

__all__ = ["GpmSample", "GpmStore", "MIN_INTERVAL_US", "interval_mean"]

MIN_INTERVAL_US = 100_000
"""Samples closer than this give 0 (NVML: the interval "should be greater than 100ms")."""

_STEPS = 16


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


def interval_mean(value: Dyn, t0_us: int, t1_us: int, timeline: Timeline) -> float:
    """Mean of ``value`` over ``[t0_us, t1_us]`` (µs since the epoch), by the midpoint rule.

    A constant is exact; a pattern is evaluated at 16 midpoints (a square wave's duty is
    resolved to 1/16 of the interval).
    """
    if isinstance(value, int | float):
        return float(value)
    if t1_us <= t0_us:
        return evaluate(value, timeline.seconds(t1_us), timeline.cycle(t1_us))
    step = (t1_us - t0_us) / _STEPS
    total = 0.0
    for k in range(_STEPS):
        at = round(t0_us + (k + 0.5) * step)
        total += evaluate(value, timeline.seconds(at), timeline.cycle(at))
    return total / _STEPS
