"""Run ``gpumetrics`` (the console script's ``main``) with a stub collector instead of NVML.

Usage: ``python stub_serve.py serve [flags]``. The stub records one device point and reports
ready at start, so the sidecar turns SERVING after its first batch; ``stop`` is recorded on
stderr so tests can check the shutdown order.
"""

from __future__ import annotations

import sys
import threading
import time

from gpumetrics.cli import main
from gpumetrics.metrics import GPU, names


class StubCollector:
    def __init__(self, producer, settings, telemetry):
        self.producer = producer
        self.ready = threading.Event()

    def start(self):
        gpu = GPU(uuid="GPU-stub-0", index=0, name="gpu0", model="Stub GPU")
        self.producer.record_host(
            lambda b: b.add(names.MetricPower, 250.0, time.time_ns(), gpu.attributes())
        )
        self.ready.set()

    def stop(self, timeout_s):
        print("stub collector stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], collector_factory=StubCollector))
