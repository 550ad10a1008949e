"""PushExporter against a real in-process OTLP server, with jitter, clock and back-off injected."""

from __future__ import annotations

import grpc
import pytest
from gpumetrics.metrics import GPU, Producer, count_points, names
from gpumetrics.metrics.buffer import MetricBuffer
from gpumetrics.selftelemetry import Telemetry
from gpumetrics.service.push import (
    MAX_ATTEMPTS,
    PUSH_CONSUMER,
    ExportResult,
    PushExporter,
    PushSettings,
)
from gpumetrics.store import BatchStore
from pydantic import ValidationError

from .conftest import Answer

T = 1_700_000_000_000_000_000
GPU0 = GPU(uuid="GPU-0", index=0, name="gpu0")


def batch(n_points: int = 2):
    p = Producer()
    for i in range(n_points):

        def add(b: MetricBuffer, i: int = i) -> None:
            b.add(names.MetricPower, 300.0 + i, T + i, GPU0.attributes())

        p.record_host(add)
    req = p.collect()
    assert count_points(req) == n_points
    return req


class Clock:
    """Explicit monotonic clock; ``wait`` records the back-off and advances time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []
        self.interrupt = False

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return self.interrupt


def make(store, endpoint, clock=None, telemetry=None, **settings):
    clock = clock or Clock()
    exporter = PushExporter(
        store,
        PushSettings(endpoint=endpoint, insecure=True, **settings),
        telemetry=telemetry or Telemetry(),
        clock=clock,
        jitter=lambda: 1.0,
        wait=clock.wait,
    )
    return exporter, clock


def push_cursor(store):
    (c,) = [c for c in store.stats().consumers if c.name == PUSH_CONSUMER]
    return c


def test_sends_everything_and_acknowledges_only_after_acceptance(collector):
    fake, endpoint = collector
    store = BatchStore()
    store.append(batch(2))
    store.append(batch(3))
    tel = Telemetry()
    exporter, _ = make(store, endpoint, telemetry=tel)
    assert exporter.export_pending() == [ExportResult.SENT]
    assert sum(count_points(r) for r in fake.requests) == 5
    assert push_cursor(store).acked_sequence == 2
    assert tel.value("gpumetrics.push.points", {"outcome": "sent"}) == 5
    # nothing new: no empty envelope is sent
    assert exporter.export_pending() == []
    assert fake.calls == 1


def test_retryable_codes_back_off_exponentially_then_succeed(collector):
    fake, endpoint = collector
    fake.answers = [Answer(grpc.StatusCode.UNAVAILABLE), Answer(grpc.StatusCode.ABORTED), Answer()]
    store = BatchStore()
    store.append(batch())
    exporter, clock = make(store, endpoint, timeout_s=30)
    assert exporter.export_pending() == [ExportResult.SENT]
    assert clock.waits == [1.0, 2.0]
    assert fake.calls == 3 and len(fake.requests) == 1


def test_retry_info_delay_is_honoured_and_makes_resource_exhausted_retryable(collector):
    fake, endpoint = collector
    fake.answers = [Answer(grpc.StatusCode.RESOURCE_EXHAUSTED, retry_delay_s=3.25), Answer()]
    store = BatchStore()
    store.append(batch())
    exporter, clock = make(store, endpoint, timeout_s=30)
    assert exporter.export_pending() == [ExportResult.SENT]
    assert clock.waits == [3.25]


def test_resource_exhausted_without_retry_info_is_permanent(collector):
    fake, endpoint = collector
    fake.answers = [Answer(grpc.StatusCode.RESOURCE_EXHAUSTED)]
    store = BatchStore()
    store.append(batch(4))
    tel = Telemetry()
    exporter, clock = make(store, endpoint, telemetry=tel)
    assert exporter.export_pending() == [ExportResult.REFUSED]
    assert clock.waits == [] and fake.calls == 1
    assert tel.value("gpumetrics.push.points", {"outcome": "failed"}) == 4
    assert push_cursor(store).acked_sequence == 1


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED]
)
def test_non_retryable_codes_are_not_retried(collector, code):
    fake, endpoint = collector
    fake.answers = [Answer(code)]
    store = BatchStore()
    store.append(batch())
    exporter, clock = make(store, endpoint)
    assert exporter.export_pending() == [ExportResult.REFUSED]
    assert fake.calls == 1 and clock.waits == []


def test_one_deadline_across_attempts_then_the_data_stays_unacknowledged(collector):
    fake, endpoint = collector
    fake.answers = [Answer(grpc.StatusCode.UNAVAILABLE)] * 3
    store = BatchStore()
    store.append(batch(2))
    exporter, clock = make(store, endpoint, timeout_s=4.0)
    # waits 1 + 2 = 3 s; the next back-off (4 s) would pass the 4 s deadline: give up
    assert exporter.export_pending() == [ExportResult.RETRY_LATER]
    assert clock.waits == [1.0, 2.0] and fake.calls == 3
    assert push_cursor(store).acked_sequence == 0
    # next cycle: the same batch is sent again and only then acknowledged
    assert exporter.export_pending() == [ExportResult.SENT]
    assert len(fake.requests) == 1 and count_points(fake.requests[0]) == 2
    assert push_cursor(store).acked_sequence == 1


def test_attempts_are_capped(collector):
    fake, endpoint = collector
    fake.answers = [Answer(grpc.StatusCode.UNAVAILABLE)] * (MAX_ATTEMPTS + 2)
    store = BatchStore()
    store.append(batch())
    exporter, clock = make(store, endpoint, timeout_s=1e6, initial_backoff_s=0.001)
    assert exporter.export_pending() == [ExportResult.RETRY_LATER]
    assert fake.calls == MAX_ATTEMPTS and len(clock.waits) == MAX_ATTEMPTS - 1


def test_partial_success_is_not_retried_and_rejected_points_are_counted(collector):
    fake, endpoint = collector
    fake.answers = [Answer(rejected=2, message="bad unit")]
    store = BatchStore()
    store.append(batch(5))
    tel = Telemetry()
    exporter, clock = make(store, endpoint, telemetry=tel)
    assert exporter.export_pending() == [ExportResult.PARTIAL]
    assert fake.calls == 1 and clock.waits == []
    assert tel.value("gpumetrics.push.points", {"outcome": "rejected"}) == 2
    assert tel.value("gpumetrics.push.points", {"outcome": "sent"}) == 3
    assert push_cursor(store).acked_sequence == 1


def test_backoff_is_interrupted_by_shutdown(collector):
    fake, endpoint = collector
    fake.answers = [Answer(grpc.StatusCode.UNAVAILABLE)] * 5
    store = BatchStore()
    store.append(batch())
    exporter, clock = make(store, endpoint, timeout_s=60)
    clock.interrupt = True
    assert exporter.export_pending() == [ExportResult.RETRY_LATER]
    assert fake.calls == 1 and clock.waits == [1.0]


def test_backlog_is_split_by_the_per_export_caps(collector):
    fake, endpoint = collector
    store = BatchStore()
    for _ in range(5):
        store.append(batch(2))
    exporter, _ = make(store, endpoint, max_points_per_export=4)
    assert exporter.export_pending() == [ExportResult.SENT] * 3
    assert [count_points(r) for r in fake.requests] == [4, 4, 2]
    assert push_cursor(store).acked_sequence == 5


def test_headers_and_gzip_reach_the_collector(collector):
    fake, endpoint = collector
    store = BatchStore()
    store.append(batch())
    exporter, _ = make(store, endpoint, headers={"X-Tenant": "ml"}, compression="gzip")
    assert exporter.export_pending() == [ExportResult.SENT]
    assert fake.metadata[0]["x-tenant"] == "ml"


def test_shutdown_flushes_what_is_left(collector):
    fake, endpoint = collector
    store = BatchStore()
    exporter = PushExporter(store, PushSettings(endpoint=endpoint, insecure=True, interval_s=3600))
    exporter.start()
    store.append(batch(3))
    assert exporter.shutdown(flush_timeout_s=5) == [ExportResult.SENT]
    assert sum(count_points(r) for r in fake.requests) == 3


def test_an_unreachable_collector_does_not_hold_shutdown():
    store = BatchStore()
    store.append(batch())
    clock = Clock()
    exporter = PushExporter(
        store,
        PushSettings(endpoint="127.0.0.1:1", insecure=True, timeout_s=0.2),
        clock=clock,
        wait=clock.wait,
    )
    assert exporter.shutdown(flush_timeout_s=0.2) == [ExportResult.RETRY_LATER]
    assert clock.waits == []  # shutdown: no back-off at all


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"cert_file": "c.pem"}, "cert_file: must be set together with key_file"),
        ({"insecure": True, "ca_file": "ca.pem"}, "insecure"),
        ({"compression": "zstd"}, "compression"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"endpoint": " "}, "endpoint"),
        ({"headers": {"bad key": "v"}}, "headers"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_settings_errors_name_the_field(settings, field):
    with pytest.raises(ValidationError) as err:
        PushSettings(**settings)
    assert field in str(err.value)


def test_an_export_cancelled_by_shutdown_is_a_normal_end(collector, caplog, monkeypatch):
    """Closing the channel under an export in flight raises grpc.FutureCancelledError: no
    ERROR, no traceback, nothing acknowledged (newcomer report F14)."""
    store = BatchStore()
    store.append(batch())
    exporter, _ = make(store, collector[1])

    def cancelled(request, timeout):
        raise grpc.FutureCancelledError()

    monkeypatch.setattr(exporter, "_send", cancelled)
    with caplog.at_level("DEBUG", logger="gpumetrics"):
        results = exporter.export_pending()
    assert results == [ExportResult.RETRY_LATER]
    assert [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")] == []
    assert push_cursor(store).acked_sequence == 0
