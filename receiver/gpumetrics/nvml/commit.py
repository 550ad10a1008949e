"""Committing one cycle's points to the producer, and the per-cycle self-telemetry gauges.

A cycle's points are gathered per device (see :mod:`gpumetrics.nvml.context`) and committed
here in one ``record_host`` call plus one ``record_process`` call per pid, together with
``hw.status`` for every device (every state, 1 for the current; semantic conventions
``metric.hw.gpu.status``), and ``nvidia.gpu.k8s.allocation`` for every holder of a device (its
annotation, :mod:`gpumetrics.metrics.attribution`). ``MetricBuffer.add`` is the last guard: a
point it refuses is counted as ``gpumetrics.values.dropped{reason=invalid_point}`` instead of
failing the cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from gpumetrics.metrics import names
from gpumetrics.metrics.buffer import MetricBuffer
from gpumetrics.metrics.producer import Producer
from gpumetrics.nvml.context import HostPoint, Points
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.state import HealthState
from gpumetrics.selftelemetry import SelfTelemetry

_GPU_TYPE = ((names.AttrHwType, names.HwTypeGPU),)


def with_instances(devices: Iterable[Device]) -> list[Device]:
    """Every device followed by its MIG instances."""
    out: list[Device] = []
    for d in devices:
        out.append(d)
        out.extend(d.instances.values())
    return out


def status_points(devices: Iterable[Device], now_ns: int) -> list[HostPoint]:
    """``hw.status{hw.type=gpu, hw.state}`` for every device and every state."""
    out: list[HostPoint] = []
    for d in devices:
        attrs = d.attrs + _GPU_TYPE
        for state, value in d.health.status_values():
            out.append(
                (
                    names.MetricStatus,
                    value,
                    now_ns,
                    attrs + ((names.AttrHwState, state),),
                    d.start_ns,
                )
            )
    return out


def allocation_points(devices: Iterable[Device], now_ns: int) -> list[HostPoint]:
    """``nvidia.gpu.k8s.allocation`` for every holder of every device (identity attributes)."""
    return [
        (names.MetricGPUK8sAllocation, value, now_ns, d.id_attrs + attrs, 0)
        for d in devices
        for attrs, value in d.annotation.allocations
    ]


class _Adder:
    """Adds rows to a buffer, counting the points the model refuses."""

    def __init__(self) -> None:
        self.refused = 0

    def rows(self, rows: list[Any]) -> Callable[[MetricBuffer], int]:
        def add(buf: MetricBuffer) -> int:
            n = 0
            for metric, value, t, attrs, start in rows:
                try:
                    buf.add(metric, value, t, attrs, start)
                    n += 1
                except ValueError:
                    self.refused += 1
            return n

        return add


def commit(
    producer: Producer,
    telemetry: SelfTelemetry,
    devices: list[Device],
    points: Points,
    now_ns: int,
) -> int:
    """Record ``points`` and ``hw.status`` of ``devices`` into ``producer``; return the count."""
    all_devices = with_instances(devices)
    by_pid: dict[int, list[Any]] = {}
    for p in points.processes:
        by_pid.setdefault(p[0], []).append(p[1:])
    adder = _Adder()
    host = [
        *status_points(all_devices, now_ns),
        *allocation_points(all_devices, now_ns),
        *points.host,
    ]
    n = producer.record_host(adder.rows(host))
    for pid, rows in by_pid.items():
        n += producer.record_process(pid, adder.rows(rows))
    if adder.refused:
        telemetry.add("gpumetrics.values.dropped", adder.refused, {"reason": "invalid_point"})
    publish_devices(telemetry, all_devices)
    return n


def publish_devices(telemetry: SelfTelemetry, devices: Iterable[Device]) -> None:
    """Set ``gpumetrics.devices{hw.state}`` (every state, MIG instances included)."""
    counts = {s.value: 0 for s in HealthState}
    for d in devices:
        counts[d.health.state.value] += 1
    telemetry.replace(
        "gpumetrics.devices", {(("hw.state", state),): n for state, n in counts.items()}
    )
