"""End-to-end: what the Collector acknowledged survives SIGKILL (docs/collector.md, "Acknowledged").

The sidecar runs on a simulated 8-GPU node (one batch a second); the real Collector attaches to
it with ``collector-config/e2e-persistent.yaml`` (an OTLP exporter whose sending queue lives on
disk, with batching in the queue and no batch processor) and forwards to a second real Collector
(:data:`DOWNSTREAM_CONFIG`: OTLP receiver, file exporter). The test itself is a second pull
consumer of the sidecar, ``truth``, which sees every point the sidecar stored.

1. Under load, the first Collector is killed with SIGKILL while data flows, and restarted.
2. The downstream Collector is stopped; once the first has acknowledged three more deliveries
   (held only in its queue on disk), it is killed with SIGKILL again; both are started again.

Every point ``truth`` saw before the second kill must then arrive downstream: at least once. (The
sidecar's store keeps every batch meanwhile: ``truth`` never acknowledges.)
Duplicates (the deliveries acknowledged to the Collector's pipeline whose acknowledgement had not
reached the sidecar yet, re-delivered after the restart) are counted and printed, not failed.
"""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest
from gpumetrics.v1 import pull_pb2, pull_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from .harness import (
    CONFIG_DIR,
    Proc,
    clean_environ,
    free_port,
    gpumetrics_command,
    log_records,
    procs,
    profiler_address,
    wait_for,
)
from .otlp import flatten, read_requests

pytestmark = pytest.mark.e2e

TIMEOUT_S = 90.0
ACCEPTED = "Pipeline accepted the pulled batches"

DOWNSTREAM_CONFIG = """
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: ${env:DOWNSTREAM_ENDPOINT}
exporters:
  file:
    path: ${env:E2E_OUTPUT}
    format: json
    append: true          # restarted by the test: keep what it wrote before
    flush_interval: 100ms
service:
  telemetry:
    metrics: {level: none}
    logs: {level: info, encoding: json}
  pipelines:
    metrics: {receivers: [otlp], exporters: [file]}
"""
"""The Collector downstream of ``e2e-persistent.yaml``: what it receives, one OTLP/JSON
``ExportMetricsServiceRequest`` per line of ``E2E_OUTPUT``."""


class Truth:
    """A pull consumer of its own: every point the sidecar stored, by key.

    It never acknowledges, so it pins every batch: the Collector, whenever it registers, is sent
    everything the sidecar stored (a consumer that acknowledged first would release batches
    before the Collector's first Pull). About 0.1 MB a second, far below the store's limits.
    """

    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address)
        self._stub = pull_pb2_grpc.MetricsPullServiceStub(self._channel)
        self.read, self.epoch = 0, ""
        self.keys: set[tuple[object, ...]] = set()

    def drain(self) -> None:
        """Read everything stored so far (nothing before the first batch: UNAVAILABLE)."""
        while True:
            try:
                r = self._stub.Pull(
                    pull_pb2.PullRequest(
                        consumer="truth", ack_epoch=self.epoch, read_after_sequence=self.read
                    ),
                    timeout=10,
                )
            except grpc.RpcError as err:
                if err.code() is grpc.StatusCode.UNAVAILABLE:
                    return
                raise
            assert not self.epoch or r.epoch == self.epoch, "the sidecar restarted"
            self.epoch = r.epoch
            if not r.last_sequence:
                return
            request = ExportMetricsServiceRequest.FromString(r.export_metrics_service_request)
            self.keys.update(p.key for p in flatten([request]))
            self.read = r.last_sequence
            if not r.more:
                return

    def close(self) -> None:
        self._channel.close()


