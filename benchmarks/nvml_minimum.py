"""The NVML C calls per cycle the metric set needs, derived from the metric catalogue.

Rule: **one read per metric source per device per cadence**. Each enabled GPU metric of
``gpumetrics/metrics/catalogue.yaml`` names its NVML source(s) in its ``nvml`` field; the table
:data:`SOURCES` maps every such metric to the primary source(s) it needs and how many C calls
one read of a source costs, as the driver sees them: sample buffers and process lists cost one
data call into the buffer kept from the device's first read, which NVML documents as enough
when the buffer is large enough (``gpumetrics/nvml/records.py``), and a list that is empty its
sizing call; per-process utilisation keeps its sizing and data call (one when nothing is
sampled). Sources shared
by several metrics (one ``nvmlDeviceGetMemoryInfo`` for usage, limit and utilisation) count
once. Sources on a slow cadence (PCIe, ECC) count ``interval_s / cadence`` per cycle.
Fallbacks (the utilisation/power snapshots read only when a sample buffer is empty, v1 calls on
old drivers) are not part of the minimum, nor are reads made once per device (static
properties, the fan count, the power limit constants, GPM support and buffers), nor the
per-link calls that stand in for a field the driver does not answer.

Some sources depend on the device (:class:`Facts`, read from the scenario's device by
:func:`device_facts`): one field-values read for the state of every NVLink link, one for the
error counters of the active links and one per-link call for each CRC counter of links 12 and
up, one speed read per fan, one violation read per policy the board reports, and sources the
device does not support at all, which cost nothing once their first answer disabled them.

:func:`check_catalogue` keeps the table honest: every GPU metric of the catalogue must be
in it, and every C call named for it must appear in that metric's ``nvml`` text, so a metric
added to the catalogue without a row here fails loudly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Source:
    """One NVML read: ``call`` (the name used in the catalogue), C calls per read, cadence.

    ``calls_empty`` is the cost when the answer is empty (a list or sample call whose sizing
    call already says "none"); ``cadence`` is ``tick``, ``pcie``, ``errors`` or ``accounting``.
    """

    call: str
    calls: int
    calls_empty: int | None = None
    cadence: str = "tick"
    per_process: bool = False
    per: str = "device"
    """``device``, or ``link`` / ``active_link`` / ``active_link_12_up`` / ``fan`` / ``policy``
    (calls × that count), or ``if_links`` / ``if_active`` (once when the GPU has links / any
    link is active)."""
    key: str = ""
    """Tells apart reads of one call for different concerns (sampling type, field set)."""


_GPM = (Source("nvmlGpmSampleGet", 1, key="gpm"), Source("nvmlGpmMetricsGet", 1, key="gpm"))
_REMAP = (Source("nvmlDeviceGetRemappedRows", 1, cadence="errors"),)
_RETIRED = (Source("nvmlDeviceGetFieldValues", 1, cadence="errors", key="retired_pages"),)
_BAR1 = (Source("nvmlDeviceGetBAR1MemoryInfo", 1),)
_LINK_STATE = Source(
    "nvmlDeviceGetFieldValues", 1, cadence="errors", per="if_links", key="nvlink_state"
)
"""Every link's state in one field-values read (the per-link call is a fallback)."""
_ENCODER = (Source("nvmlDeviceGetEncoderStats", 1),)
_PROCESS_LISTS = (
    # compute (the data call when non-empty), graphics and MPS (the sizing call: empty)
    Source("nvmlDeviceGetComputeRunningProcesses", 1, per_process=True),
    Source("GraphicsRunningProcesses", 1, per_process=True),
    Source("MPSComputeRunningProcesses", 1, per_process=True),
)


