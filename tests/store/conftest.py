from __future__ import annotations

from collections.abc import Callable

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2


def build_request(points: int, tag: str = "r") -> metrics_service_pb2.ExportMetricsServiceRequest:
    """One resource (service.name=tag) with one gauge of `points` data points."""
    req = metrics_service_pb2.ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    kv = rm.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", tag
    m = rm.scope_metrics.add().metrics.add()
    m.name = "test.gauge"
    for i in range(points):
        dp = m.gauge.data_points.add()
        dp.time_unix_nano = 1_700_000_000_000_000_000 + i
        dp.as_int = i
    return req


class Clock:
    """An explicit monotonic clock for the store."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def make_request() -> Callable[..., metrics_service_pb2.ExportMetricsServiceRequest]:
    return build_request


@pytest.fixture
def clock() -> Clock:
    return Clock()


def parse(data: bytes) -> metrics_service_pb2.ExportMetricsServiceRequest:
    req = metrics_service_pb2.ExportMetricsServiceRequest()
    req.ParseFromString(data)
    return req


@pytest.fixture
def parse_request() -> Callable[[bytes], metrics_service_pb2.ExportMetricsServiceRequest]:
    return parse


__all__ = ["Clock", "build_request", "metrics_pb2"]
