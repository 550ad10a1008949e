"""The NVML C calls per cycle the metric set needs, derived from the metric catalogue.

Rule: **one read per metric source per device per cadence**. Each enabled GPU metric of
``gpumetrics/metrics/catalogue.yaml`` names its NVML source(s) in its ``nvml`` field; the table
:data:`SOURCES` maps every such metric to the primary source(s) it needs and how many C calls
one read of a source costs (a two-call function counts its sizing call and its data call, as
the driver sees them; a list that turns out empty costs only the sizing call). Sources shared
by several metrics (one ``nvmlDeviceGetMemoryInfo`` for usage, limit and utilisation) count
once. Sources on a slow cadence (PCIe, ECC) count ``interval_s / cadence`` per cycle.
Fallbacks (the utilisation/power snapshots read only when a sample buffer is empty, v1 calls on
old drivers) are not part of the minimum.

:func:`check_catalogue` keeps the table honest: every enabled GPU metric of the catalogue must be
in it, and every C call named for it must appear in that metric's ``nvml`` text, so a metric
added to the catalogue without a row here fails loudly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Source:
    """One NVML read: ``call`` (the name used in the catalogue), C calls per read, cadence.

    ``calls_empty`` is the cost when the answer is empty (a list or sample call whose sizing
    call already says "none"); ``cadence`` is ``tick``, ``pcie`` or ``errors``.
    """

    call: str
    calls: int
    calls_empty: int | None = None
    cadence: str = "tick"
    per_process: bool = False


SOURCES: dict[str, tuple[Source, ...]] = {
    "hw.gpu.utilization": (
        Source("nvmlDeviceGetSamples", 2),  # GPU_UTILIZATION_SAMPLES: sizing + data
        Source("nvmlDeviceGetEncoderUtilization", 1),
        Source("nvmlDeviceGetDecoderUtilization", 1),
    ),
    "hw.gpu.memory.usage": (Source("nvmlDeviceGetMemoryInfo", 1),),
    "hw.gpu.memory.limit": (Source("nvmlDeviceGetMemoryInfo", 1),),
    "hw.gpu.memory.utilization": (Source("nvmlDeviceGetMemoryInfo", 1),),
    "hw.power": (Source("nvmlDeviceGetSamples", 2),),  # TOTAL_POWER_SAMPLES
    "hw.energy": (Source("nvmlDeviceGetTotalEnergyConsumption", 1),),
    "hw.temperature": (Source("nvmlDeviceGetTemperatureV", 1),),
    "hw.status": (),  # the device state machine: no call of its own
    "hw.errors": (Source("nvmlDeviceGetTotalEccErrors", 2, cadence="errors"),),
    "nvidia.gpu.memory_copy.utilization": (Source("nvmlDeviceGetSamples", 2),),
    "nvidia.gpu.power.limit": (Source("nvmlDeviceGetEnforcedPowerLimit", 1),),
    "nvidia.gpu.clock.speed": (Source("nvmlDeviceGetClockInfo", 4),),  # 4 domains
    "nvidia.gpu.clock.event_reason": (Source("nvmlDeviceGetCurrentClocksEventReasons", 1),),
    "nvidia.gpu.pcie.throughput": (Source("nvmlDeviceGetPcieThroughput", 2, cadence="pcie"),),
    "nvidia.gpu.process.utilization": (
        Source("nvmlDeviceGetProcessUtilization", 2, calls_empty=1, per_process=True),
    ),
    "nvidia.gpu.process.memory_copy.utilization": (
        Source("nvmlDeviceGetProcessUtilization", 2, calls_empty=1, per_process=True),
    ),
    "nvidia.gpu.process.memory.usage": (
        # compute (sizing + data when non-empty), graphics and MPS (sizing only when empty)
        Source("nvmlDeviceGetComputeRunningProcesses", 2, calls_empty=1, per_process=True),
        Source("GraphicsRunningProcesses", 1, per_process=True),
        Source("MPSComputeRunningProcesses", 1, per_process=True),
    ),
}
"""Metric → the sources one read of it needs. The three ``nvmlDeviceGetSamples`` rows are
distinct sources (one per sampling type); :func:`minimum_calls` keys them by metric."""

_SAMPLE_TYPES = {
    "hw.gpu.utilization": "GPU_UTILIZATION",
    "hw.power": "TOTAL_POWER",
    "nvidia.gpu.memory_copy.utilization": "MEMORY_UTILIZATION",
}


def check_catalogue(catalogue: Any = None) -> list[str]:
    """Problems between :data:`SOURCES` and the catalogue (empty when they agree)."""
    if catalogue is None:
        from gpumetrics.metrics.spec import catalogue as load

        catalogue = load()
    problems = []
    enabled = {n: s for n, s in catalogue.metrics.items() if s.enabled}
    for name, spec in enabled.items():
        if name not in SOURCES:
            problems.append(f"{name}: enabled in the catalogue but has no row in SOURCES")
            continue
        for src in SOURCES[name]:
            if src.call not in spec.nvml:
                problems.append(f"{name}: {src.call} is not named in its catalogue nvml field")
    for name in SOURCES:
        if name not in enabled:
            problems.append(f"{name}: in SOURCES but not an enabled catalogue metric")
    return problems


def minimum_calls(gpus: int, processes_per_gpu: int, settings: Any) -> float:
    """C calls per cycle that the enabled metric set needs (see the module docstring).

    Args:
        gpus: GPUs on the node (no MIG).
        processes_per_gpu: compute processes on each GPU (graphics and MPS lists empty).
        settings: a ``CollectionSettings`` (cadences, ``disabled_metrics``,
            ``process_metrics``).

    Raises:
        ValueError: listing the disagreements of :func:`check_catalogue`.

    """
    problems = check_catalogue()
    if problems:
        raise ValueError("; ".join(problems))
    cadence = {
        "tick": 1.0,
        "pcie": settings.interval_s / settings.pcie_interval_s if settings.pcie_interval_s else 0,
        "errors": (
            settings.interval_s / settings.errors_interval_s if settings.errors_interval_s else 0
        ),
    }
    needed: dict[tuple[str, str], float] = {}
    for metric, sources in SOURCES.items():
        if metric in settings.disabled_metrics:
            continue
        for src in sources:
            if src.per_process and not settings.process_metrics:
                continue
            key = (src.call, _SAMPLE_TYPES.get(metric, ""))
            cost = src.calls if processes_per_gpu or src.calls_empty is None else src.calls_empty
            needed[key] = cost * cadence[src.cadence]
    return gpus * sum(needed.values())
