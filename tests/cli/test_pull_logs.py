"""``gpumetrics pull-logs``: the GPU events through the console script (issue 28 item 12)."""

from __future__ import annotations

import json
import socket

import pytest
from google.protobuf import json_format
from gpumetrics.cli import main
from gpumetrics.events import GpuEvent
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

GPU = (("hw.id", "GPU-stub-0"), ("hw.name", "gpu0"))
T = 1_767_225_600 * 10**9


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def xid(sidecar, code=48):
    sidecar.parts.events.record(GpuEvent("xid", code, "GPU-stub-0", GPU, T))
    sidecar.parts.batcher.run_once()


def records(out: str) -> list:
    request = json_format.Parse(out, logs_service_pb2.ExportLogsServiceRequest())
    return [r for rl in request.resource_logs for sl in rl.scope_logs for r in sl.log_records]


def test_pull_logs_prints_otlp_json_acknowledges_and_then_prints_an_empty_request(running, capsys):
    sidecar, address = running
    xid(sidecar)
    code, out, err = run(capsys, "pull-logs", address, "--consumer", "ops")
    assert (code, err) == (0, "")
    (record,) = records(out)
    assert record.event_name == "nvidia.gpu.xid"
    assert '"resourceLogs"' in out  # protobuf's JSON mapping
    (consumer,) = [c for c in sidecar.parts.logs_store.stats().consumers if c.name == "ops"]
    assert consumer.acked_sequence >= 1
    code, out, err = run(capsys, "pull-logs", address, "--consumer", "ops")
    assert (code, out) == (0, "{}\n")
    assert json.loads(out) == {}
    epoch = sidecar.parts.logs_store.epoch
    assert err == f"no new batches for consumer 'ops' (epoch {epoch})\n"


def test_pull_logs_text_shows_one_line_per_record_and_no_ack_keeps_it(running, capsys):
    sidecar, address = running
    xid(sidecar, 94)
    code, out, _ = run(capsys, "pull-logs", address, "--format", "text", "--no-ack")
    assert code == 0
    header, resource, line = out.splitlines()[:3]
    assert header.startswith("epoch ") and "records 1" in header
    assert resource.startswith("resource {") and "host.name" in resource
    assert line.startswith("  @00:00:00.000Z ") and "nvidia.gpu.xid" in line and "94" in line
    again = run(capsys, "pull-logs", address, "--format", "text")[1]
    assert "records 1" in again.splitlines()[0]  # not acknowledged the first time


def test_pull_logs_max_records_is_checked_like_max_points(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["pull-logs", "127.0.0.1:1", "--max-records", "-1"])
    assert exit_.value.code == 2
    assert "--max-records: -1: must be 0..4294967295" in capsys.readouterr().err


def test_pull_logs_names_itself_when_nothing_listens(capsys):
    with socket.socket() as held:  # bound, never listening: connections to it are refused
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        code, _, err = run(capsys, "pull-logs", f"127.0.0.1:{port}")
    assert code == 1
    assert err.startswith(f"gpumetrics: pull-logs 127.0.0.1:{port}: UNAVAILABLE")
    assert "is the sidecar running?" in err
