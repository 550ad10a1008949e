"""End-to-end, subprocess mode: the real Collector (otelcol-gpumetrics) starts the real sidecar
as a go-plugin child on a simulated node, a process is declared through the profiler RPC, and the
file exporter's output shows device metrics, the declared identity and no duplicated points;
SIGTERM to the Collector stops the plugin cleanly (docs/e2e.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from . import checks
from .harness import (
    CONFIG_DIR,
    Proc,
    clean_environ,
    declare,
    gpumetrics_command,
    log_records,
    pid_gone,
    procs,
    wait_for,
)
from .otlp import flatten, read_requests
from .scenario import GPU_UUIDS, write_scenario

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = 90.0  # Collector start + sidecar start (Python imports) on a loaded CI machine
DATA_TIMEOUT_S = 60.0
SCRAPES_AFTER_DECLARE = 3


def test_subprocess_mode(otelcol: Path, tmp_path: Path, gpu_processes) -> None:
    config = yaml.safe_load((CONFIG_DIR / "e2e-subprocess.yaml").read_text())
    args = config["receivers"]["gpumetrics"]["args"]
    assert args[args.index("--include-env-vars") + 1] == ",".join(checks.INCLUDE_ENV_VARS)
    declared, other = gpu_processes
    scenario = write_scenario(tmp_path / "scenario.yaml", declared.pid, other.pid)
    output = tmp_path / "metrics.jsonl"
    profiler_socket = tmp_path / "profiler.sock"
    env = clean_environ(
        {
            "SIDECAR_COMMAND": str(gpumetrics_command()),
            "SIDECAR_SIMULATE": str(scenario),
            "SIDECAR_PROFILER_SOCKET": str(profiler_socket),
            "E2E_OUTPUT": str(output),
            "E2E_EVENTS_OUTPUT": str(tmp_path / "events.jsonl"),
        }
    )
    with procs() as started:
        collector = Proc(
            "otelcol",
            [otelcol, f"--config={CONFIG_DIR / 'e2e-subprocess.yaml'}"],
            env,
            tmp_path / "otelcol.log",
        )
        started.append(collector)

        wait_for(
            profiler_socket.exists,
            START_TIMEOUT_S,
            f"the profiler socket {profiler_socket}",
            collector.log_tail,
        )
        out = declare(
            f"unix:{profiler_socket}",
            declared.pid,
            checks.declared_env("declared"),
            checks.DECLARED_ATTRS,
        )
        assert "accepted 1" in out

        wait_for(
            lambda: (
                checks.count_declared_requests(read_requests(output), declared.pid)
                >= SCRAPES_AFTER_DECLARE
            ),
            DATA_TIMEOUT_S,
            f"{SCRAPES_AFTER_DECLARE} exports carrying the declared process",
            lambda: (
                checks.describe_process_resources(read_requests(output))
                + "\n"
                + collector.log_tail()
            ),
        )
        assert collector.stop(timeout_s=20) == 0, collector.log_tail()

    requests = read_requests(output)
    points = flatten(requests)
    checks.assert_device_metrics(points, GPU_UUIDS)
    checks.assert_process_resources(requests, declared.pid, other.pid)
    checks.assert_no_duplicates(points)
    assert_clean_plugin_shutdown(collector.log_path)


def assert_clean_plugin_shutdown(log_path: Path) -> None:
    """go-plugin's log shows the sidecar exited by itself after Shutdown (no SIGKILL), and the
    sidecar process is gone."""
    records = log_records(log_path)
    messages = [str(r.get("msg", "")) for r in records]
    started = [r for r in records if r.get("msg") == "plugin started"]
    assert len(started) == 1, f"want one plugin start, got {len(started)}"
    sidecar_pid = int(started[0]["pid"])  # type: ignore[call-overload]

    assert not [m for m in messages if "failed to exit gracefully" in m], "the plugin was killed"
    exited = [r for r in records if r.get("msg") == "plugin process exited"]
    assert len(exited) == 1, "go-plugin did not see the plugin process exit"
    assert exited[0].get("level") == "info" and "error" not in exited[0], exited[0]
    # Logged by go-plugin's Kill only when the process exited within its 2 s grace period.
    assert "plugin exited" in messages
    wait_for(lambda: pid_gone(sidecar_pid), 10, f"the sidecar (pid {sidecar_pid}) to be gone")
