"""``gpumetrics serve --simulate`` as a process: ``gpumetrics pull`` it, stop it with SIGTERM."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

GPUMETRICS = Path(sys.executable).with_name("gpumetrics")


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith(("GPUMETRICS_", "PLUGIN_"))}


def test_serve_simulate_then_pull_json_shows_device_metrics_and_sigterm_exits_0():
    proc = subprocess.Popen(
        [
            str(GPUMETRICS),
            "serve",
            "--simulate",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--batch-interval",
            "1",
        ],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    records: queue.Queue[dict | None] = queue.Queue()
    stderr: list[str] = []

    def pump():
        for line in proc.stderr:
            stderr.append(line)
            if line.startswith("{"):
                records.put(json.loads(line))
        records.put(None)

    pumping = threading.Thread(target=pump, daemon=True)
    pumping.start()
    try:
        address = None
        while address is None:
            record = records.get(timeout=60)
            assert record is not None, "".join(stderr)
            if record["@message"] == "sidecar started":
                address = record["listen"]
                assert record["identity_mode"] == "profiler"  # the default, logged at start
        with grpc.insecure_channel(address) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=60
            )
            assert any(r.status == health_pb2.HealthCheckResponse.SERVING for r in watch)
        pulled = subprocess.run(
            [str(GPUMETRICS), "pull", address, "--format", "json"],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert pulled.returncode == 0, pulled.stderr
        request = json_format.Parse(
            pulled.stdout, metrics_service_pb2.ExportMetricsServiceRequest()
        )
        devices, names = set(), set()
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    names.add(m.name)
                    if m.name == "hw.gpu.utilization":
                        for dp in m.gauge.data_points:
                            devices.update(
                                kv.value.string_value for kv in dp.attributes if kv.key == "hw.id"
                            )
        assert {"hw.gpu.utilization", "hw.gpu.memory.usage", "hw.power", "hw.energy"} <= names
        assert len(devices) == 8  # the default profile: an 8-GPU training node
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, "".join(stderr)
        assert proc.stdout.read() == ""  # logs go to stderr only
        pumping.join(30)
        logged = [json.loads(line) for line in stderr if line.startswith("{")]
        (driver,) = [r["@message"] for r in logged if r["@message"].startswith("NVML initialised")]
        version = driver.removeprefix("NVML initialised (driver ").removesuffix(")")
        # the start-up summary: once, at INFO, with what NVML said
        ready = [(r["@level"], r["@message"]) for r in logged if r["@message"].startswith("ready")]
        assert ready == [
            (
                "info",
                f"ready: config none; listen {address} [pull: no token, declare: no token]; "
                "TLS off; relabel rules 0; "
                f"NVML simulated (h100-8x-training), driver {version}, 8 GPUs",
            )
        ]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