SOURCES: dict[str, tuple[Source, ...]] = {
    "hw.gpu.utilization": (
        Source("nvmlDeviceGetSamples", 1),  # GPU_UTILIZATION_SAMPLES: the data call
        Source("nvmlDeviceGetEncoderUtilization", 1),
        Source("nvmlDeviceGetDecoderUtilization", 1),
    ),
    "hw.gpu.memory.usage": (Source("nvmlDeviceGetMemoryInfo", 1),),
    "hw.gpu.memory.limit": (Source("nvmlDeviceGetMemoryInfo", 1),),
    "hw.gpu.memory.utilization": (Source("nvmlDeviceGetMemoryInfo", 1),),
    "nvidia.gpu.memory.reserved": (Source("nvmlDeviceGetMemoryInfo", 1),),  # the same v2 read
    "hw.power": (Source("nvmlDeviceGetSamples", 1),),  # TOTAL_POWER_SAMPLES
    "hw.energy": (Source("nvmlDeviceGetTotalEnergyConsumption", 1),),
    "hw.temperature": (Source("nvmlDeviceGetTemperatureV", 1),),
    "hw.status": (),  # the device state machine: no call of its own
    "hw.errors": (
        Source("nvmlDeviceGetTotalEccErrors", 2, cadence="errors"),
        _LINK_STATE,  # which links are active
        # every active link's counters in one field-values read (links 0-11: all four;
        # 12+: replay and recovery), CRC flit and data of links 12+ by the per-link call
        Source(
            "nvmlDeviceGetFieldValues", 1, cadence="errors", per="if_active", key="nvlink_errors"
        ),
        Source("nvmlDeviceGetNvLinkErrorCounter", 2, cadence="errors", per="active_link_12_up"),
    ),
    "nvidia.gpu.memory_copy.utilization": (Source("nvmlDeviceGetSamples", 1),),
    "nvidia.gpu.power.limit": (Source("nvmlDeviceGetEnforcedPowerLimit", 1),),
    "nvidia.gpu.clock.speed": (Source("nvmlDeviceGetClockInfo", 4),),  # 4 domains
    "nvidia.gpu.clock.event_reason": (Source("nvmlDeviceGetCurrentClocksEventReasons", 1),),
    "nvidia.gpu.pcie.throughput": (Source("nvmlDeviceGetPcieThroughput", 2, cadence="pcie"),),
    "nvidia.gpu.power.limit.constraint": (),  # board constants, read once
    "nvidia.gpu.k8s.allocation": (),  # the kubelet's pod-resources API, not NVML
    "nvidia.gpu.events": (),  # the event listener's own thread, no call per cycle
    "nvidia.gpu.performance_state": (Source("nvmlDeviceGetPerformanceState", 1),),
    "hw.fan.speed_ratio": (Source("nvmlDeviceGetFanSpeed_v2", 1, per="fan"),),
    "nvidia.gpu.bar1.memory.usage": _BAR1,
    "nvidia.gpu.bar1.memory.limit": _BAR1,
    "nvidia.gpu.violation.time": (
        Source("nvmlDeviceGetViolationStatus", 1, cadence="errors", per="policy"),
    ),
    "nvidia.gpu.memory.remapped_rows": _REMAP,
    "nvidia.gpu.memory.row_remap.pending": _REMAP,
    "nvidia.gpu.memory.row_remap.failure": _REMAP,
    "nvidia.gpu.memory.retired_pages": _RETIRED,
    "nvidia.gpu.memory.retired_pages.pending": _RETIRED,
    "nvidia.gpu.encoder.sessions": _ENCODER,
    "nvidia.gpu.encoder.fps": _ENCODER,
    "nvidia.gpu.encoder.latency": _ENCODER,
    "hw.network.up": (_LINK_STATE,),
    "nvidia.gpu.nvlink.io": (Source("nvmlDeviceGetFieldValues", 1, key="nvlink"),),
    "nvidia.gpu.prof.graphics_engine.activity": _GPM,
    "nvidia.gpu.prof.sm.activity": _GPM,
    "nvidia.gpu.prof.sm.occupancy": _GPM,
    "nvidia.gpu.prof.pipe.activity": _GPM,
    "nvidia.gpu.prof.dram.activity": _GPM,
    "nvidia.gpu.prof.pcie.throughput": _GPM,
    "nvidia.gpu.prof.nvlink.throughput": _GPM,
    "nvidia.gpu.prof.engine.activity": _GPM,
    "nvidia.gpu.process.utilization": (
        Source("nvmlDeviceGetProcessUtilization", 2, calls_empty=1, per_process=True),
    ),
    "nvidia.gpu.process.memory_copy.utilization": (
        Source("nvmlDeviceGetProcessUtilization", 2, calls_empty=1, per_process=True),
    ),
    "nvidia.gpu.process.memory.usage": _PROCESS_LISTS,
    "nvidia.gpu.process.count": _PROCESS_LISTS,  # the same reads, counted
    # one pid-list read per accounting_interval_s; a stats read only for a pid that is new,
    # ended or reused (nothing for a process that keeps running)
    "nvidia.gpu.process.time": (
        Source("nvmlDeviceGetAccountingPids", 1, cadence="accounting", per_process=True),
    ),
    "nvidia.gpu.process.memory.max": (
        Source("nvmlDeviceGetAccountingPids", 1, cadence="accounting", per_process=True),
    ),
    # the hw.energy read and the per-process utilisation read, shared
    "nvidia.gpu.process.energy": (Source("nvmlDeviceGetTotalEnergyConsumption", 1),),
    "nvidia.gpu.energy.unattributed": (Source("nvmlDeviceGetTotalEnergyConsumption", 1),),
}
"""Metric → the sources one read of it needs. The three ``nvmlDeviceGetSamples`` rows are
distinct sources (one per sampling type); :func:`minimum_calls` keys them by metric."""

_SAMPLE_TYPES = {
    "hw.gpu.utilization": "GPU_UTILIZATION",
    "hw.power": "TOTAL_POWER",
    "nvidia.gpu.memory_copy.utilization": "MEMORY_UTILIZATION",
}


