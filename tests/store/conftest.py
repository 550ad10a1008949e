"""Store fixtures, every one for both signals: each store test runs once with metrics and once
with logs (``signal``), so the metric store and the log store of GPU events are held to the same
protocol, limits, splitting and accounting."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from gpumetrics.store import LOGS, METRICS, BatchStore, Signal
from opentelemetry.proto.metrics.v1 import metrics_pb2

SIGNALS = {"metrics": METRICS, "logs": LOGS}


def build_request(points: int, tag: str = "r", signal: Signal = METRICS) -> Any:
    """One resource (service.name=tag) holding ``points`` units of ``signal``.

    Metrics: one gauge with ``points`` data points; logs: ``points`` log records.
    """
    req = signal.request()
    entry = getattr(req, signal.resources).add()
    kv = entry.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", tag
    scope = getattr(entry, signal.scopes).add()
    if signal is METRICS:
        m = scope.metrics.add()
        m.name = "test.gauge"
        for i in range(points):
            dp = m.gauge.data_points.add()
            dp.time_unix_nano = 1_700_000_000_000_000_000 + i
            dp.as_int = i
    else:
        for i in range(points):
            rec = scope.log_records.add()
            rec.time_unix_nano = 1_700_000_000_000_000_000 + i
            rec.body.int_value = i
    return req


def tags(signal: Signal, request: Any) -> list[str]:
    """The ``service.name`` of each resource entry of ``request``, in order."""
    return [e.resource.attributes[0].value.string_value for e in getattr(request, signal.resources)]


class Clock:
    """An explicit monotonic clock for the store."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(params=sorted(SIGNALS))
def signal(request: pytest.FixtureRequest) -> Signal:
    """The signal of the store under test: ``metrics`` and ``logs``."""
    return SIGNALS[request.param]


@pytest.fixture
def make_store(signal: Signal) -> Callable[..., BatchStore]:
    """``BatchStore(...)`` of the signal under test."""
    return partial(BatchStore, signal=signal)


@pytest.fixture
def make_request(signal: Signal) -> Callable[..., Any]:
    """:func:`build_request` of the signal under test: ``make_request(points, tag="r")``."""
    return partial(build_request, signal=signal)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def parse_request(signal: Signal) -> Callable[[bytes], Any]:
    """Parse a batch or an answer as the signal's export request."""
    return signal.parse


__all__ = ["SIGNALS", "Clock", "build_request", "metrics_pb2", "tags"]
