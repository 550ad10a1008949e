"""Assertions shared by the subprocess-mode and remote-mode end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from .otlp import FlatPoint, duplicates, process_resources

# What the test declares for the process on GPU 0 (OTEL_* variables a profiler captured, and an
# attribute the profiler itself puts on the process's profiles).
DECLARED_SERVICE = "e2e-trainer"
DECLARED_ENV = {
    "OTEL_SERVICE_NAME": DECLARED_SERVICE,
    "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=e2e",
}
DECLARED_ATTRS = {"profiler.name": "gpumetrics-e2e"}

DEVICE_METRICS = ("hw.gpu.utilization", "hw.gpu.memory.usage", "hw.power")


def device_points(points: Iterable[FlatPoint]) -> list[FlatPoint]:
    """Points on the host resource (device metrics), not on a per-process resource."""
    return [p for p in points if p.resource_attr("process.pid") is None]


NODE_NAME = "e2e-node"


def assert_device_metrics(points: Sequence[FlatPoint], uuids: Sequence[str]) -> None:
    """Each of ``DEVICE_METRICS`` has points for exactly the scenario's GPUs, by ``hw.id``, on
    the host resource named after the sidecar's ``--node-name``."""
    host = device_points(points)
    names = {p.resource_attr("host.name") for p in host}
    assert names == {NODE_NAME}, f"host.name on the host resource: {names}"
    for metric in DEVICE_METRICS:
        seen = {p.attr("hw.id") for p in host if p.metric == metric}
        assert seen == set(uuids), f"{metric}: hw.id {sorted(map(str, seen))}, want {uuids}"


def declared_resources(
    requests: Sequence[ExportMetricsServiceRequest], pid: int
) -> list[dict[str, AnyValue]]:
    """Per-process resources of ``pid`` that carry the declared service name."""
    found = []
    for raw in process_resources(requests):
        pid_value = raw["process.pid"]
        if pid_value.WhichOneof("value") != "int_value" or pid_value.int_value != pid:
            continue
        name = raw.get("service.name")
        if name is not None and name.string_value == DECLARED_SERVICE:
            found.append(raw)
    return found


def count_declared_requests(requests: Sequence[ExportMetricsServiceRequest], pid: int) -> int:
    """How many exported requests hold ``pid``'s resource with the declared service name."""
    return sum(1 for r in requests if declared_resources([r], pid))


def assert_process_resources(
    requests: Sequence[ExportMetricsServiceRequest], declared_pid: int, other_pid: int
) -> None:
    """The declared process's resource carries the declared ``service.name``, what the
    profiler captured, and ``process.pid`` as an int; the undeclared one never gets the
    declared name."""
    found = declared_resources(requests, declared_pid)
    assert found, (
        f"no resource with process.pid={declared_pid} (int) and service.name={DECLARED_SERVICE}; "
        f"per-process resources seen: {describe_process_resources(requests)}"
    )
    last = found[-1]
    assert last["deployment.environment.name"].string_value == "e2e"  # OTEL_RESOURCE_ATTRIBUTES
    assert last["profiler.name"].string_value == DECLARED_ATTRS["profiler.name"]
    others = [
        raw for raw in process_resources(requests) if raw["process.pid"].int_value == other_pid
    ]
    assert others, f"no resource for the undeclared pid {other_pid}"
    for raw in others:
        assert raw["process.pid"].WhichOneof("value") == "int_value"
        assert raw.get("service.name") is None or (
            raw["service.name"].string_value != DECLARED_SERVICE
        )


def describe_process_resources(requests: Sequence[ExportMetricsServiceRequest]) -> str:
    """A short text of the distinct per-process resources, for failure messages."""
    seen = set()
    for raw in process_resources(requests):
        seen.add(tuple(sorted((k, str(v).strip().replace("\n", " ")) for k, v in raw.items())))
    return "\n".join(str(s) for s in sorted(seen)) or "(none)"


def assert_no_duplicates(points: Sequence[FlatPoint]) -> None:
    """No series (resource, scope, metric, attributes) has two points with one timestamp."""
    assert points, "no data points exported"
    dups = duplicates(points)
    assert not dups, f"{len(dups)} duplicated points, e.g. {next(iter(dups.items()))}"