@dataclass(frozen=True)
class Facts:
    """What one device has, where a source's cost depends on it.

    Attributes:
        links: NVLink links (state reads); active_links: links that are up (error reads);
        active_links_12_up: those numbered 12 and up (no per-link CRC field: per-link calls).
        fans: fans (speed reads); policies: violation policies the board reports.
        unsupported: catalogue metrics the device does not report at all.

    """

    links: int = 0
    active_links: int = 0
    active_links_12_up: int = 0
    fans: int = 0
    policies: int = 8
    unsupported: frozenset[str] = field(default_factory=frozenset)


_MODEL_METRICS: dict[str, tuple[str, ...]] = {
    "gpm": tuple(m for m in SOURCES if m.startswith("nvidia.gpu.prof.")),
    "bar1": ("nvidia.gpu.bar1.memory.usage", "nvidia.gpu.bar1.memory.limit"),
    "remapped_rows": (
        "nvidia.gpu.memory.remapped_rows",
        "nvidia.gpu.memory.row_remap.pending",
        "nvidia.gpu.memory.row_remap.failure",
    ),
    "retired_pages": ("nvidia.gpu.memory.retired_pages", "nvidia.gpu.memory.retired_pages.pending"),
    "encoder_stats": (
        "nvidia.gpu.encoder.sessions",
        "nvidia.gpu.encoder.fps",
        "nvidia.gpu.encoder.latency",
    ),
    "pstate": ("nvidia.gpu.performance_state",),
    "nvlink": ("nvidia.gpu.nvlink.io", "hw.network.up"),
    "accounting": ("nvidia.gpu.process.time", "nvidia.gpu.process.memory.max"),
}
"""Scenario device key (nvmlsim's format) → the metrics that answer NOT_SUPPORTED without it."""


def device_facts(device: Mapping[str, Any]) -> Facts:
    """:class:`Facts` of one device of an nvmlsim scenario (its ``devices[]`` entry, as data)."""
    unsupported = {m for key, ms in _MODEL_METRICS.items() if device.get(key) is None for m in ms}
    if (device.get("accounting") or {}).get("mode", "enabled") != "enabled":
        unsupported |= set(_MODEL_METRICS["accounting"])  # off: the mode is read once a minute
    nvlink = device.get("nvlink") or {}
    links = int(nvlink.get("links", 0))
    always_down = {d for d in nvlink.get("down", ()) if isinstance(d, int)}  # not the windows
    active = [n for n in range(links) if n not in always_down]
    fans = device.get("fans_percent")
    violations = device.get("violations_ns") or {}
    return Facts(
        links=links,
        active_links=len(active),
        active_links_12_up=sum(n >= 12 for n in active),
        fans=len(fans) if fans is not None else int(device.get("fan_percent") is not None),
        policies=sum(v is not None for v in violations.values()),
        unsupported=frozenset(unsupported),
    )


def check_catalogue(catalogue: Any = None) -> list[str]:
    """Problems between :data:`SOURCES` and the catalogue (empty when they agree)."""
    if catalogue is None:
        from gpumetrics.metrics.spec import catalogue as load

        catalogue = load()
    problems = []
    enabled = dict(catalogue.metrics)  # default-off metrics too: settings may turn them on
    for name, spec in enabled.items():
        if name not in SOURCES:
            problems.append(f"{name}: in the catalogue but has no row in SOURCES")
            continue
        for src in SOURCES[name]:
            if src.call not in spec.nvml:
                problems.append(f"{name}: {src.call} is not named in its catalogue nvml field")
    for name in SOURCES:
        if name not in enabled:
            problems.append(f"{name}: in SOURCES but not a catalogue metric")
    return problems


def minimum_calls(
    gpus: int, processes_per_gpu: int, settings: Any, facts: Facts | None = None
) -> float:
    """C calls per cycle that the enabled metric set needs (see the module docstring).

    Args:
        gpus: GPUs on the node (no MIG).
        processes_per_gpu: compute processes on each GPU (graphics and MPS lists empty).
        settings: a ``CollectionSettings`` (cadences, ``disabled_metrics``,
            ``process_metrics``).
        facts: what each GPU has (:func:`device_facts`); default: no NVLink, no fans, every
            violation policy, everything else supported.

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
        "accounting": (
            settings.interval_s / settings.accounting_interval_s
            if settings.accounting_interval_s
            else 0
        ),
    }
    facts = facts or Facts()
    per = {
        "device": 1,
        "link": facts.links,
        "active_link": facts.active_links,
        "active_link_12_up": facts.active_links_12_up,
        "if_links": int(facts.links > 0),
        "if_active": int(facts.active_links > 0),
        "fan": facts.fans,
        "policy": facts.policies,
    }
    needed: dict[tuple[str, str], float] = {}
    for metric, sources in SOURCES.items():
        if not settings.wants(metric) or metric in facts.unsupported:
            continue
        for src in sources:
            if src.per_process and not settings.process_metrics:
                continue
            key = (src.call, src.key or _SAMPLE_TYPES.get(metric, ""))
            cost = src.calls if processes_per_gpu or src.calls_empty is None else src.calls_empty
            needed[key] = cost * per[src.per] * cadence[src.cadence]
    return gpus * sum(needed.values())
