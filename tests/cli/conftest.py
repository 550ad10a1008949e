"""A running in-process sidecar (stub collector, real server on loopback port 0) for CLI tests."""

from __future__ import annotations

import threading
import time

import pytest
from gpumetrics.config import SidecarConfig
from gpumetrics.metrics import GPU, names
from gpumetrics.runtime import Sidecar

GPU0 = GPU(uuid="GPU-stub-0", index=0, name="gpu0", model="Stub GPU")


class StubCollector:
    """Records one device point per ``record()``; ``ready`` and the call order are observable."""

    def __init__(self, producer, settings, telemetry, events=None):
        self.producer = producer
        self.settings = settings
        self.ready = threading.Event()
        self.events = events if events is not None else []

    def record(self, watts=250.0):
        self.producer.record_host(
            lambda b: b.add(names.MetricPower, watts, time.time_ns(), GPU0.attributes())
        )

    def start(self) -> None:
        self.events.append("collector.start")

    def begin_stop(self) -> None:
        self.events.append("collector.begin_stop")

    def stop(self, timeout_s: float = 0.0) -> object:
        self.events.append("collector.stop")
        return True


class ManualTicker:
    """A batcher ``wait`` the test drives: ``tick()`` releases one wait and returns once the
    batcher is waiting again (so the batch it triggered is done)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._waiting = 0
        self._generation = 0
        self._stopped = False

    def wait(self, _seconds):
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()
            generation = self._generation
            self._cond.wait_for(lambda: self._generation != generation or self._stopped, timeout=30)
            return self._stopped

    def tick(self):
        with self._cond:
            assert self._cond.wait_for(lambda: self._waiting > 0, timeout=30)
            seen = self._waiting
            self._generation += 1
            self._cond.notify_all()
            assert self._cond.wait_for(lambda: self._waiting > seen or self._stopped, timeout=30)

    def stop(self):
        with self._cond:
            self._stopped = True
            self._cond.notify_all()


def config(**sections):
    # Declarations go to the main loopback listener (as on a single-user host that allows it),
    # never to the machine's default profiler socket; a test's own server section adds to it.
    server = {
        "listen": ["127.0.0.1:0"],
        "profiler_listen": [],
        "allow_unauthenticated_declare": True,
    }
    server.update(sections.pop("server", {}))
    return SidecarConfig.model_validate({"server": server, **sections})


@pytest.fixture
def make_sidecar():
    made = []

    def make(cfg=None, events=None):
        ticker = ManualTicker()
        collectors = []

        def factory(producer, settings, telemetry):
            collectors.append(StubCollector(producer, settings, telemetry, events))
            return collectors[0]

        sidecar = Sidecar(cfg or config(), collector_factory=factory, batch_wait=ticker.wait)
        made.append((sidecar, ticker))
        return sidecar, collectors[0], ticker

    yield make
    for sidecar, ticker in made:
        ticker.stop()
        sidecar.parts.server.stop(0)
        sidecar.parts.batcher.stop(5)


@pytest.fixture
def running(make_sidecar):
    """A started sidecar with one batch stored and health SERVING; yields (sidecar, address)."""
    sidecar, collector, ticker = make_sidecar()
    sidecar.start()
    collector.record()
    collector.ready.set()
    ticker.tick()
    assert sidecar.parts.health.ready
    yield sidecar, sidecar.parts.server.addresses.listen[0]
