"""GPM profiling metrics (``nvidia.gpu.prof.*``): SM activity, occupancy, pipes, DRAM, links.

NVML's GPU Performance Monitoring (NVML API reference, "GPM Functions"; Hopper and newer)
works on pairs of counter snapshots: ``nvmlGpmSampleGet`` (or ``nvmlGpmMigSampleGet`` for one
MIG GPU instance) fills a buffer from ``nvmlGpmSampleAlloc``, and ``nvmlGpmMetricsGet`` turns
two buffers into ratios and rates over the interval between them. Here:

- **Support is probed once per device** (``nvmlGpmQueryDeviceSupport``). A GPU that answers
  ``isSupportedDevice = 0`` (everything before Hopper: A100, V100, Ada...) gets no GPM point
  and one INFO line; a driver without the GPM symbols (before R520) gets a DEBUG line.
- **Two buffers per source, allocated once** (a source is the GPU, or one MIG GPU instance),
  used in turn: each tick takes one sample into the buffer not holding the older one and,
  from the second tick on, one ``nvmlGpmMetricsGet`` over the pair, so two calls per source
  per tick. NVML wants the two samples of a pair "greater than 100ms" apart: below a 100 ms
  collection interval the older sample is kept and the newer buffer re-sampled until the pair
  spans 100 ms, so GPM works at any interval (a point every ``ceil(100 ms / interval)`` ticks,
  each over the whole pair). Buffers are freed with ``nvmlGpmSampleFree`` when the collector
  stops or releases NVML, when the GPU is lost, and when a GPU instance goes away
  (:func:`free_gpm`).
- **Which GPM metrics** are requested comes from the catalogue (each metric's ``gpm`` list);
  a metric answering NOT_SUPPORTED (per metric, in a successful call) is dropped from that
  source's later requests, counted once and logged in one INFO line per source.
- **Units**: percentages become ratios 0-1 (outside 0-100 dropped), MiB/s become By/s.
- **MIG**: the parent's samples describe the whole GPU; each GPU instance's go on its MIG
  device's series, or, for a GPU instance split into several compute instances, on the
  parent's ``hw.id`` with ``nvidia.gpu.mig.gpu_instance.id`` (the value belongs to the GPU
  instance, not to one of its compute instances, and is never copied onto several).
- **Streaming mode** (``nvmlGpmSetStreamingEnabled``) is not needed for this sampling and is
  never changed: the collector does not alter device settings.
- **Non-finite values** (a GPM answer can be NaN or Inf) are dropped, counted as
  ``gpumetrics.values.dropped{reason=non_finite}`` and logged once.
"""

from __future__ import annotations

import ctypes
import math
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pynvml

from gpumetrics.metrics import names
from gpumetrics.metrics.buffer import Attributes
from gpumetrics.metrics.spec import catalogue
from gpumetrics.nvml import convert
from gpumetrics.nvml.calls import NVML_ERRORS
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.query import QueryError, code_name, query

SUPPORT = "nvmlGpmQueryDeviceSupport"
SAMPLE = "nvmlGpmSampleGet"
MIG_SAMPLE = "nvmlGpmMigSampleGet"
METRICS = "nvmlGpmMetricsGet"
ALLOC = "nvmlGpmSampleAlloc"
FREE = "nvmlGpmSampleFree"
MIN_INTERVAL_NS = 100_000_000
"""NVML: the interval between the two samples "should be greater than 100ms"."""
_CAPABILITY_CODES = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    }
)
_METRIC = struct.Struct("<IId24x")
"""``nvmlGpmMetric_t``: metricId, nvmlReturn, value, metricInfo (three pointers), 40 bytes."""
OFF = "off"
"""``dev.state["gpm"]`` of a device without GPM (not supported, or no symbols)."""


@dataclass(frozen=True)
class Target:
    """One GPM metric the collector requests and where its value goes.

    Attributes:
        metric_id: ``NVML_GPM_METRIC_*`` value.
        gpm_name: its name without the prefix (``SM_UTIL``).
        metric: the catalogue metric it feeds.
        attrs: the attributes its points carry (beyond the device's).
        rate: the value is MiB/s (By/s in the catalogue), else a percentage (ratio).

    """

    metric_id: int
    gpm_name: str
    metric: str
    attrs: Attributes
    rate: bool


