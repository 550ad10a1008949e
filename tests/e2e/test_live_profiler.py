"""End-to-end, live: the real OpenTelemetry eBPF profiler (its agent, built from its Go module at
a pinned version, scripts/ebpf-profiler/) profiles a real busy child in a container-like cgroup
(last path element a 64-hex id) with OTEL_* variables, and sends OTLP/gRPC profiles to the real
Collector (collector-config/e2e-live-profiler.yaml), whose gpumetrics exporter declares them to
the sidecar that runs the child as a GPU process of a simulated node. The child's GPU resource,
as the Collector exported it, must equal its profile resource, as the same Collector exported
it: keys, values and value types, and the schema URL, from the first batch on, without and with
captured environment variables, and again after the child exec's another program.

Skipped, with the reason, where the profiler cannot load its eBPF programs (not root, no
tracefs and no way to mount it privately, a kernel that refuses them). scripts/test.sh runs this
as its own stage and shows a skip as skipped, not passed (docs/e2e.md). Measured latencies are
recorded as properties of the test (junit XML) and printed by that stage.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from . import checks
from .harness import (
    CONFIG_DIR,
    GpuProcess,
    Proc,
    clean_environ,
    free_port,
    log_records,
    procs,
    profiler_address,
    sidecar_argv,
    wait_for,
)
from .liveprofiler import (
    PROFILER_VERSION,
    BusyChild,
    ContainerCgroup,
    JsonLines,
    SeenResource,
    load_failure,
    metric_value,
    profile_resources,
    profiler_argv,
    profiler_binary,
    unavailable_reason,
)
from .otlp import read_requests
from .profiles import side_by_side, typed_proto
from .scenario import write_scenario

pytestmark = [pytest.mark.e2e, pytest.mark.live_profiler]

PROFILES_GATE = "--feature-gates=+service.profilesSupport"
# Profiler start-up (loading its eBPF programs, reading every process's mappings) took 3-25 s
# on the project's 2-core machine; the first profile follows within a reporting interval.
START_TIMEOUT_S = 120.0
DATA_TIMEOUT_S = 60.0
LATER_EXPORTS = 3  # exports after the first equal one that must be equal too
ENV_NAMES = ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "E2E_NOT_UTF8")
CHILD_ENV: dict[str, str | bytes] = {
    "OTEL_SERVICE_NAME": "e2e-live-trainer",
    "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=e2e,service.version=1.2",
    "E2E_NOT_UTF8": b"caf\xe9",  # Latin-1: the profiler sends the raw byte
}


@pytest.fixture(scope="module")
def profiler() -> Path:
    """The profiler binary, or a skip naming what this machine lacks."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return profiler_binary()


def port_open(address: str) -> bool:
    """True once something accepts TCP connections at host:port."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def telemetry(port: int) -> str:
    """The Collector's internal telemetry (Prometheus text), "" while it is not served."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())
    except (urllib.error.URLError, ConnectionError):
        return ""


class GpuResources:
    """The child's per-process resources in the metrics file (with their ResourceMetrics'
    schema URL), accumulated in export order."""

    def __init__(self, path: Path, pid: int) -> None:
        self.path, self.pid = path, pid
        self._lines = 0
        self.seen: list[SeenResource] = []

    def update(self) -> list[SeenResource]:
        requests = read_requests(self.path)
        now = time.monotonic()
        for request in requests[self._lines :]:
            for rm in request.resource_metrics:
                raw = {kv.key: kv.value for kv in rm.resource.attributes}
                pid = raw.get("process.pid")
                if pid is not None and pid.WhichOneof("value") == "int_value":
                    if pid.int_value == self.pid:
                        resource = {k: typed_proto(v) for k, v in raw.items()}
                        self.seen.append(SeenResource(resource, rm.schema_url, now))
        self._lines = len(requests)
        return self.seen


def differs(gpu: SeenResource, profile: SeenResource) -> str:
    """Both resources side by side, for a failure message."""
    return f"schema_url: GPU {gpu.schema_url!r}, profile {profile.schema_url!r}\n" + side_by_side(
        gpu.resource, profile.resource, ("GPU resource", "profile resource")
    )


def same(a: SeenResource, b: SeenResource) -> bool:
    return a.resource == b.resource and a.schema_url == b.schema_url


