"""The sidecar runtime: batching, readiness, shutdown order, push flush, final batch."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpumetrics.config import ConfigError
from gpumetrics.metrics import Producer, count_points
from gpumetrics.runtime import Batcher, Sidecar
from gpumetrics.service.gate import join_pool
from gpumetrics.store import BatchStore
from gpumetrics.v1 import pull_pb2, pull_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from .conftest import GPU0, ManualTicker, StubCollector, config


def health_status(address, name=""):
    with grpc.insecure_channel(address) as ch:
        return (
            health_pb2_grpc.HealthStub(ch)
            .Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            .status
        )


def pull(address, consumer="t"):
    with grpc.insecure_channel(address) as ch:
        resp = pull_pb2_grpc.MetricsPullServiceStub(ch).Pull(
            pull_pb2.PullRequest(consumer=consumer), timeout=5
        )
    return resp, metrics_service_pb2.ExportMetricsServiceRequest.FromString(
        resp.export_metrics_service_request
    )


def test_batcher_marks_ready_only_after_a_batch_that_follows_collector_ready():
    producer, store, ready, calls = Producer(), BatchStore(), threading.Event(), []
    batcher = Batcher(producer, store, 10.0, ready, lambda: calls.append("ready"))
    collector = StubCollector(producer, None, None)
    collector.record()
    assert batcher.run_once() == 1 and calls == []  # collected before ready: not announced
    ready.set()
    assert batcher.run_once() is None  # nothing recorded: no empty batch, but ready is announced
    assert calls == ["ready"]
    collector.record()
    assert batcher.run_once() == 2 and calls == ["ready"]  # announced once
    assert store.last_sequence == 2


def test_batcher_thread_takes_the_first_ready_batch_without_waiting_an_interval():
    producer, store, ready = Producer(), BatchStore(), threading.Event()
    ticker = ManualTicker()
    announced = threading.Event()
    batcher = Batcher(producer, store, 3600.0, ready, announced.set, wait=ticker.wait)
    batcher.start()
    try:
        StubCollector(producer, None, None).record()
        ticker.tick()  # not ready yet: 1/72000 of an interval passes, no batch
        assert store.last_sequence == 0
        ready.set()
        ticker.tick()
        assert store.last_sequence == 1 and announced.is_set()
    finally:
        ticker.stop()
        assert batcher.stop(5)


def test_health_turns_serving_after_the_first_ready_batch_and_pull_sees_it(make_sidecar):
    sidecar, collector, ticker = make_sidecar()
    sidecar.start()
    address = sidecar.parts.server.addresses.listen[0]
    assert health_status(address) == health_pb2.HealthCheckResponse.NOT_SERVING
    collector.record(300.0)
    collector.ready.set()
    ticker.tick()
    assert health_status(address) == health_pb2.HealthCheckResponse.SERVING
    resp, req = pull(address)
    assert resp.first_sequence == 1 and count_points(req) >= 1
    values = [
        dp.as_double
        for rm in req.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "hw.power"
        for dp in m.gauge.data_points
    ]
    assert values == [300.0]
    host = {kv.key for kv in req.resource_metrics[0].resource.attributes}
    assert "host.name" in host


def test_shutdown_order_and_final_batch_reach_the_push_collector(make_sidecar):
    from concurrent import futures

    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

    received = []

    class Collector(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request, context):  # noqa: N802
            received.append(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    pool = futures.ThreadPoolExecutor(2)
    otlp = grpc.server(pool)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Collector(), otlp)
    port = otlp.add_insecure_port("127.0.0.1:0")
    otlp.start()
    try:
        events: list[str] = []
        cfg = config(push={"endpoint": f"127.0.0.1:{port}", "insecure": True, "interval_s": 3600})
        sidecar, collector, ticker = make_sidecar(cfg, events)
        sidecar.start()
        collector.ready.set()
        collector.record(111.0)  # recorded after the last batch: only the final batch has it
        ticker.stop()
        sidecar.request_stop("test")
        assert sidecar.wait(0)
        assert sidecar.shutdown(timeout_s=10)
        assert events == ["collector.start", "collector.begin_stop", "collector.stop"]
        assert not sidecar.parts.health.ready
        with pytest.raises(grpc.RpcError):
            health_status(sidecar.parts.server.addresses.listen[0])
        pushed = [
            dp.as_double
            for r in received
            for rm in r.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "hw.power"
            for dp in m.gauge.data_points
        ]
        assert pushed == [111.0]
    finally:
        otlp.stop(0).wait()
        assert join_pool(pool, time.monotonic() + 10)


def test_a_missing_relabel_file_is_a_config_error_naming_the_setting(tmp_path):
    cfg = config(identity={"relabel_config": str(tmp_path / "absent.yaml")})
    with pytest.raises(ConfigError, match=r"'identity.relabel_config': .*absent.yaml"):
        Sidecar(cfg, collector_factory=StubCollector)


def test_a_label_writing_relabel_rule_is_refused_in_profiler_mode(tmp_path):
    rules = tmp_path / "relabel.yaml"
    rules.write_text(
        "relabel_configs:\n"
        "  - {source_labels: [comm], regex: sshd, action: drop}\n"
        "  - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}\n"
    )
    cfg = config(identity={"relabel_config": str(rules)})
    with pytest.raises(ConfigError) as err:
        Sidecar(cfg, collector_factory=StubCollector)
    assert err.value.errors == [
        f"'identity.relabel_config': {rules}: relabel_configs[1].target_label: action replace "
        "writes label 'namespace'; identity.mode 'profiler' adds no label to a resource (it must "
        "equal the profile resource), so only keep/drop rules and temporary '__' labels are "
        "allowed; set identity.mode to 'enriched' to add labels"
    ]
    Sidecar(  # the same file is fine in enriched mode
        config(identity={"relabel_config": str(rules), "mode": "enriched"}),
        collector_factory=StubCollector,
    ).shutdown(5)


def test_kubernetes_node_goes_to_k8s_node_name(make_sidecar):
    cfg = config(identity={"node_name": "node-7", "in_kubernetes": True})
    sidecar, collector, _ = make_sidecar(cfg)
    collector.record()
    req = sidecar.parts.producer.collect()
    attrs = {kv.key: kv.value.string_value for kv in req.resource_metrics[0].resource.attributes}
    assert attrs == {"k8s.node.name": "node-7"}
    assert GPU0.uuid  # the stub's device


def test_a_simulated_node_checks_pids_against_linux_largest_pid_max_unless_configured():
    seen = {}

    def factory(producer, settings, telemetry):
        seen["pid_max"] = settings.pid_max
        return StubCollector(producer, settings, telemetry)

    installed: list[str] = []
    Sidecar(
        config(runtime={"simulate": "h100-8x-training"}),
        collector_factory=factory,
        simulate=installed.append,
    )
    assert installed == ["h100-8x-training"] and seen["pid_max"] == 4_194_304
    Sidecar(
        config(runtime={"simulate": "h100-8x-training"}, collection={"pid_max": 32768}),
        collector_factory=factory,
        simulate=installed.append,
    )
    assert seen["pid_max"] == 32768
    Sidecar(config(), collector_factory=factory, simulate=installed.append)
    assert seen["pid_max"] is None  # a real node reads /proc/sys/kernel/pid_max


class DriverStub(StubCollector):
    """A stub collector that also reports what NVML told it (as the real Collector does)."""

    driver_version = "550.54.15"

    def devices(self):
        return ["GPU-0", "GPU-1"]


def test_one_startup_summary_line_when_ready(tmp_path, caplog):
    pull_token, declare_token = tmp_path / "pull.token", tmp_path / "declare.token"
    pull_token.write_text("0123456789abcdef-pull\n")
    declare_token.write_text("0123456789abcdef-declare\n")
    relabel = tmp_path / "relabel.yaml"
    relabel.write_text(
        "- {source_labels: [__meta_process_executable_name], regex: python, action: keep}\n"
        '- {source_labels: [__meta_process_pid], regex: "1", action: drop}\n'
    )
    profiler = tmp_path / "profiler.sock"
    cfg = config(
        server={
            "listen": ["127.0.0.1:0"],
            "profiler_listen": [f"unix:{profiler}"],
            "health_listen": "127.0.0.1:0",
            "pull_token_file": str(pull_token),
            "declare_token_file": str(declare_token),
        },
        identity={"relabel_config": str(relabel)},
    )
    ticker, made = ManualTicker(), []

    def factory(*a: Any) -> DriverStub:
        made.append(DriverStub(*a))
        return made[0]

    sidecar = Sidecar(
        cfg,
        collector_factory=factory,
        batch_wait=ticker.wait,
        config_file="/etc/gpumetrics/gpumetrics.yaml",
    )
    caplog.set_level("INFO", logger="gpumetrics")
    try:
        sidecar.start()
        made[0].record()
        made[0].ready.set()
        ticker.tick()
        ticker.tick()  # a second batch: the summary is not repeated
        addresses = sidecar.parts.server.addresses
    finally:
        ticker.stop()
        sidecar.shutdown(5)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready: ")]
    assert lines == [
        "ready: config /etc/gpumetrics/gpumetrics.yaml; "
        f"listen {addresses.listen[0]} [pull: token]; "
        f"profiler_listen unix://{profiler} [declare: token, peer credentials]; "
        f"health_listen {addresses.health_listen[0]} [health: no token]; "
        "TLS off; relabel rules 2; NVML real, driver 550.54.15, 2 GPUs"
    ]
    (record,) = [r for r in caplog.records if r.getMessage().startswith("ready: ")]
    assert record.levelname == "INFO"


def test_the_summary_of_a_simulated_node_without_a_file_or_tokens():
    from gpumetrics.runtime.summary import NvmlFacts, StartupSummary
    from gpumetrics.service import BoundAddresses, ServerSettings

    sidecar = Sidecar(
        config(runtime={"simulate": "h100-sxm"}),
        collector_factory=lambda *a: StubCollector(*a),
        simulate=lambda spec: False,  # not installed: this test only reads the summary
    )
    try:
        sidecar.start()
        assert sidecar.summary().message() == (
            f"ready: config none; listen {sidecar.parts.server.addresses.listen[0]} "
            "[pull: no token, declare: no token]; TLS off; relabel rules 0; "
            "NVML simulated (h100-sxm), driver unknown, GPUs unknown"
        )
    finally:
        sidecar.shutdown(5)
    assert NvmlFacts(None, "580.65.06", 1).text() == "real, driver 580.65.06, 1 GPU"
    mtls = ServerSettings(
        tls_cert_file=Path("c.pem"), tls_key_file=Path("k.pem"), tls_client_ca_file=Path("ca")
    )
    summary = StartupSummary.build(mtls, BoundAddresses(), None, 0, NvmlFacts(None, None, 0))
    assert summary.tls == "on (mTLS)" and summary.nvml.text() == "real, driver unknown, 0 GPUs"
