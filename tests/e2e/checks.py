"""Assertions shared by the subprocess-mode and remote-mode end-to-end tests."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from gpumetrics.identity.cgroup import container_id
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from .otlp import FlatPoint, duplicates, process_resources

# The GPU stand-in processes carry CAPTURED_VARIABLE; the declared one also DECLARED_ENV. The
# sidecar is configured to capture INCLUDE_ENV_VARS, as the profiler would be (-env-vars).
# `gpumetrics declare` plays the profiler: it declares the resource the eBPF profiler gives the
# process (pid, executable and container id from /proc, process.environment_variable.* of
# each --env) plus DECLARED_ATTRS, which only a profiler knows (an APM agent's service.name).
DECLARED_SERVICE = "e2e-trainer"
CAPTURED_VARIABLE = "E2E_GPU_ROLE"
DECLARED_ENV = {
    "OTEL_SERVICE_NAME": DECLARED_SERVICE,
    "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=e2e",
}
INCLUDE_ENV_VARS = (CAPTURED_VARIABLE, *DECLARED_ENV)
DECLARED_ATTRS = {"service.name": DECLARED_SERVICE, "profiler.name": "gpumetrics-e2e"}


def declared_env(role: str) -> dict[str, str]:
    """The environment `gpumetrics declare` reports for the declared process."""
    return {CAPTURED_VARIABLE: role, **DECLARED_ENV}


def own_resource(pid: int, env: dict[str, str]) -> dict[str, AnyValue]:
    """The resource the eBPF profiler's rules give ``pid`` (docs/identity.md), computed here
    from /proc: ``readlink`` of its exe, its cgroup file, and the captured ``env``."""
    exe = os.readlink(f"/proc/{pid}/exe")
    with open(f"/proc/{pid}/cgroup", "rb") as f:
        cid = container_id(f.read())  # the rule is tested on the profiler's own strings
    res = {
        "process.pid": AnyValue(int_value=pid),
        "process.executable.path": AnyValue(string_value=exe),
        "process.executable.name": AnyValue(string_value=exe.rsplit("/", 1)[-1]),
        **{f"process.environment_variable.{k}": AnyValue(string_value=v) for k, v in env.items()},
    }
    if cid is not None:
        res["container.id"] = AnyValue(string_value=cid)
    return res


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
    """identity.mode profiler, end to end. The declared process's GPU resource is exactly the
    resource that was declared (nothing added: no host.name, no service.name fallback); before
    the declaration it was the same less DECLARED_ATTRS (the profiler's rules, as the profiler
    computes them). The undeclared process's resource is exactly the profiler's rules' one."""
    before = own_resource(declared_pid, declared_env("declared"))
    after = {**before, **{k: AnyValue(string_value=v) for k, v in DECLARED_ATTRS.items()}}
    found = declared_resources(requests, declared_pid)
    assert found, (
        f"no resource with process.pid={declared_pid} (int) and service.name={DECLARED_SERVICE}; "
        f"per-process resources seen: {describe_process_resources(requests)}"
    )
    for raw in found:
        assert raw == after, f"declared: {describe([raw])}\nwant {describe([after])}"
    earlier = [
        raw
        for raw in process_resources(requests)
        if raw["process.pid"].int_value == declared_pid and "service.name" not in raw
    ]
    for raw in earlier:
        assert raw == before, f"before declaring: {describe([raw])}\nwant {describe([before])}"
    others = [
        raw for raw in process_resources(requests) if raw["process.pid"].int_value == other_pid
    ]
    assert others, f"no resource for the undeclared pid {other_pid}"
    want = own_resource(other_pid, {CAPTURED_VARIABLE: "undeclared"})
    for raw in others:
        assert raw == want, f"undeclared: {describe([raw])}\nwant {describe([want])}"


def describe(resources: Iterable[dict[str, AnyValue]]) -> str:
    """Resources as sorted ``key=value`` lines, for failure messages."""
    return "\n".join(
        ", ".join(f"{k}={str(v).strip()}" for k, v in sorted(raw.items())) for raw in resources
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
