"""The sidecar with ``store.path`` (issue 25): a restarted sidecar resumes both stores' epochs and
its consumers' cursors over real gRPC, says so in its start-up line and its self-telemetry, and a
store it cannot write leaves it serving (health SERVING) from memory.

A ``kill -9`` is simulated as in tests/store: the running sidecar's store files are copied as
they are on disk and the next sidecar starts on the copy.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import grpc
from gpumetrics.v1 import logs_pull_pb2, logs_pull_pb2_grpc, pull_pb2, pull_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from .conftest import config


def _pull(address: str, **fields: Any) -> pull_pb2.PullResponse:
    with grpc.insecure_channel(address) as ch:
        return pull_pb2_grpc.MetricsPullServiceStub(ch).Pull(
            pull_pb2.PullRequest(consumer="collector", **fields), timeout=10
        )


def _pull_logs(address: str, **fields: Any) -> logs_pull_pb2.PullLogsResponse:
    with grpc.insecure_channel(address) as ch:
        return logs_pull_pb2_grpc.LogsPullServiceStub(ch).PullLogs(
            logs_pull_pb2.PullLogsRequest(consumer="collector", **fields), timeout=10
        )


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as ch:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return bool(r.status == health_pb2.HealthCheckResponse.SERVING)


def _durable_series(resp: pull_pb2.PullResponse) -> dict[str, int]:
    """``gpumetrics.store.durable`` of the metric store in the answer's self-telemetry."""
    req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(
        resp.export_metrics_service_request
    )
    out = {}
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == "gpumetrics.store.durable":
                    for dp in m.gauge.data_points:
                        attrs = {kv.key: kv.value.string_value for kv in dp.attributes}
                        if "signal" not in attrs:
                            out[attrs["state"]] = dp.as_int
    return out


def _batch(collector: Any, ticker: Any) -> None:
    collector.record()
    collector.ready.set()
    ticker.tick()


def test_a_restarted_sidecar_resumes_epochs_and_cursors(
    make_sidecar: Any, tmp_path: Path, caplog: Any
) -> None:
    store = tmp_path / "store"
    first, collector, ticker = make_sidecar(config(store={"path": str(store)}))
    first.start()
    address = first.parts.server.addresses.listen[0]
    for _ in range(3):
        _batch(collector, ticker)
    got = _pull(address, max_data_points=1)  # batch 1 only
    logs = _pull_logs(address)  # registers the consumer in the log store (nothing in it yet)
    assert got.last_sequence == 1 and logs.epoch
    _pull(address, ack_sequence=1, ack_epoch=got.epoch, ack_only=True)
    _batch(collector, ticker)  # batch 4 holds the durable state of the store at batch 3
    assert _durable_series(_pull(address, read_after_sequence=3, ack_epoch=got.epoch)) == {
        "ok": 1,
        "failed": 0,
        "disabled": 0,
    }
    killed = tmp_path / "killed"
    shutil.copytree(store, killed)  # what a kill -9 leaves now
    first.shutdown(10)

    with caplog.at_level(logging.INFO, "gpumetrics"):
        second, collector2, ticker2 = make_sidecar(config(store={"path": str(killed)}))
        second.start()
        address2 = second.parts.server.addresses.listen[0]
        # the receiver resumes with its own acknowledgement: same epoch, batches 2.. again
        resumed = _pull(address2, ack_sequence=1, ack_epoch=got.epoch, read_after_sequence=1)
        assert (resumed.epoch, resumed.first_sequence, resumed.last_sequence) == (got.epoch, 2, 4)
        assert _pull_logs(address2, ack_epoch=logs.epoch).epoch == logs.epoch
        _batch(collector2, ticker2)
    assert _serving(address2)
    assert _pull(address2, ack_epoch=got.epoch, read_after_sequence=4).first_sequence == 5
    ready = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready:")]
    assert ready and ready[-1].endswith(f"; store {killed} (metrics ok, logs ok)"), ready
    assert "the metrics store resumes from" in caplog.text
    second.shutdown(10)
    assert not (killed / "metrics.sqlite-wal").exists()  # closed cleanly: checkpointed


def test_a_store_that_cannot_be_written_leaves_the_sidecar_serving(
    make_sidecar: Any, tmp_path: Path, caplog: Any
) -> None:
    locked_by_other = make_sidecar(config(store={"path": str(tmp_path / "store")}))[0]
    # a second sidecar on the same path cannot take the files the first one holds
    with caplog.at_level(logging.WARNING, "gpumetrics.store"):
        sidecar, collector, ticker = make_sidecar(config(store={"path": str(tmp_path / "store")}))
    sidecar.start()
    address = sidecar.parts.server.addresses.listen[0]
    _batch(collector, ticker)
    _batch(collector, ticker)  # the second batch carries the state the first append set
    assert _serving(address)
    resp = _pull(address)
    assert resp.last_sequence == 2
    assert _durable_series(resp) == {"ok": 0, "failed": 1, "disabled": 0}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # one per store (metrics, logs)
    assert all("another process holds it" in w for w in warnings)
    sidecar.shutdown(10)
    locked_by_other.shutdown(10)
