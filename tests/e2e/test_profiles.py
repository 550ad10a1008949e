"""End-to-end, profiles: the real Collector with a profiles pipeline (OTLP receiver -> the
gpumetrics exporter, collector-config/e2e-profiles.yaml) and the metrics pipeline pulling from a
sidecar the test runs on a simulated node whose GPU process is a real local child. The child's
profile (the real eBPF profiler's recorded report, on the resource the profiler gives the
child) is sent over OTLP/HTTP; the exporter declares the child to the sidecar; then the child's
GPU resource, as the Collector exports it, must equal the profile's resource, as the same
Collector exports it (docs/e2e.md, docs/collector.md)."""

from __future__ import annotations

import urllib.error
import urllib.request
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
from .otlp import process_resources, read_requests
from .profiles import (
    PROFILES_PATH,
    Typed,
    exported_profile_resources,
    profile_request,
    profiler_resource,
    side_by_side,
    typed_proto,
)
from .scenario import write_scenario

pytestmark = pytest.mark.e2e

DATA_TIMEOUT_S = 90.0
PROFILES_GATE = "--feature-gates=+service.profilesSupport"
# What the profiler is configured to capture (collector-config/profiler/ebpf-profiler.yaml).
ENV_NAMES = ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES")
CHILD_ENV = {
    "OTEL_SERVICE_NAME": "e2e-trainer",
    "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=e2e",
}


def gpu_resources(output: Path, pid: int) -> list[dict[str, Typed]]:
    """Every GPU (per-process) resource of ``pid`` the metrics file holds, in order."""
    found = []
    for raw in process_resources(read_requests(output)):
        pid_value = raw["process.pid"]
        if pid_value.WhichOneof("value") == "int_value" and pid_value.int_value == pid:
            found.append({k: typed_proto(v) for k, v in raw.items()})
    return found


def post(url: str, body: bytes) -> bool:
    """POST OTLP/JSON; True once the receiver accepted it (False while it is not listening)."""
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False


def test_gpu_resource_equals_profile_resource(otelcol: Path, tmp_path: Path) -> None:
    profiled, other = GpuProcess(CHILD_ENV), GpuProcess()
    try:
        run(otelcol, tmp_path, profiled, other)
    finally:
        profiled.close()
        other.close()


def run(otelcol: Path, tmp_path: Path, profiled: GpuProcess, other: GpuProcess) -> None:
    scenario = write_scenario(tmp_path / "scenario.yaml", profiled.pid, other.pid)
    metrics_out, profiles_out = tmp_path / "metrics.jsonl", tmp_path / "profiles.jsonl"
    address = f"unix:{tmp_path / 'gm.sock'}"
    otlp = f"127.0.0.1:{free_port()}"
    serve = sidecar_argv(scenario, address, checks.NODE_NAME, ENV_NAMES)
    env = clean_environ(
        {
            "SIDECAR_ENDPOINT": f"unix://{tmp_path / 'gm.sock'}",
            "SIDECAR_PROFILER_ENDPOINT": profiler_address(address),
            "OTLP_HTTP_ENDPOINT": otlp,
            "E2E_OUTPUT": str(metrics_out),
            "E2E_PROFILES_OUTPUT": str(profiles_out),
        }
    )
    sent = profiler_resource(profiled.pid, ENV_NAMES)
    assert sent["process.environment_variable.OTEL_SERVICE_NAME"] == ("string", "e2e-trainer")

    with procs() as started:
        sidecar = Proc("sidecar", serve, clean_environ(), tmp_path / "sidecar.log")
        started.append(sidecar)
        collector = Proc(
            "otelcol",
            [otelcol, f"--config={CONFIG_DIR / 'e2e-profiles.yaml'}", PROFILES_GATE],
            env,
            tmp_path / "otelcol.log",
        )
        started.append(collector)

        def logs() -> str:
            return sidecar.log_tail() + "\n" + collector.log_tail()

        body = profile_request(sent)
        url = f"http://{otlp}{PROFILES_PATH}"
        wait_for(
            lambda: post(url, body), DATA_TIMEOUT_S, f"the OTLP receiver to accept {url}", logs
        )

        # The profiles pipeline passed the profile on unchanged.
        exported = wait_for(
            lambda: next(
                (
                    r
                    for r in exported_profile_resources(profiles_out)
                    if r.get("process.pid") == sent["process.pid"]
                ),
                None,
            ),
            DATA_TIMEOUT_S,
            "the profile in the profiles file",
            logs,
        )
        assert exported == sent

        # The declaration reached the sidecar: the GPU resource carries the profile's attributes.
        def declared() -> int | None:
            for n, res in enumerate(gpu_resources(metrics_out, profiled.pid)):
                if all(res.get(k) == v for k, v in exported.items()):
                    return n + 1
            return None

        first = wait_for(
            declared, DATA_TIMEOUT_S, "the declared attributes on the GPU resource", logs
        )
        # The next exports after that: what the pipeline keeps exporting for the process.
        later = wait_for(
            lambda: gpu_resources(metrics_out, profiled.pid)[first:][:3] or None,
            DATA_TIMEOUT_S,
            "more exports of the declared process",
            logs,
        )
        undeclared = gpu_resources(metrics_out, other.pid)
        assert collector.stop(timeout_s=20) == 0, collector.log_tail()
        assert sidecar.stop(timeout_s=20) == 0, sidecar.log_tail()

    records = log_records(collector.log_path)
    exporter_logs = [
        r
        for r in records
        if r.get("otelcol.component.id") == "gpumetrics" and r.get("otelcol.signal") == "profiles"
    ]
    assert any(
        str(r.get("msg", "")).startswith("Declared the profiled processes") for r in exporter_logs
    )
    problems = [r for r in exporter_logs if r.get("level") in ("warn", "error")]
    assert not problems, f"the gpumetrics exporter warned: {problems[:3]}"
    assert undeclared, f"no GPU resource for the undeclared pid {other.pid}"
    assert all(r.get("process.environment_variable.OTEL_SERVICE_NAME") is None for r in undeclared)

    # The acceptance rule: the process's GPU resource IS its profile resource (same keys, value
    # types and values, nothing else), in every export after the declaration.
    for gpu in later:
        assert gpu == exported, (
            "the child's GPU resource differs from its profile resource (both as the Collector "
            "exported them):\n"
            + side_by_side(gpu, exported, ("GPU resource (metrics)", "profile resource (profiles)"))
        )
