"""Volatile ECC error counts (``hw.errors{error.type=corrected|uncorrected}``), slow cadence.

``nvmlDeviceGetTotalEccErrors(handle, NVML_MEMORY_ERROR_TYPE_CORRECTED / _UNCORRECTED,
NVML_VOLATILE_ECC)``: counts since the driver was loaded, exported as cumulative monotonic Sums
with reset detection (:mod:`gpumetrics.nvml.counters`). Read every ``errors_interval_s``
(default 10 s). NOT_SUPPORTED (no ECC, or ECC disabled) disables it for the device.

``error.type`` is conditionally required "if and only if an error has occurred" (semantic
conventions ``metric.hw.errors``, https://opentelemetry.io/docs/specs/semconv/hardware/common/): a
type is emitted
with its attribute once its count is above 0; while no error of any type has occurred, one
series *without* ``error.type`` carries the 0.
"""

from __future__ import annotations

import pynvml

from gpumetrics.metrics import names
from gpumetrics.nvml import convert
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.counters import NO_ERROR, CounterTracker, error_series
from gpumetrics.nvml.device import Device

FUNCTION = "nvmlDeviceGetTotalEccErrors"
ERROR_TYPES: tuple[tuple[int, str], ...] = (
    (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
    (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected"),
)


def collect_ecc(dev: Device, tick: Tick) -> None:
    """Add ``hw.errors`` points when due (``errors_interval_s`` cadence)."""
    interval = tick.ctx.settings.errors_interval_s
    if not interval or not tick.wants(names.MetricErrors):
        return
    last = dev.state.get("ecc_ns")
    if last is not None and tick.mono_ns - last < round(interval * 1e9):
        return
    dev.state["ecc_ns"] = tick.mono_ns
    trackers: dict[str, CounterTracker] = dev.state.setdefault("ecc", {})
    counts: dict[str, int] = {}
    for err_type, label in ERROR_TYPES:
        count = dev.calls.get(
            FUNCTION,
            FUNCTION,
            pynvml.nvmlDeviceGetTotalEccErrors,
            dev.handle,
            err_type,
            pynvml.NVML_VOLATILE_ECC,
        )
        if count is None:
            continue
        value, reason = convert.count_value(int(count))
        if value is None:
            dev.calls.drop(FUNCTION, reason or convert.SENTINEL, detail=label)
            continue
        counts[label] = int(value)
    gpu = dev.attrs + ((names.AttrHwType, names.HwTypeGPU),)
    for label, n in error_series(counts):
        tracker = trackers.get(label)
        if tracker is None:
            tracker = trackers[label] = CounterTracker(
                f"GPU {dev.uuid} {label} ECC errors", tick.ctx.log
            )
        start = tracker.observe(n, tick.now_ns)
        attrs = gpu if label == NO_ERROR else gpu + ((names.AttrErrorType, label),)
        tick.points.add(names.MetricErrors, n, tick.now_ns, attrs, start)
