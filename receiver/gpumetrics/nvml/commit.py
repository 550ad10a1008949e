"""Committing one cycle's points to the producer, and the per-cycle self-telemetry gauges.

A cycle's points are gathered per device as columns (:class:`~gpumetrics.metrics.columns.Points`,
see :mod:`gpumetrics.nvml.context`) and committed here with one ``Producer.commit`` call,
after ``hw.status`` for every device (every state, 1 for the current; semantic conventions
``metric.hw.gpu.status``) and ``nvidia.gpu.k8s.allocation`` for every holder of a device (its
annotation, :mod:`gpumetrics.metrics.attribution`). The producer checks every column against
``MetricBuffer.add``'s rules (the last guard): a point it refuses is counted as
``gpumetrics.values.dropped{reason=invalid_point}`` instead of failing the cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpumetrics.metrics import names
from gpumetrics.metrics.producer import Producer
from gpumetrics.nvml.context import Points
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.state import STATES
from gpumetrics.selftelemetry import SelfTelemetry

_GPU_TYPE = ((names.AttrHwType, names.HwTypeGPU),)


def with_instances(devices: Iterable[Device]) -> list[Device]:
    """Every device followed by its MIG instances."""
    out: list[Device] = []
    for d in devices:
        out.append(d)
        out.extend(d.instances.values())
    return out


def status_points(devices: Iterable[Device], now_ns: int, points: Points) -> None:
    """Add ``hw.status{hw.type=gpu, hw.state}`` for every device and every state to ``points``."""
    for d in devices:
        attrs = d.attrs + _GPU_TYPE
        for state, value in d.health.status_values():
            points.add(
                names.MetricStatus, value, now_ns, attrs + ((names.AttrHwState, state),), d.start_ns
            )


def allocation_points(devices: Iterable[Device], now_ns: int, points: Points) -> None:
    """Add ``nvidia.gpu.k8s.allocation`` for every holder of every device (identity attributes)."""
    for d in devices:
        for attrs, value in d.annotation.allocations:
            points.add(names.MetricGPUK8sAllocation, value, now_ns, d.id_attrs + attrs, 0)


def commit(
    producer: Producer,
    telemetry: SelfTelemetry,
    devices: list[Device],
    points: Sequence[Points],
    now_ns: int,
) -> int:
    """Record ``points`` (each device's) and ``hw.status`` of ``devices``; return the count."""
    all_devices = with_instances(devices)
    first = Points(producer.specs)  # hw.status and allocations lead the host resource
    status_points(all_devices, now_ns, first)
    allocation_points(all_devices, now_ns, first)
    added, refused = producer.commit(first, *points)
    if refused:
        telemetry.add("gpumetrics.values.dropped", refused, {"reason": "invalid_point"})
    publish_devices(telemetry, all_devices)
    return added


def publish_devices(telemetry: SelfTelemetry, devices: Iterable[Device]) -> None:
    """Set ``gpumetrics.devices{hw.state}`` (every state, MIG instances included)."""
    counts = {s.value: 0 for s in STATES}
    for d in devices:
        counts[d.health.state.value] += 1
    telemetry.replace(
        "gpumetrics.devices", {(("hw.state", state),): n for state, n in counts.items()}
    )