def test_acknowledged_points_survive_sigkill(otelcol: Path, tmp_path: Path) -> None:
    sock = tmp_path / "gm.sock"
    address = f"unix:{sock}"
    output = tmp_path / "downstream.jsonl"
    downstream_endpoint = f"127.0.0.1:{free_port()}"
    env = clean_environ(
        {
            "SIDECAR_ENDPOINT": address,
            "DOWNSTREAM_ENDPOINT": downstream_endpoint,
            "E2E_STORAGE_DIR": str(tmp_path / "queue"),
            "E2E_OUTPUT": str(output),
        }
    )
    sidecar_argv = [
        str(gpumetrics_command()),
        "serve",
        "--simulate",
        "h100-8x-training",
        "--listen",
        address,
        "--profiler-listen",
        profiler_address(address),
        "--batch-interval",
        "1",
        "--node-name",
        "e2e-node",
    ]
    upstream_argv: list[str | Path] = [otelcol, f"--config={CONFIG_DIR / 'e2e-persistent.yaml'}"]
    (tmp_path / "downstream.yaml").write_text(DOWNSTREAM_CONFIG)
    downstream_argv: list[str | Path] = [otelcol, f"--config={tmp_path / 'downstream.yaml'}"]
    runs = iter(range(1, 100))

    def start(started: list[Proc], name: str, argv: list[str | Path]) -> Proc:
        proc = Proc(f"{name}-{next(runs)}", argv, env, tmp_path / f"{name}.log")
        started.append(proc)
        return proc

    truth = Truth(address)
    with procs() as started:
        sidecar = Proc("sidecar", sidecar_argv, clean_environ(), tmp_path / "sidecar.log")
        started.append(sidecar)
        downstream = start(started, "downstream", downstream_argv)
        upstream = start(started, "upstream", upstream_argv)

        def logs() -> str:
            return "\n".join(p.log_tail(3000) for p in (sidecar, upstream, downstream))

        def downstream_requests() -> int:
            truth.drain()
            return len(read_requests(output))

        # 1. SIGKILL under load, while data flows downstream
        wait_for(lambda: downstream_requests() >= 3, TIMEOUT_S, "data downstream", logs)
        upstream.stop(timeout_s=10, sig=signal.SIGKILL)
        upstream = start(started, "upstream", upstream_argv)
        flowing = downstream_requests()
        wait_for(
            lambda: downstream_requests() >= flowing + 3,
            TIMEOUT_S,
            "data downstream after the first restart",
            logs,
        )

        # 2. SIGKILL while what was acknowledged sits only in the queue on disk
        assert downstream.stop(timeout_s=20) == 0, downstream.log_tail()
        accepted = len([r for r in log_records(upstream.log_path) if r.get("msg") == ACCEPTED])

        def accepted_since() -> int:
            truth.drain()
            records = log_records(upstream.log_path)
            return len([r for r in records if r.get("msg") == ACCEPTED]) - accepted

        wait_for(
            lambda: accepted_since() >= 3,
            TIMEOUT_S,
            "three deliveries accepted while downstream is down",
            logs,
        )
        upstream.stop(timeout_s=10, sig=signal.SIGKILL)
        truth.drain()
        expected = set(truth.keys)
        downstream = start(started, "downstream", downstream_argv)
        upstream = start(started, "upstream", upstream_argv)

        def missing() -> set[tuple[object, ...]]:
            truth.drain()
            return expected - {p.key for p in flatten(read_requests(output))}

        wait_for(
            lambda: not missing(),
            TIMEOUT_S,
            "every point the sidecar stored before the second kill, downstream",
            lambda: (
                f"{len(missing())} of {len(expected)} points missing, e.g. "
                f"{sorted(missing(), key=repr)[:2]}\n{logs()}"
            ),
        )
        assert upstream.stop(timeout_s=20) == 0, upstream.log_tail()
        assert downstream.stop(timeout_s=20) == 0, downstream.log_tail()
        assert sidecar.stop(timeout_s=20) == 0, sidecar.log_tail()
    truth.close()

    points = flatten(read_requests(output))
    seen: dict[tuple[object, ...], int] = {}
    for p in points:
        seen[p.key] = seen.get(p.key, 0) + 1
    duplicated = sum(n - 1 for n in seen.values() if n > 1)
    assert expected <= set(seen)
    print(
        f"persistent queue: {len(expected)} points stored before the second SIGKILL, all "
        f"downstream; {len(points)} points downstream in all, {duplicated} of them duplicates "
        f"({len([n for n in seen.values() if n > 1])} points delivered more than once)"
    )
