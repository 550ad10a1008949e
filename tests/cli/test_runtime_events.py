"""The sidecar's GPU-event wiring: producer -> batcher -> log store -> LogsPullService and push."""

from __future__ import annotations

import time
from concurrent import futures

import grpc
import pytest
from gpumetrics.events import GpuEvent
from gpumetrics.runtime import Sidecar
from gpumetrics.service.gate import join_pool
from gpumetrics.v1 import logs_pull_pb2, logs_pull_pb2_grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc

from .conftest import StubCollector, config

GPU = (("hw.id", "GPU-stub-0"), ("hw.name", "gpu0"))
T = 1_767_225_600 * 10**9


def pull_logs(address: str, **kw) -> logs_pull_pb2.PullLogsResponse:
    with grpc.insecure_channel(address) as ch:
        stub = logs_pull_pb2_grpc.LogsPullServiceStub(ch)
        return stub.PullLogs(logs_pull_pb2.PullLogsRequest(**kw), timeout=10)


def records(data: bytes) -> list:
    req = logs_service_pb2.ExportLogsServiceRequest.FromString(data)
    return [r for rl in req.resource_logs for sl in rl.scope_logs for r in sl.log_records]


def test_events_reach_the_log_store_with_each_batch_and_are_pulled(running):
    sidecar, address = running
    events = sidecar.parts.events
    assert events is not None and sidecar.parts.logs_store is not None
    empty = pull_logs(address, consumer="otelcol")
    assert empty.last_sequence == 0  # registered; nothing yet
    events.record(GpuEvent("xid", 48, "GPU-stub-0", GPU, T))
    sidecar.parts.batcher.run_once()
    resp = pull_logs(address, consumer="otelcol")
    (record,) = records(resp.export_logs_service_request)
    assert record.event_name == "nvidia.gpu.xid" and resp.log_records == 1
    host = {kv.key: kv.value.string_value for kv in _resource(resp)}
    assert "host.name" in host  # the metrics' host resource


def _resource(resp):
    req = logs_service_pb2.ExportLogsServiceRequest.FromString(resp.export_logs_service_request)
    return req.resource_logs[0].resource.attributes


def test_a_collector_with_attach_events_gets_the_producer():
    attached = []

    class EventCollector(StubCollector):
        def attach_events(self, sink, settings):
            attached.append((sink, settings))

    sidecar = Sidecar(config(), collector_factory=EventCollector)
    try:
        ((sink, settings),) = attached
        assert sink is sidecar.parts.events and settings == sidecar.config.events
    finally:
        sidecar.parts.server.stop(0)


def test_events_disabled_means_no_log_store_and_no_service(make_sidecar):
    sidecar, collector, ticker = make_sidecar(config(events={"enabled": False}))
    assert sidecar.parts.events is None and sidecar.parts.logs_store is None
    sidecar.start()
    collector.record()
    collector.ready.set()
    ticker.tick()
    with pytest.raises(grpc.RpcError) as err:
        pull_logs(sidecar.parts.server.addresses.listen[0], consumer="c")
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_shutdown_closes_storm_windows_and_pushes_the_logs(make_sidecar):
    received: list[logs_service_pb2.ExportLogsServiceRequest] = []

    class Collector(logs_service_pb2_grpc.LogsServiceServicer):
        def Export(self, request, context):  # noqa: N802
            received.append(request)
            return logs_service_pb2.ExportLogsServiceResponse()

    pool = futures.ThreadPoolExecutor(2)
    otlp = grpc.server(pool)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Collector(), otlp)
    port = otlp.add_insecure_port("127.0.0.1:0")
    otlp.start()
    try:
        cfg = config(
            push={"endpoint": f"127.0.0.1:{port}", "insecure": True, "interval_s": 3600},
            events={"storm_burst": 2, "storm_window_s": 3600},
        )
        sidecar, collector, ticker = make_sidecar(cfg)
        sidecar.start()
        collector.ready.set()
        for i in range(5):
            sidecar.parts.events.record(GpuEvent("xid", 13, "GPU-stub-0", GPU, T + i))
        ticker.stop()
        sidecar.request_stop("test")
        assert sidecar.shutdown(timeout_s=10)
        pushed = [r for req in received for r in records(req.SerializeToString())]
        names = [r.event_name for r in pushed]
        assert names == ["nvidia.gpu.xid", "nvidia.gpu.xid", "nvidia.gpu.events.suppressed"]
        count = [kv.value.int_value for kv in pushed[-1].attributes if kv.key.endswith("count")]
        assert count == [3]
    finally:
        otlp.stop(0).wait()
        assert join_pool(pool, time.monotonic() + 10)
