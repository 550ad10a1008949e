"""A real in-process OTLP MetricsService on 127.0.0.1:0 whose answers the test scripts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from gpumetrics.service.gate import join_pool
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc


@dataclass
class Answer:
    """One scripted answer: ok, partial (rejected, message), or an error (code, retry delay)."""

    code: grpc.StatusCode | None = None
    retry_delay_s: float | None = None
    rejected: int = 0
    message: str = ""


@dataclass
class FakeCollector(metrics_service_pb2_grpc.MetricsServiceServicer):
    answers: list[Answer] = field(default_factory=list)
    requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        with self.lock:
            self.calls += 1
            answer = self.answers.pop(0) if self.answers else Answer()
            self.metadata.append(
                {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
            )
        if answer.code is not None:
            if answer.retry_delay_s is not None:
                secs = int(answer.retry_delay_s)
                info = error_details_pb2.RetryInfo(
                    retry_delay=duration_pb2.Duration(
                        seconds=secs, nanos=int(round((answer.retry_delay_s - secs) * 1e9))
                    )
                )
                context.set_trailing_metadata(
                    (("google.rpc.retryinfo-bin", info.SerializeToString()),)
                )
            context.abort(answer.code, f"scripted {answer.code.name}")
        with self.lock:
            self.requests.append(request)
        response = metrics_service_pb2.ExportMetricsServiceResponse()
        if answer.rejected or answer.message:
            response.partial_success.rejected_data_points = answer.rejected
            response.partial_success.error_message = answer.message
        return response


class PooledServer:
    """A ``grpc.Server`` on a thread pool of its own; :meth:`stop` also joins the pool's threads
    (``grpc.Server.stop`` leaves them running)."""

    def __init__(self, workers: int) -> None:
        self.pool = futures.ThreadPoolExecutor(max_workers=workers)
        self.server = grpc.server(self.pool)

    def stop(self) -> None:
        """Stop serving at once and join the call threads (at most 10 s)."""
        self.server.stop(0).wait()
        assert join_pool(self.pool, time.monotonic() + 10), "the server's threads did not end"


@pytest.fixture
def collector() -> Iterator[tuple[FakeCollector, str]]:
    fake = FakeCollector()
    served = PooledServer(4)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(fake, served.server)
    port = served.server.add_insecure_port("127.0.0.1:0")
    served.server.start()
    try:
        yield fake, f"127.0.0.1:{port}"
    finally:
        served.stop()