@pytest.mark.parametrize("env_vars", [(), ENV_NAMES], ids=["without-env-vars", "with-env-vars"])
def test_live_profile_resource_equals_gpu_resource(
    otelcol: Path,
    profiler: Path,
    env_vars: tuple[str, ...],
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    cgroup = ContainerCgroup()
    try:
        child = BusyChild(CHILD_ENV, cgroup)
        other = GpuProcess()
        try:
            run(otelcol, profiler, env_vars, tmp_path, cgroup, child, other, record_property)
        finally:
            child.close()
            other.close()
    finally:
        cgroup.remove()


def run(
    otelcol: Path,
    profiler: Path,
    env_vars: tuple[str, ...],
    tmp_path: Path,
    cgroup: ContainerCgroup,
    child: BusyChild,
    other: GpuProcess,
    record_property: Callable[[str, object], None],
) -> None:
    scenario = write_scenario(tmp_path / "scenario.yaml", child.pid, other.pid)
    metrics_out, profiles_out = tmp_path / "metrics.jsonl", tmp_path / "profiles.jsonl"
    sock = tmp_path / "gm.sock"
    otlp, telemetry_port = f"127.0.0.1:{free_port()}", free_port()
    env = clean_environ(
        {
            "SIDECAR_ENDPOINT": f"unix://{sock}",
            "SIDECAR_PROFILER_ENDPOINT": profiler_address(f"unix:{sock}"),
            "OTLP_GRPC_ENDPOINT": otlp,
            "OTELCOL_TELEMETRY_PORT": str(telemetry_port),
            "E2E_OUTPUT": str(metrics_out),
            "E2E_PROFILES_OUTPUT": str(profiles_out),
        }
    )
    profiles = JsonLines(profiles_out)
    profiled: list[SeenResource] = []
    gpu = GpuResources(metrics_out, child.pid)

    with procs() as started:
        sidecar = Proc(
            "sidecar",
            sidecar_argv(scenario, f"unix:{sock}", checks.NODE_NAME, env_vars),
            clean_environ(),
            tmp_path / "sidecar.log",
        )
        started.append(sidecar)
        collector = Proc(
            "otelcol",
            [otelcol, f"--config={CONFIG_DIR / 'e2e-live-profiler.yaml'}", PROFILES_GATE],
            env,
            tmp_path / "otelcol.log",
        )
        started.append(collector)
        agent: list[Proc] = []

        def logs() -> str:
            return "\n".join(p.log_tail(4000) for p in (sidecar, collector, *agent))

        wait_for(lambda: port_open(otlp), DATA_TIMEOUT_S, f"the OTLP receiver on {otlp}", logs)
        profiler_started = time.monotonic()
        agent.append(
            Proc("ebpf-profiler", profiler_argv(profiler, otlp, env_vars), env, tmp_path / "p.log")
        )
        started.append(agent[0])

        def child_profiles() -> Iterator[SeenResource]:
            new = profile_resources(profiles.new_lines(), child.pid, time.monotonic())
            profiled.extend(new)
            yield from new

        def first_profile() -> SeenResource | None:
            found = next(child_profiles(), None)
            if found is None and not agent[0].running():
                failure = load_failure(agent[0].log_path.read_text(errors="replace"))
                if failure is not None:
                    pytest.skip(f"the eBPF profiler {PROFILER_VERSION} cannot load here: {failure}")
                raise AssertionError(f"the eBPF profiler exited ({agent[0].popen.returncode})")
            return found

        first = wait_for(first_profile, START_TIMEOUT_S, "the child's first profile", logs)
        record_property(
            "profiler_start_to_first_profile_s", round(first.seen_at - profiler_started, 2)
        )
        record_property("child_start_to_first_profile_s", round(first.seen_at - child.started, 2))

        # What the profiler says about the child: the keys of its rules, the container the
        # cgroup names, the captured variables (raw bytes replaced as the wire requires).
        assert first.schema_url == "https://opentelemetry.io/schemas/1.37.0"
        exe = os.readlink(f"/proc/{child.pid}/exe")
        expected = {
            "process.pid": ("int", child.pid),
            "process.executable.path": ("string", exe),
            "process.executable.name": ("string", os.path.basename(exe)),
            "container.id": ("string", cgroup.id),
        }
        if env_vars:
            expected |= {
                "process.environment_variable.OTEL_SERVICE_NAME": ("string", "e2e-live-trainer"),
                "process.environment_variable.OTEL_RESOURCE_ATTRIBUTES": (
                    "string",
                    "deployment.environment.name=e2e,service.version=1.2",
                ),
                "process.environment_variable.E2E_NOT_UTF8": ("string", "caf\ufffd"),
            }
        assert first.resource == expected, side_by_side(
            first.resource, expected, ("profile", "want")
        )

        # The GPU resource equals it, from the first batch on.
        def equal_gpu(profile: SeenResource, after: int) -> Callable[[], list[int]]:
            """Finds the index of the first GPU resource from ``after`` on equal to ``profile``
            (as a one-item list: an index may be 0)."""

            def find() -> list[int]:
                list(child_profiles())
                seen = gpu.update()
                return [i for i in range(after, len(seen)) if same(seen[i], profile)][:1]

            return find

        before = wait_for(
            lambda: gpu.update() or None, DATA_TIMEOUT_S, "the child's GPU resource", logs
        )
        for g in before:
            assert same(g, first), "the first batches differ:\n" + differs(g, first)
        (at,) = wait_for(equal_gpu(first, 0), DATA_TIMEOUT_S, "the GPU resource", logs)
        wait_for(
            lambda: len(gpu.update()) > at + LATER_EXPORTS or None, DATA_TIMEOUT_S, "exports", logs
        )
        for g in gpu.seen:
            assert same(g, first), "a GPU resource differs from the profile:\n" + differs(g, first)

        # After an exec (same pid and start time, another executable): the profile changes and
        # the GPU resource follows, through the declaration.
        exec_at = time.monotonic()
        child.exec()
        shell = wait_for(
            lambda: next((p for p in child_profiles() if p.resource != first.resource), None),
            DATA_TIMEOUT_S,
            "a profile of the exec'd child",
            logs,
        )
        new_exe = os.readlink(f"/proc/{child.pid}/exe")
        assert shell.resource == expected | {
            "process.executable.path": ("string", new_exe),
            "process.executable.name": ("string", os.path.basename(new_exe)),
        }, side_by_side(shell.resource, expected, ("profile after exec", "before"))
        seen_before_exec = len(gpu.seen)
        (switched,) = wait_for(
            equal_gpu(shell, seen_before_exec), DATA_TIMEOUT_S, "the GPU resource after exec", logs
        )
        wait_for(
            lambda: len(gpu.update()) > switched + LATER_EXPORTS or None,
            DATA_TIMEOUT_S,
            "exports after exec",
            logs,
        )
        record_property("exec_to_profile_s", round(shell.seen_at - exec_at, 2))
        record_property("exec_to_gpu_resource_s", round(gpu.seen[switched].seen_at - exec_at, 2))
        record_property(
            "exec_profile_to_gpu_resource_s", round(gpu.seen[switched].seen_at - shell.seen_at, 2)
        )
        counters = telemetry(telemetry_port)
        (tmp_path / "telemetry.txt").write_text(counters)
        assert agent[0].stop(timeout_s=30) == 0, agent[0].log_tail()
        assert collector.stop(timeout_s=20) == 0, collector.log_tail()
        assert sidecar.stop(timeout_s=20) == 0, sidecar.log_tail()

    # Every resource of the child, on both sides, is one of the two, the old before the new.
    for p in profiled:
        assert p.resource in (first.resource, shell.resource), side_by_side(
            p.resource, first.resource, ("profile", "first")
        )
    kinds = ["old" if same(g, first) else "new" if same(g, shell) else "other" for g in gpu.seen]
    assert "other" not in kinds, differs(gpu.seen[kinds.index("other")], shell)
    assert kinds == sorted(kinds, key=lambda k: k == "new"), f"GPU resources in order: {kinds}"
    assert gpu.seen[-1].schema_url == shell.schema_url == "https://opentelemetry.io/schemas/1.37.0"

    # The GPU resource followed the exec through the declarations (the sidecar keeps a declared
    # resource as declared: only a new declaration changes it), which the sidecar accepted.
    declarations = [
        str(r.get("executable"))
        for r in log_records(collector.log_path)
        if r.get("msg") == "Declared a profiled process to the gpumetrics sidecar"
        and r.get("pid") == child.pid
    ]
    assert declarations == [exe, new_exe], f"the child's declarations: {declarations}"
    rejected = [r for r in log_records(collector.log_path) if "rejected" in str(r.get("msg"))]
    assert not rejected, rejected[:3]
    declared = metric_value(counters, "otelcol_gpumetrics_exporter_processes_declared")
    assert declared >= 2, f"the exporter declared {declared} processes:\n{counters[-3000:]}"
    if env_vars:  # the child's E2E_NOT_UTF8
        utf8 = metric_value(
            counters, "otelcol_gpumetrics_exporter_declarations_failed", reason="invalid_utf8"
        )
        assert utf8 >= 1, counters[-3000:]