@lru_cache(maxsize=8)
def targets(off: frozenset[str]) -> tuple[Target, ...]:
    """Return the GPM metrics the catalogue asks for, minus those of ``off`` catalogue metrics.

    A GPM metric the installed nvidia-ml-py does not define is left out.
    """
    out = []
    for spec in catalogue().metrics.values():
        if spec.name in off:
            continue
        for src in spec.gpm:
            metric_id = getattr(pynvml, f"NVML_GPM_METRIC_{src.metric}", None)
            if isinstance(metric_id, int):
                out.append(
                    Target(metric_id, src.metric, spec.name, src.attributes, spec.unit == "By/s")
                )
    return tuple(out)


@dataclass
class Source:
    """The GPU, or one GPU instance of it: two sample buffers and the request struct.

    Attributes:
        buffers: the two ``nvmlGpmSample_t`` buffers (allocated on first use).
        current: index of the buffer the next sample goes into.
        sampled_ns: monotonic time of the sample in the other buffer, None before the first.
        targets: the GPM metrics still requested from this source.
        request: the reusable ``c_nvmlGpmMetricsGet_t`` (rebuilt when ``targets`` change).

    """

    buffers: list[Any] = field(default_factory=list)
    current: int = 0
    sampled_ns: int | None = None
    targets: tuple[Target, ...] = ()
    request: Any = None


@dataclass
class GpmState:
    """A GPM-capable device's sources: ``None`` (the whole GPU) and each GPU instance id."""

    sources: dict[int | None, Source] = field(default_factory=dict)


def _probe(dev: Device, tick: Tick) -> GpmState | str | None:
    """Probe GPM support once: a state, OFF, or None to try again next tick (transient)."""
    c = dev.calls
    if not all(c.enabled(s) for s in (SUPPORT, SAMPLE, METRICS, ALLOC, FREE)):
        tick.ctx.log.debug("GPU %s: the driver has no GPM symbols; no GPM metrics", dev.uuid)
        return OFF
    support = c.get(SUPPORT, SUPPORT, pynvml.nvmlGpmQueryDeviceSupport, dev.handle)
    if support is None:
        return OFF if not c.enabled(SUPPORT) else None
    if not int(support.isSupportedDevice):
        c.note(
            SUPPORT,
            "isSupportedDevice = 0 (GPM is for Hopper and newer): no nvidia.gpu.prof.* metrics",
        )
        return OFF
    return GpmState()


def _request(src: Source) -> Any:
    req = pynvml.c_nvmlGpmMetricsGet_t()
    req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = len(src.targets)
    for i, t in enumerate(src.targets):
        req.metrics[i].metricId = t.metric_id
    return req


def _sample(dev: Device, gi: int | None, buffer: Any) -> bool:
    c = dev.calls
    if gi is None:
        return c.get(SAMPLE, SAMPLE, pynvml.nvmlGpmSampleGet, dev.handle, buffer) is not None
    cap = f"{MIG_SAMPLE}:{gi}"
    return c.get(cap, MIG_SAMPLE, pynvml.nvmlGpmMigSampleGet, dev.handle, gi, buffer) is not None


def _read(dev: Device, tick: Tick, gi: int | None, src: Source) -> list[tuple[Target, float]]:
    """Take this tick's sample of one source; return (target, value) pairs over the last tick."""
    c = dev.calls
    if not src.buffers:
        for _ in range(2):
            buffer = c.get(ALLOC, ALLOC, pynvml.nvmlGpmSampleAlloc)
            if buffer is None:
                _free_buffers(src)
                return []
            src.buffers.append(buffer)
    if not _sample(dev, gi, src.buffers[src.current]):
        return []
    previous = src.sampled_ns
    if previous is not None and tick.mono_ns - previous < MIN_INTERVAL_NS:
        # Too close to the older sample for a metric: keep the older one; the next tick
        # samples into this buffer again, until the pair spans the minimum window.
        return []
    src.sampled_ns = tick.mono_ns
    src.current = 1 - src.current  # this sample is the older one of the next pair
    if previous is None or not src.targets:
        return []
    if src.request is None:
        src.request = _request(src)
    req = src.request
    req.sample1, req.sample2 = src.buffers[src.current], src.buffers[1 - src.current]
    if c.get(METRICS, METRICS, pynvml.nvmlGpmMetricsGet, req) is None:
        return []
    out, dropped = [], []
    # nvmlGpmMetric_t is {unsigned metricId; nvmlReturn_t nvmlReturn; double value; 3 pointers}
    # (nvml.h): read the returns and values from the array's bytes rather than field by field
    # through the binding's structure wrappers (a few hundred attribute reads per tick).
    raw = ctypes.string_at(ctypes.addressof(req.metrics), _METRIC.size * len(src.targets))
    for t, (_, ret, value) in zip(src.targets, _METRIC.iter_unpack(raw), strict=True):
        if ret == pynvml.NVML_SUCCESS:
            out.append((t, value))
            continue
        tick.ctx.telemetry.add(
            NVML_ERRORS,
            1,
            {"nvml.function": f"{METRICS}:{t.gpm_name}", "nvml.return_code": code_name(ret)},
        )
        if ret in _CAPABILITY_CODES:
            dropped.append(t)
    if dropped:
        src.targets = tuple(t for t in src.targets if t not in dropped)
        src.request = None
        where = "the GPU" if gi is None else f"GPU instance {gi}"
        tick.ctx.log.info(
            "GPU %s: GPM metrics not supported for %s, not asked again: %s",
            dev.uuid,
            where,
            ", ".join(t.gpm_name for t in dropped),
        )
    return out


