"""The sidecar's gRPC health follows NVML (field case F32), through the real health service.

An in-process sidecar (real server on a unix socket, real health servicer, real pull service)
whose collector is the real NVML collector on the simulated driver with a manual clock; the
test drives cycles and batches itself, so every step is deterministic.
"""

from __future__ import annotations

import grpc
import pytest
from gpumetrics.metrics import names
from gpumetrics.nvml.collector import Collector
from gpumetrics.runtime import Sidecar
from gpumetrics.service import OVERALL_HEALTH, PROFILER_SERVICE, PULL_SERVICE
from gpumetrics.v1 import pull_pb2, pull_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

import nvmlsim as sim

from .conftest import ManualTicker, config

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class SteppedCollector(Collector):
    """The real collector; the test runs its cycles (no scheduler thread)."""

    def start(self) -> None:
        """Nothing: :meth:`collect_once` is called by the test."""


class Node:
    """A sidecar on the simulated F32 node, stepped cycle by cycle."""

    def __init__(self, tmp_path, after_s: float) -> None:
        self.drv = sim.install(sim.load_scenario("F32_device_access_revoked"), latency="off")
        clock = self.drv.clock
        self.collectors: list[SteppedCollector] = []

        def factory(producer, settings, telemetry):
            settings = settings.model_copy(
                update={"init_backoff_initial_s": 1.0, "init_backoff_max_s": 1.0}
            )
            col = SteppedCollector(
                producer,
                settings,
                telemetry,
                clock_ns=lambda: clock.now_us() * 1000,
                monotonic_ns=lambda: clock.now_us() * 1000,
            )
            self.collectors.append(col)
            return col

        self.address = f"unix:{tmp_path}/gpumetrics.sock"
        cfg = config(
            server={"listen": [self.address]},
            runtime={"unhealthy_after_nvml_down_s": after_s, "batch_interval_s": 1.0},
        )
        self.ticker = ManualTicker()
        self.sidecar = Sidecar(cfg, collector_factory=factory, batch_wait=self.ticker.wait)
        self.collector = self.collectors[0]
        self.channel = None
        self._ack = (0, "")

    def start(self) -> None:
        self.sidecar.start()
        self.channel = grpc.insecure_channel(self.address)

    def cycle(self) -> None:
        """One collection at the current simulated time, one batch, then the next cycle."""
        self.collector.collect_once()
        self.ticker.tick()
        self.drv.next_cycle()

    def health(self, name: str = OVERALL_HEALTH) -> int:
        stub = health_pb2_grpc.HealthStub(self.channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status

    def pull(self) -> metrics_service_pb2.ExportMetricsServiceRequest:
        """Everything stored since the last pull (acknowledging it)."""
        seq, epoch = self._ack
        resp = pull_pb2_grpc.MetricsPullServiceStub(self.channel).Pull(
            pull_pb2.PullRequest(consumer="t", ack_sequence=seq, ack_epoch=epoch), timeout=10
        )
        self._ack = (resp.last_sequence, resp.epoch)
        return metrics_service_pb2.ExportMetricsServiceRequest.FromString(
            resp.export_metrics_service_request
        )

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.ticker.stop()
        self.sidecar.parts.server.stop(0)
        self.sidecar.parts.batcher.stop(5)
        self.collector.stop(5)
        sim.uninstall()


@pytest.fixture
def node(tmp_path):
    made = []

    def make(after_s: float) -> Node:
        n = Node(tmp_path, after_s)
        made.append(n)
        n.start()
        return n

    yield make
    for n in made:
        n.close()


def _metrics(request, scope: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            if sm.scope.name != scope:
                continue
            for m in sm.metrics:
                points = m.gauge.data_points if m.HasField("gauge") else m.sum.data_points
                out.setdefault(m.name, []).extend(points)
    return out


def _nvml_up(request) -> tuple[int, str]:
    (point,) = _metrics(request, names.SelfScopeName)["gpumetrics.nvml.up"]
    return point.as_int, next(kv.value.string_value for kv in point.attributes)


def test_health_turns_not_serving_after_the_configured_time_without_nvml_and_back(node):
    n = node(after_s=3.0)
    assert n.health() == NOT_SERVING  # not ready yet
    for _ in range(3):  # cycles 1-3: normal
        n.cycle()
    assert [n.health(x) for x in (OVERALL_HEALTH, PULL_SERVICE)] == [SERVING] * 2
    assert len(_metrics(n.pull(), names.ScopeName)[names.MetricTemperature]) == 2 * 3
    n.cycle()  # cycle 4: access revoked; NVML down from now on
    batch = n.pull()
    assert _metrics(batch, names.ScopeName) == {}  # no device metrics, nothing re-served
    assert _nvml_up(batch) == (0, "unknown")
    assert n.health() == SERVING  # down for 0 s of the allowed 3
    n.cycle()  # cycle 5: down 1 s
    n.cycle()  # cycle 6: down 2 s
    assert n.health() == SERVING
    n.cycle()  # cycle 7: down 3 s
    assert n.health(OVERALL_HEALTH) == NOT_SERVING
    assert n.health(PULL_SERVICE) == NOT_SERVING
    assert n.health(PROFILER_SERVICE) == SERVING  # declarations still work
    assert _metrics(n.pull(), names.ScopeName) == {}
    assert n.collector.nvml_reason == "unknown" and not n.collector.nvml_up()
    n.drv.trigger("restore_access")  # stands for the restarted container
    n.cycle()
    assert n.collector.nvml_up()
    assert [n.health(x) for x in (OVERALL_HEALTH, PULL_SERVICE)] == [SERVING] * 2
    batch = n.pull()
    assert _nvml_up(batch) == (1, "ok")
    assert _metrics(batch, names.ScopeName)[names.MetricTemperature]


def test_zero_disables_the_nvml_health_gate(node):
    n = node(after_s=0.0)
    for _ in range(10):
        n.cycle()
    assert not n.collector.nvml_up()
    assert n.health() == SERVING


def test_a_release_on_request_never_turns_health_not_serving(node):
    n = node(after_s=1.0)
    n.cycle()
    assert n.collector.release(5.0)
    for _ in range(5):
        n.cycle()
    assert n.collector.nvml_reason == "released" and n.collector.nvml_down_s() is None
    assert n.health() == SERVING
