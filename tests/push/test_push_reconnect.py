"""Push resumes as soon as the collector is back (issue: 6–18 s later, grpcio's back-off).

An export begun while the collector is away waits for the connection (``wait_for_ready``) on a
channel whose reconnect back-off is bounded, so it goes through once the collector listens
again: one attempt, no retry, no waiting for the next cycle. The figures (how soon) are in
``benchmarks/hardening_bench.py push``; the test asserts only what happens, never how fast.
"""

from __future__ import annotations

import logging
import threading

import grpc
from gpumetrics.service.push import ExportResult, PushExporter, PushSettings, open_channel
from gpumetrics.store import BatchStore
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

from ..store.conftest import build_request
from .conftest import FakeCollector, PooledServer

TIMEOUT = 30.0


def serve(fake: FakeCollector, port: int) -> tuple[PooledServer, int]:
    served = PooledServer(2)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(fake, served.server)
    bound = served.server.add_insecure_port(f"127.0.0.1:{port}")
    served.server.start()
    return served, bound


def test_an_export_begun_during_an_outage_goes_through_when_the_collector_returns(caplog):
    fake = FakeCollector()
    server, port = serve(fake, 0)
    server.stop()  # the collector is away; its port is known
    settings = PushSettings(
        endpoint=f"127.0.0.1:{port}", insecure=True, timeout_s=TIMEOUT, initial_backoff_s=0.01
    )
    channel = open_channel(settings)
    failed = threading.Event()

    def watch(state: grpc.ChannelConnectivity) -> None:
        if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            failed.set()

    channel.subscribe(watch)
    store = BatchStore()
    store.append(build_request(3))
    # back-off waits end at once: a retry would follow the failed attempt immediately
    exporter = PushExporter(store, settings, channel=channel, wait=lambda _s: False)
    results: list[list[ExportResult]] = []
    caplog.set_level(logging.WARNING, logger="gpumetrics.service.push")
    sender = threading.Thread(target=lambda: results.append(exporter.export_pending()))
    sender.start()
    assert failed.wait(TIMEOUT)  # the export has tried to connect, and could not
    server, _ = serve(fake, port)  # the collector is back
    try:
        sender.join(TIMEOUT)
        assert not sender.is_alive()
        assert results == [[ExportResult.SENT]]
        assert fake.calls == 1 and len(fake.requests) == 1
        assert not [r for r in caplog.records if "transient" in r.getMessage()]
    finally:
        channel.unsubscribe(watch)
        exporter.shutdown(flush_timeout_s=1.0)
        server.stop()


def test_shutdown_ends_an_export_that_waits_for_an_absent_collector():
    fake = FakeCollector()
    server, port = serve(fake, 0)
    server.stop()
    settings = PushSettings(
        endpoint=f"127.0.0.1:{port}", insecure=True, timeout_s=600, interval_s=0.01
    )
    store = BatchStore()
    store.append(build_request(1))
    exporter = PushExporter(store, settings)
    exporter.start()  # its first cycle waits for the connection, for up to 600 s
    assert exporter.shutdown(flush_timeout_s=2.0) == [ExportResult.RETRY_LATER]
    assert exporter._thread is not None and not exporter._thread.is_alive()