def _attrs(dev: Device, gi: int | None) -> Attributes:
    """Return the attributes of a source's points.

    The GPU's; a GPU instance's MIG device's; or the GPU's with the GPU instance id when the
    instance has several compute instances.
    """
    if gi is None:
        return dev.attrs
    owners = [i for i in dev.instances.values() if i.gpu.gpu_instance_id == gi]
    if len(owners) == 1:
        return owners[0].attrs
    return dev.attrs + ((names.AttrMIGGPUInstanceID, gi),)


def _add(dev: Device, tick: Tick, t: Target, value: float, attrs: Attributes) -> None:
    if not math.isfinite(value):  # nvmlGpmMetricsGet returns doubles: NaN / Inf happen
        dev.calls.drop(METRICS, convert.NON_FINITE, detail=f"{t.gpm_name}={value}")
        return
    if t.rate:
        number, reason = convert.mib_per_s_to_bytes_per_s(value)
    else:
        number, reason = convert.percent_to_ratio(value)
    if number is None:
        dev.calls.drop(METRICS, reason or convert.OUT_OF_RANGE, detail=f"{t.gpm_name}={value}")
        return
    tick.points.add(t.metric, number, tick.now_ns, attrs + t.attrs)


def collect_gpm(dev: Device, tick: Tick) -> None:
    """Add the GPM points of a physical GPU and of its MIG GPU instances.

    Raises:
        DeviceLost, LibraryDown: as from the gate.

    """
    wanted = targets(tick.ctx.settings.off_metrics)
    if not wanted:
        return
    state = dev.state.get("gpm")
    if state is None:
        state = _probe(dev, tick)
        if state is None:
            return
        dev.state["gpm"] = state
    if not isinstance(state, GpmState):
        return
    keys: list[int | None] = [None]
    if dev.mig_enabled and dev.calls.enabled(MIG_SAMPLE):
        gis = {i.gpu.gpu_instance_id for i in dev.instances.values()}
        keys += sorted(gi for gi in gis if gi is not None)
    for gone in [k for k in state.sources if k not in keys]:
        _free_buffers(state.sources.pop(gone))
    for gi in keys:
        src = state.sources.get(gi)
        if src is None:
            src = state.sources[gi] = Source(targets=wanted)
        attrs = _attrs(dev, gi)
        for t, value in _read(dev, tick, gi, src):
            _add(dev, tick, t, value, attrs)


def _free_buffers(src: Source) -> None:
    for buffer in src.buffers:
        try:
            query(FREE, pynvml.nvmlGpmSampleFree, buffer)
        except QueryError:
            pass  # the session is gone: the driver's memory went with it
    src.buffers = []
    src.sampled_ns = None
    src.request = None


def free_gpm(dev: Device) -> int:
    """Free every GPM sample buffer of ``dev``; return how many sources held buffers.

    Called when the collector stops or releases NVML (before ``nvmlShutdown``) and when the
    GPU is lost; the next tick of a device that comes back allocates afresh.
    """
    state = dev.state.get("gpm")
    if not isinstance(state, GpmState):
        return 0  # OFF stays: support does not change within a session
    del dev.state["gpm"]
    held = 0
    for src in state.sources.values():
        held += bool(src.buffers)
        _free_buffers(src)
    return held
