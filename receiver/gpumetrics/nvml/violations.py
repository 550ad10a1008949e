"""Violation (throttle) time counters: ``nvidia.gpu.violation.time{nvidia.gpu.violation.policy}``.

``nvmlDeviceGetViolationStatus(device, policy)`` gives ``violationTime``, the nanoseconds the
GPU's clocks were held below the requested clocks because of ``policy``, counted since the
driver was loaded (NVML API reference, ``nvmlDeviceGetViolationStatus``,
``nvmlPerfPolicyType_t``). Exported in seconds as cumulative monotonic Sums with reset
detection; ``rate()`` of a series is the fraction of time the policy throttled the GPU, what
dcgm-exporter's ``DCGM_FI_DEV_*_VIOLATION`` fields are used for. Each policy is its own
capability (a policy the board does not report answers NOT_SUPPORTED and is not asked again).
The policies a board does not report are logged in one INFO line per GPU. Read every
``errors_interval_s``: cumulative, so a slow cadence loses nothing.
"""

from __future__ import annotations

import logging

import pynvml

from gpumetrics.metrics import names
from gpumetrics.nvml import convert
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.counters import counter_set
from gpumetrics.nvml.device import Device

FUNCTION = "nvmlDeviceGetViolationStatus"
POLICIES: tuple[tuple[int, str], ...] = (
    (pynvml.NVML_PERF_POLICY_POWER, "power"),
    (pynvml.NVML_PERF_POLICY_THERMAL, "thermal"),
    (pynvml.NVML_PERF_POLICY_SYNC_BOOST, "sync_boost"),
    (pynvml.NVML_PERF_POLICY_BOARD_LIMIT, "board_limit"),
    (pynvml.NVML_PERF_POLICY_LOW_UTILIZATION, "low_utilization"),
    (pynvml.NVML_PERF_POLICY_RELIABILITY, "reliability"),
    (pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS, "total_app_clocks"),
    (pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS, "total_base_clocks"),
)
"""``NVML_PERF_POLICY_*`` and their ``nvidia.gpu.violation.policy`` values."""


def collect_violations(dev: Device, tick: Tick) -> None:
    """Add one ``nvidia.gpu.violation.time`` point per policy that answers, when due."""
    if not tick.wants(names.MetricGPUViolationTime):
        return
    if not tick.due(dev.state, "violations_ns", tick.ctx.settings.errors_interval_s):
        return
    c = dev.calls
    counters = counter_set(dev.state, "violations", f"GPU {dev.uuid} violation time", tick.ctx.log)
    unsupported = []
    for policy, label in POLICIES:
        cap = f"{FUNCTION}:{policy}"
        if not c.enabled(cap):
            continue
        status = c.get(
            cap,
            FUNCTION,
            pynvml.nvmlDeviceGetViolationStatus,
            dev.handle,
            policy,
            unsupported_level=logging.DEBUG,
        )
        if status is None:
            if not c.enabled(cap):
                unsupported.append(label)
            continue
        ns = int(status.violationTime)
        seconds, reason = convert.ns_to_s(ns)
        if seconds is None:
            c.drop(FUNCTION, reason or convert.SENTINEL, detail=label)
            continue
        start = counters.observe(label, ns, tick.now_ns)
        attrs = dev.attrs + ((names.AttrViolationPolicy, label),)
        tick.points.add(names.MetricGPUViolationTime, seconds, tick.now_ns, attrs, start)
    if unsupported:
        c.note(
            FUNCTION,
            "policies not reported by this board, not asked again: " + ", ".join(unsupported),
        )
