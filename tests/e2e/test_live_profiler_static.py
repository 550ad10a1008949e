"""The live-profiler stage's own pieces, without the profiler (Python stage): which profiler
exits are skips, how the agent is started, the profiles file read back (not UTF-8 included),
the internal telemetry parsed, and how scripts/test.sh tells a skipped stage from a passed one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from . import liveprofiler
from .harness import REPO
from .liveprofiler import load_failure, metric_value, profile_resources, profiler_argv

# Lines the profiler (v0.0.202633) logged on the project's machine: unpatched without
# CAP_SYS_RESOURCE, and patched without tracefs.
EPERM = (
    'time=2026-12-06T20:43:29.684Z level=ERROR msg="Failed to start agent controller: failed to '
    "load eBPF tracer: failed to load eBPF code: failed to set RODATA variables: failed to prepare "
    "programs and maps for system analysis: failed to adjust rlimit: failed to set temporary "
    'rlimit: operation not permitted"'
)
NO_TRACEFS = (
    'time=2026-12-06T20:45:18.650Z level=ERROR msg="Failed to start agent controller: failed to '
    "attach scheduler monitor: failed to configure tracepoint on "
    'tracer.hookPoint{group:\\"sched\\", name:\\"sched_process_free\\"}: neither debugfs '
    'nor tracefs are mounted"'
)


def test_kernel_refusals_are_skips_with_the_profilers_message() -> None:
    started = 'time=2026-12-06T20:43:29.514Z level=INFO msg="Starting OTEL profiling agent (devel)"'
    assert load_failure(f"{started}\n{EPERM}\n") == (
        "Failed to start agent controller: failed to load eBPF tracer: failed to load eBPF code: "
        "failed to set RODATA variables: failed to prepare programs and maps for system analysis: "
        "failed to adjust rlimit: failed to set temporary rlimit: operation not permitted"
    )
    assert load_failure(NO_TRACEFS) == (
        "Failed to start agent controller: failed to attach scheduler monitor: failed to "
        'configure tracepoint on tracer.hookPoint{group:"sched", name:"sched_process_free"}: '
        "neither debugfs nor tracefs are mounted"
    )
    assert load_failure("mount: /sys/kernel/tracing: permission denied.") == (
        "mount: /sys/kernel/tracing: permission denied."
    )
    assert load_failure("unshare: unshare failed: Operation not permitted\n") == (
        "unshare: unshare failed: Operation not permitted"
    )


def test_other_exits_are_failures() -> None:
    assert load_failure('time=x level=ERROR msg="Failure to parse arguments: bad flag"') is None
    assert (
        load_failure(
            'time=x level=ERROR msg="Failed to start agent controller: failed to start reporter: '
            'context canceled"'
        )
        is None
    )  # the Collector was not listening: the test's own fault
    assert load_failure("") is None


def test_agent_is_started_in_a_private_mount_namespace_only_without_tracefs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    binary = Path("/cache/ebpf-profiler")
    monkeypatch.setattr(liveprofiler, "tracefs_mounted", lambda: True)
    direct = profiler_argv(binary, "127.0.0.1:4317", ("OTEL_SERVICE_NAME", "X"))
    assert direct == [
        "/cache/ebpf-profiler",
        "-collection-agent",
        "127.0.0.1:4317",
        "-disable-tls",
        "-reporter-interval",
        "1s",
        "-reporter-jitter",
        "0",
        "-env-vars",
        "OTEL_SERVICE_NAME,X",
    ]
    assert "-env-vars" not in profiler_argv(binary, "127.0.0.1:4317", ())
    monkeypatch.setattr(liveprofiler, "tracefs_mounted", lambda: False)
    wrapped = profiler_argv(binary, "127.0.0.1:4317", ())
    assert wrapped[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    assert wrapped[5:7] == ["sh", "-c"]
    assert wrapped[8:] == [
        "/cache/ebpf-profiler",
        "-collection-agent",
        "127.0.0.1:4317",
        "-disable-tls",
        "-reporter-interval",
        "1s",
        "-reporter-jitter",
        "0",
    ]
    # the wrapper mounts tracefs, then execs the agent with its arguments
    done = subprocess.run(
        ["sh", "-c", wrapped[7].replace("mount -t tracefs", "true"), "echo", "a b", "c"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == "a b c\n"


def test_profiles_file_values_that_are_not_utf8_follow_the_declarations_rule() -> None:
    # the Collector's JSON writes the profiler's raw bytes (pdata's encoder does not replace them)
    line = (
        b'{"resourceProfiles":[{"resource":{"attributes":['
        b'{"keyStrindex":1,"value":{"intValue":"42"}},'
        b'{"keyStrindex":2,"value":{"stringValueStrindex":3}},'
        b'{"key":"other","value":{"stringValue":"x"}}]},'
        b'"schemaUrl":"https://opentelemetry.io/schemas/1.37.0"},'
        b'{"resource":{"attributes":[{"keyStrindex":1,"value":{"intValue":"7"}}]}}],'
        b'"dictionary":{"stringTable":["","process.pid","process.environment_variable.V","caf\xe9"]}}'
    )
    (found,) = profile_resources([line], 42, now=1.5)
    assert found.resource == {
        "process.pid": ("int", 42),
        "process.environment_variable.V": ("string", "caf\ufffd"),
        "other": ("string", "x"),
    }
    assert (found.schema_url, found.seen_at) == ("https://opentelemetry.io/schemas/1.37.0", 1.5)


def test_metric_value_sums_the_matching_samples() -> None:
    text = "\n".join(
        [
            "# HELP otelcol_gpumetrics_exporter_declarations_failed Profile resources ...",
            "# TYPE otelcol_gpumetrics_exporter_declarations_failed counter",
            'otelcol_gpumetrics_exporter_declarations_failed{reason="gone"} 3',
            'otelcol_gpumetrics_exporter_declarations_failed{reason="invalid_utf8"} 2',
            "otelcol_gpumetrics_exporter_processes_declared 16",
            "otelcol_gpumetrics_exporter_processes_declared_other 99",
        ]
    )
    name = "otelcol_gpumetrics_exporter_declarations_failed"
    assert metric_value(text, name, reason="invalid_utf8") == 2
    assert metric_value(text, name) == 5
    assert metric_value(text, "otelcol_gpumetrics_exporter_processes_declared") == 16
    assert metric_value(text, "absent") == 0


JUNIT_OUTCOME = REPO / "scripts" / "junit_outcome.py"


def outcome(tmp_path: Path, cases: str) -> tuple[int, str, str]:
    report = tmp_path / "report.xml"
    report.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    reason = tmp_path / "reason"
    done = subprocess.run(
        [sys.executable, str(JUNIT_OUTCOME), str(report), str(reason)],
        capture_output=True,
        text=True,
    )
    return done.returncode, done.stdout, reason.read_text() if reason.exists() else ""


def test_a_skipped_stage_is_not_a_passed_one(tmp_path: Path) -> None:
    props = '<properties><property name="exec_to_gpu_resource_s" value="1.98"/></properties>'
    passed = f'<testcase name="t[a]">{props}</testcase><testcase name="t[b]"/>'
    assert outcome(tmp_path, passed) == (0, "t[a]: exec_to_gpu_resource_s = 1.98\n", "")
    skip = '<skipped type="pytest.skip" message="not root (euid 1000): ..."/>'
    rc, _, reason = outcome(tmp_path, f'<testcase name="t[a]">{skip}</testcase>' * 2)
    assert (rc, reason) == (77, "2 of 2 skipped: not root (euid 1000): ...")
    rc, _, reason = outcome(
        tmp_path, f'<testcase name="t[a]">{skip}</testcase><testcase name="b"/>'
    )
    assert (rc, reason) == (77, "1 of 2 skipped: not root (euid 1000): ...")
    assert outcome(tmp_path, "")[0] == 1  # nothing ran is no pass
