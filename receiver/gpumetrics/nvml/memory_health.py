"""Memory repair state: remapped rows (Ampere and newer) and retired pages (before Ampere).

Read every ``errors_interval_s`` (NVML API reference):

- ``nvmlDeviceGetRemappedRows`` → ``nvidia.gpu.memory.remapped_rows{error.type}`` (rows
  remapped for correctable / uncorrectable errors, over the board's life: cumulative monotonic
  Sums), ``nvidia.gpu.memory.row_remap.pending`` (a remap waits for a GPU reset) and
  ``…row_remap.failure`` (a remap failed: the board needs service). One call feeds all three.
- Page retirement, through one ``nvmlDeviceGetFieldValues`` call:
  ``NVML_FI_DEV_RETIRED_SBE`` (pages retired after multiple single-bit errors: ``corrected``),
  ``…_DBE`` (after a double-bit error: ``uncorrected``) and ``…_PENDING``, the fields
  dcgm-exporter's ``DCGM_FI_DEV_RETIRED_*`` report. Cheaper than ``nvmlDeviceGetRetiredPages``,
  which returns the page addresses (two calls per cause).

Ampere and newer boards remap rows instead of retiring pages, so they answer the retired-page
fields NOT_SUPPORTED (once), and older boards answer ``nvmlDeviceGetRemappedRows``
NOT_SUPPORTED (once). Both counts are ``error.type`` = corrected / uncorrected, every type
every read (these are repair counts, not ``hw.errors``, so both series always exist).
"""

from __future__ import annotations

import pynvml

from gpumetrics.metrics import names
from gpumetrics.nvml import convert
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.counters import counter_set
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.fields import read_fields

REMAPPED = "nvmlDeviceGetRemappedRows"
RETIRED = (
    (pynvml.NVML_FI_DEV_RETIRED_SBE, names.ErrorCorrected),
    (pynvml.NVML_FI_DEV_RETIRED_DBE, names.ErrorUncorrected),
)
RETIRED_PENDING = pynvml.NVML_FI_DEV_RETIRED_PENDING
_REMAP_METRICS = (
    names.MetricGPUMemoryRemappedRows,
    names.MetricGPUMemoryRowRemapPending,
    names.MetricGPUMemoryRowRemapFailure,
)
_RETIRED_METRICS = (names.MetricGPUMemoryRetiredPages, names.MetricGPUMemoryRetiredPagesPending)


def collect_memory_health(dev: Device, tick: Tick) -> None:
    """Add the remapped-row and retired-page points when due."""
    if not tick.wants(*_REMAP_METRICS, *_RETIRED_METRICS):
        return
    if not tick.due(dev.state, "memory_health_ns", tick.ctx.settings.errors_interval_s):
        return
    if tick.wants(*_REMAP_METRICS):
        _remapped_rows(dev, tick)
    if tick.wants(*_RETIRED_METRICS):
        _retired_pages(dev, tick)


def _count(dev: Device, tick: Tick, metric: str, counts: dict[str, int], function: str) -> None:
    counters = counter_set(dev.state, metric, f"GPU {dev.uuid} {metric}", tick.ctx.log)
    for label, raw in counts.items():
        n, reason = convert.count_value(raw)
        if n is None:
            dev.calls.drop(function, reason or convert.SENTINEL, detail=f"{metric} {label}")
            continue
        start = counters.observe(label, n, tick.now_ns)
        attrs = dev.attrs + ((names.AttrErrorType, label),)
        tick.points.add(metric, int(n), tick.now_ns, attrs, start)


def _flag(tick: Tick, dev: Device, metric: str, value: int) -> None:
    if tick.wants(metric):
        tick.points.add(metric, int(bool(value)), tick.now_ns, dev.attrs)


def _remapped_rows(dev: Device, tick: Tick) -> None:
    rows = dev.calls.get(REMAPPED, REMAPPED, pynvml.nvmlDeviceGetRemappedRows, dev.handle)
    if rows is None:
        return
    corrected, uncorrected, pending, failure = (int(v) for v in rows)
    if tick.wants(names.MetricGPUMemoryRemappedRows):
        counts = {names.ErrorCorrected: corrected, names.ErrorUncorrected: uncorrected}
        _count(dev, tick, names.MetricGPUMemoryRemappedRows, counts, REMAPPED)
    _flag(tick, dev, names.MetricGPUMemoryRowRemapPending, pending)
    _flag(tick, dev, names.MetricGPUMemoryRowRemapFailure, failure)


def _retired_pages(dev: Device, tick: Tick) -> None:
    fields = [f for f, _ in RETIRED] + [RETIRED_PENDING]
    values = read_fields(dev, tick, "retired_pages", fields)
    counts = {label: int(values[f]) for f, label in RETIRED if f in values}
    if counts and tick.wants(names.MetricGPUMemoryRetiredPages):
        _count(dev, tick, names.MetricGPUMemoryRetiredPages, counts, "nvmlDeviceGetFieldValues")
    if RETIRED_PENDING in values:
        _flag(tick, dev, names.MetricGPUMemoryRetiredPagesPending, int(values[RETIRED_PENDING]))
