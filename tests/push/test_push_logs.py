"""PushExporter with signal=LOGS: the log store exported with OTLP LogsService.Export."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from gpumetrics.events import EventProducer, EventSettings, GpuEvent
from gpumetrics.selftelemetry import Telemetry, WithAttributes
from gpumetrics.service.push import LOGS, PUSH_CONSUMER, ExportResult, PushExporter, PushSettings
from gpumetrics.store import BatchStore, signals
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc

from .conftest import PooledServer

GPU = (("hw.id", "GPU-0"), ("hw.name", "gpu0"))


class FakeLogsCollector(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self) -> None:
        self.answers: list[Any] = []
        self.requests: list[logs_service_pb2.ExportLogsServiceRequest] = []
        self.lock = threading.Lock()

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        with self.lock:
            answer = self.answers.pop(0) if self.answers else None
        if isinstance(answer, grpc.StatusCode):
            context.abort(answer, "scripted")
        with self.lock:
            self.requests.append(request)
        response = logs_service_pb2.ExportLogsServiceResponse()
        if isinstance(answer, int):
            response.partial_success.rejected_log_records = answer
            response.partial_success.error_message = "too many"
        return response


@pytest.fixture
def logs_collector() -> Iterator[tuple[FakeLogsCollector, str]]:
    fake = FakeLogsCollector()
    served = PooledServer(2)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(fake, served.server)
    port = served.server.add_insecure_port("127.0.0.1:0")
    served.server.start()
    try:
        yield fake, f"127.0.0.1:{port}"
    finally:
        served.stop()


def logs_store(n: int) -> BatchStore:
    store = BatchStore(signal=signals.LOGS)
    producer = EventProducer(EventSettings())
    for code in range(n):
        producer.record(GpuEvent("xid", 100 + code, "GPU-0", GPU, 10**18))
    producer.flush_to(store)
    return store


def exporter(store: BatchStore, endpoint: str, telemetry: Telemetry) -> PushExporter:
    return PushExporter(
        store,
        PushSettings(endpoint=endpoint, insecure=True, timeout_s=5),
        telemetry=WithAttributes(telemetry, {"signal": "logs"}),
        jitter=lambda: 1.0,
        wait=lambda s: False,  # backoff waits return at once; never stopped
        signal=LOGS,
    )


def test_logs_are_exported_and_acknowledged(logs_collector):
    fake, endpoint = logs_collector
    store, tel = logs_store(3), Telemetry()
    results = exporter(store, endpoint, tel).export_pending()
    assert results == [ExportResult.SENT]
    (req,) = fake.requests
    assert sum(len(sl.log_records) for rl in req.resource_logs for sl in rl.scope_logs) == 3
    assert tel.value("gpumetrics.push.points", {"outcome": "sent", "signal": "logs"}) == 3
    (consumer,) = store.stats().consumers
    assert consumer.name == PUSH_CONSUMER and store.stats().held_batches == 0


def test_partial_success_counts_rejected_log_records(logs_collector):
    fake, endpoint = logs_collector
    fake.answers = [1]
    store, tel = logs_store(3), Telemetry()
    assert exporter(store, endpoint, tel).export_pending() == [ExportResult.PARTIAL]
    assert tel.value("gpumetrics.push.points", {"outcome": "rejected", "signal": "logs"}) == 1
    assert tel.value("gpumetrics.push.points", {"outcome": "sent", "signal": "logs"}) == 2


def test_an_unreachable_collector_keeps_the_logs(logs_collector):
    fake, endpoint = logs_collector
    fake.answers = [grpc.StatusCode.UNAVAILABLE] * 10
    store, tel = logs_store(2), Telemetry()
    results = exporter(store, endpoint, tel).export_pending()
    assert results == [ExportResult.RETRY_LATER]
    assert store.stats().held_batches == 1  # not acknowledged: sent again next cycle
