"""End-to-end, GPU events: the real Collector starts the real sidecar (subprocess mode) on a
simulated node whose GPUs raise Xid 48 and Xid 94, a storm of 10,000 identical Xid 13, and whose
second GPU falls off the bus during the listener's wait and comes back. The logs pipeline's file
exporter must show each Xid once as a log record (attributes, severity, body), one record saying
the GPU was lost, its events resuming once it is registered again, and the storm rate-limited
with the suppressed count; the metrics pipeline's file the nvidia.gpu.events counter
(docs/events.md, docs/e2e.md)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .harness import CONFIG_DIR, Proc, clean_environ, gpumetrics_command, procs, wait_for
from .otlp import FlatRecord, flatten, flatten_logs, read_log_requests, read_requests
from .scenario import GPU_UUIDS, write_scenario

pytestmark = pytest.mark.e2e

TIMEOUT_S = 180.0  # Collector and sidecar start, the loss and return (~20 s), a loaded machine
GPU_A, GPU_B = GPU_UUIDS
STORM = 10_000
BURST = 10  # events.storm_burst's default; e2e-subprocess.yaml sets a 5 s storm window
LOSE_AT_S, RESTORE_AT_S = 12.0, 15.0

NVML_EVENTS = [
    # Timed from each GPU's first registration, so none happens before the listener listens.
    {"device": 0, "type": "xid", "data": 48, "after_registration": 1, "delay_s": 1.0},
    {"device": 1, "type": "xid", "data": 94, "after_registration": 1, "delay_s": 1.0},
    {"device": 0, "type": "xid", "data": 13, "count": STORM, "after_registration": 1, "delay_s": 2},
    # GPU B's second successful registration is the one after it came back.
    {"device": 1, "type": "xid", "data": 31, "after_registration": 2, "delay_s": 0.5},
]
EVENTS = [
    {"at_s": LOSE_AT_S, "action": "lose_gpu", "device": GPU_B},
    {"at_s": RESTORE_AT_S, "action": "restore_gpu", "device": GPU_B},
]


def xids(records: list[FlatRecord], gpu: str, code: int) -> list[FlatRecord]:
    return [
        r
        for r in records
        if r.event_name == "nvidia.gpu.xid"
        and r.attributes.get("hw.id") == gpu
        and r.attributes.get("nvidia.gpu.xid.code") == code
    ]


def named(records: list[FlatRecord], event_name: str, gpu: str) -> list[FlatRecord]:
    return [r for r in records if r.event_name == event_name and r.attributes.get("hw.id") == gpu]


def counters(path: Path) -> dict[tuple[Any, ...], int]:
    """The latest nvidia.gpu.events value per (hw.id, event type, Xid code)."""
    latest: dict[tuple[Any, ...], tuple[int, int]] = {}
    for p in flatten(read_requests(path)):
        if p.metric != "nvidia.gpu.events":
            continue
        key = (p.attr("hw.id"), p.attr("nvidia.gpu.event.type"), p.attr("nvidia.gpu.xid.code"))
        if key not in latest or p.time_unix_nano >= latest[key][0]:
            latest[key] = (p.time_unix_nano, int(p.value))  # type: ignore[call-overload]
    return {k: v for k, (_, v) in latest.items()}


WANTED_COUNTS = {
    (GPU_A, "xid", 48): 1,
    (GPU_B, "xid", 94): 1,
    (GPU_A, "xid", 13): STORM,
    (GPU_B, "gpu_lost", None): 1,
    (GPU_B, "xid", 31): 1,
}


def complete(records: list[FlatRecord], counts: dict[tuple[Any, ...], int]) -> bool:
    summaries = named(records, "nvidia.gpu.events.suppressed", GPU_A)
    return (
        bool(xids(records, GPU_A, 48))
        and bool(xids(records, GPU_B, 94))
        and bool(named(records, "nvidia.gpu.lost", GPU_B))
        and bool(xids(records, GPU_B, 31))
        and bool(summaries)
        and all(counts.get(k) == v for k, v in WANTED_COUNTS.items())
    )


def test_gpu_events_reach_the_logs_pipeline(otelcol: Path, tmp_path: Path, gpu_processes) -> None:
    a, b = gpu_processes
    scenario = write_scenario(tmp_path / "scenario.yaml", a.pid, b.pid, EVENTS, NVML_EVENTS)
    metrics, events = tmp_path / "metrics.jsonl", tmp_path / "events.jsonl"
    env = clean_environ(
        {
            "SIDECAR_COMMAND": str(gpumetrics_command()),
            "SIDECAR_SIMULATE": str(scenario),
            "SIDECAR_PROFILER_SOCKET": str(tmp_path / "profiler.sock"),
            "E2E_OUTPUT": str(metrics),
            "E2E_EVENTS_OUTPUT": str(events),
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

        def diagnostics() -> str:
            records = flatten_logs(read_log_requests(events))
            seen = Counter((r.event_name, r.attributes.get("nvidia.gpu.xid.code")) for r in records)
            return f"records: {dict(seen)}\ncounters: {counters(metrics)}\n{collector.log_tail()}"

        wait_for(
            lambda: complete(flatten_logs(read_log_requests(events)), counters(metrics)),
            TIMEOUT_S,
            "Xid 48 and 94, the lost GPU and its resumed events, the storm summary, the counters",
            diagnostics,
        )
        assert collector.stop(timeout_s=20) == 0, collector.log_tail()

    records = flatten_logs(read_log_requests(events))
    # Each Xid arrived once (at-least-once delivery never duplicated a record in the end).
    (dbe,) = xids(records, GPU_A, 48)
    (contained,) = xids(records, GPU_B, 94)
    assert (dbe.severity_text, dbe.severity_number) == ("ERROR", 17)
    assert (contained.severity_text, contained.severity_number) == ("WARN", 13)
    for r, gpu, name in ((dbe, GPU_A, "gpu0"), (contained, GPU_B, "gpu1")):
        assert r.resource == {"host.name": "e2e-node"}
        assert r.scope == "parca.nvidia_gpu_metrics"
        assert r.attributes["hw.id"] == gpu and r.attributes["hw.name"] == name
        assert r.attributes["hw.model"] == "NVIDIA L4" and r.attributes["hw.type"] == "gpu"
        assert r.attributes["nvidia.gpu.event.type"] == "xid"
        assert r.time_unix_nano == 0 and r.observed_time_unix_nano > 0
    assert dbe.attributes["nvidia.gpu.xid.mnemonic"] == "ROBUST_CHANNEL_GPU_ECC_DBE"
    assert dbe.body.startswith(f"Xid 48 on gpu0 ({GPU_A}): Double Bit ECC Error")
    assert contained.attributes["nvidia.gpu.xid.immediate_action"] == "RESTART_APP"
    assert "Contained ECC error" in contained.body

    # The GPU fell off the bus during the wait: one record; its events resumed after it came
    # back and was registered again.
    (lost,) = named(records, "nvidia.gpu.lost", GPU_B)
    assert lost.severity_text == "FATAL" and "is lost" in lost.body
    assert lost.attributes["nvml.return_code"] == "GPU_IS_LOST"
    (resumed,) = xids(records, GPU_B, 31)
    assert resumed.observed_time_unix_nano > lost.observed_time_unix_nano

    # The storm: BURST records, then one summary of the rest; the counter has every one.
    assert len(xids(records, GPU_A, 13)) == BURST
    (summary,) = named(records, "nvidia.gpu.events.suppressed", GPU_A)
    assert summary.attributes["nvidia.gpu.event.suppressed_count"] == STORM - BURST
    assert summary.attributes["nvidia.gpu.xid.code"] == 13
    assert f"{STORM - BURST} more identical events" in summary.body

    keys = Counter(
        (
            r.event_name,
            r.attributes.get("hw.id"),
            r.attributes.get("nvidia.gpu.xid.code"),
            r.observed_time_unix_nano,
        )
        for r in records
    )
    assert max(keys.values()) == 1, "a log record was delivered twice"
    counts = counters(metrics)
    for key, want in WANTED_COUNTS.items():
        assert counts.get(key) == want, (key, counts)
