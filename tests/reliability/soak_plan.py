"""The soak's fault plan: seeded episodes of simulated faults, laid out in simulated cycles.

The plan is a sequence of *slots*. A slot is either one **session** episode (a lifecycle code
takes the whole NVML session down, and the next inits fail too) or a set of **device** episodes
running at the same time on different GPUs (at most one per GPU):

* ``lose``: ``lose_gpu`` at ``start``, ``restore_gpu`` at ``end`` (same UUID, sometimes at a new
  index, swapping with the GPU there);
* ``error``: ``function`` answers ``code`` on that GPU for cycles ``[start, end)``;
* ``slow``: ``function`` takes ``latency_s`` more (simulated) seconds per call in ``[start, end)``;
* ``hang``: one call of ``function`` blocks at ``start`` until the soak releases it at ``end``.

Each slot is followed by a quiet gap long enough for every GPU to be read cleanly again
(``recovery``); the soak asserts that it was. Faults reference GPUs by UUID, so an index swap
never moves a fault to another GPU.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

TICK_FUNCTIONS = (
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTotalEnergyConsumption",
)
"""C symbols the collector calls on every tick of a GPU (read from a clean run's call counts)."""

SLOW_FUNCTIONS = (
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetEnforcedPowerLimit",
)
"""Symbols called once per tick: their latency per cycle stays below the cycle length."""

ERROR_CODES = (
    "UNKNOWN",
    "TIMEOUT",
    "INVALID_ARGUMENT",
    "NOT_SUPPORTED",
    "NO_PERMISSION",
    "NOT_FOUND",
    "INSUFFICIENT_SIZE",
    "GPU_IS_LOST",
    "IRQ_ISSUE",
)
SESSION_CODES = ("UNINITIALIZED", "DRIVER_NOT_LOADED")
DEVICE_KINDS = ("lose", "error", "error", "slow", "hang")


@dataclass(frozen=True)
class Episode:
    """One injected fault (see the module docstring); cycles are the simulator's, end exclusive."""

    kind: str
    start: int
    end: int
    device: str | None = None
    function: str | None = None
    code: str | None = None
    latency_s: float = 0.0
    new_index: int | None = None
    init_failures: int = 0

    def faults(self) -> list[dict[str, Any]]:
        """The scenario ``faults`` entries of this episode (lose/restore act from the soak loop).

        Every entry ends with its episode: a fault whose call did not come in its window (the
        GPU was failed, or the capability had been switched off by an earlier NOT_SUPPORTED)
        must not fire later, outside the plan.
        """
        if self.kind == "error":
            return [
                {
                    "function": self.function,
                    "device": self.device,
                    "code": self.code,
                    "from_cycle": self.start,
                    "until_cycle": self.end,
                }
            ]
        if self.kind == "slow":
            return [
                {
                    "function": self.function,
                    "device": self.device,
                    "latency_s": self.latency_s,
                    "from_cycle": self.start,
                    "until_cycle": self.end,
                }
            ]
        if self.kind == "hang":
            return [
                {
                    "function": self.function,
                    "device": self.device,
                    "hang": True,
                    "from_cycle": self.start,
                    "until_cycle": self.end,
                    "calls": 1,
                }
            ]
        if self.kind == "session":
            out: list[dict[str, Any]] = [
                {
                    "function": self.function,
                    "device": self.device,
                    "code": self.code,
                    "from_cycle": self.start,
                    "until_cycle": self.end,
                    "calls": 1,
                }
            ]
            if self.init_failures:
                out.append(
                    {
                        "function": "nvmlInitWithFlags",
                        "code": "DRIVER_NOT_LOADED",
                        "from_cycle": self.start,
                        "until_cycle": self.end + self.recovery,
                        "calls": self.init_failures,
                    }
                )
            return out
        return []

    @property
    def recovery(self) -> int:
        """Quiet cycles after ``end`` within which every GPU must read ``ok`` again.

        Device back-off is 1 s doubling to 2 s and init back-off the same (``soak_node``), so a
        failed GPU is probed within 2 cycles and a down session re-initialised within
        ``2 × (failed inits + 1)`` cycles.
        """
        if self.kind == "session":
            return 3 + 2 * (self.init_failures + 1)
        return 4


@dataclass(frozen=True)
class Plan:
    """All episodes, and the cycles at the end of each quiet gap (where all must be ``ok``)."""

    episodes: tuple[Episode, ...]
    checkpoints: tuple[int, ...]
    cycles: int

    def faults(self) -> list[dict[str, Any]]:
        """Every scenario fault entry of the plan."""
        return [f for e in self.episodes for f in e.faults()]

    def count(self) -> dict[str, int]:
        """Episodes per kind (the figures' "faults injected")."""
        out: dict[str, int] = {}
        for e in self.episodes:
            key = e.kind if e.kind in ("lose", "hang", "session") else f"{e.kind}"
            out[key] = out.get(key, 0) + 1
        return out


def make_plan(rng: random.Random, uuids: list[str], cycles: int, warmup: int = 3) -> Plan:
    """Lay out slots of episodes over ``cycles`` simulated cycles (see the module docstring)."""
    episodes: list[Episode] = []
    checkpoints: list[int] = []
    c = warmup + 1
    while True:
        slot: list[Episode] = []
        if rng.random() < 0.15:
            slot.append(
                Episode(
                    kind="session",
                    start=c,
                    end=c + 1,
                    device=rng.choice(uuids),
                    function=rng.choice(TICK_FUNCTIONS[:3] + SLOW_FUNCTIONS),
                    code=rng.choice(SESSION_CODES),
                    init_failures=rng.randrange(3),
                )
            )
        else:
            for i, uuid in enumerate(uuids):
                if rng.random() < 0.35 and i > 0:
                    continue  # this GPU stays clean in this slot (GPU 0 always gets one)
                kind = rng.choice(DEVICE_KINDS)
                start = c + rng.randrange(2)
                length = rng.randint(1, 5)
                slot.append(
                    Episode(
                        kind=kind,
                        start=start,
                        end=start + length,
                        device=uuid,
                        function=rng.choice(SLOW_FUNCTIONS if kind == "slow" else TICK_FUNCTIONS),
                        code=rng.choice(ERROR_CODES) if kind == "error" else None,
                        latency_s=round(rng.uniform(0.05, 0.2), 3) if kind == "slow" else 0.0,
                        new_index=(
                            rng.randrange(len(uuids))
                            if kind == "lose" and len(uuids) > 1 and rng.random() < 0.4
                            else None
                        ),
                    )
                )
        checkpoint = max(e.end + e.recovery for e in slot)
        if checkpoint >= cycles:
            break
        episodes.extend(slot)
        checkpoints.append(checkpoint)
        c = checkpoint + 1
    return Plan(tuple(episodes), tuple(checkpoints), cycles)
