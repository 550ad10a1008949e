"""Cost of GPU events (a benchmark, not a test): a storm through the listener, rendering, idle.

Three measurements on the simulated driver (h100-sxm, one GPU), through the real nvidia-ml-py:

1. Storm: ``N`` identical Xids raised at once are read by the listener thread one
   ``nvmlEventSetWait_v2`` at a time and counted by the ``EventProducer``; reports the wall time
   and process CPU until all were counted (events/s), and how many records the storm limit let
   through.
2. Rendering: ``M`` distinct events (no storm) rendered into one ``ExportLogsServiceRequest``:
   µs and serialized bytes per log record.
3. Idle: process CPU of the listener waiting (no events, no collection cycles) over ``S`` s.

Run: ``python benchmarks/events_bench.py [--storm 10000] [--records 2000] [--idle-s 5]``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpumetrics.events import EventProducer, EventSettings, GpuEvent  # noqa: E402
from gpumetrics.metrics.producer import Producer  # noqa: E402
from gpumetrics.nvml.collector import Collector  # noqa: E402
from gpumetrics.nvml.settings import CollectionSettings  # noqa: E402
from gpumetrics.selftelemetry import Telemetry  # noqa: E402

import nvmlsim as sim  # noqa: E402
from benchmarks.harness import emit, machine  # noqa: E402


class CountingSink(EventProducer):
    """The real producer, plus a condition the benchmark waits on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.count = 0
        self.cond = threading.Condition()

    def record(self, event: GpuEvent) -> None:
        super().record(event)
        with self.cond:
            self.count += 1
            self.cond.notify_all()


def storm(n: int) -> dict[str, Any]:
    drv = sim.install(sim.load_scenario("h100-sxm"), latency="off")
    try:
        clock = lambda: drv.clock.now_us() * 1000  # noqa: E731
        settings = EventSettings(wait_timeout_s=0.05)
        tel = Telemetry(clock_ns=clock)
        sink = CountingSink(settings, {"host.name": "bench"}, tel, clock_ns=clock)
        col = Collector(
            Producer(), CollectionSettings(pid_max=4_194_304), tel, clock_ns=clock,
            monotonic_ns=clock,
        )  # fmt: skip
        col.attach_events(sink, settings)
        col.collect_once()
        assert col.events is not None and col.events.wait_registered(1, 30)
        cpu0, t0 = time.process_time(), time.perf_counter()
        drv.emit_event(0, "xid", 13, count=n)
        with sink.cond:
            assert sink.cond.wait_for(lambda: sink.count >= n, timeout=600)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        records = sum(
            len(sl.log_records) for rl in sink.collect(final=True).resource_logs
            for sl in rl.scope_logs
        )  # fmt: skip
        assert col.stop(5)
    finally:
        sim.uninstall()
    return {
        "events": n,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "events_per_s": round(n / wall),
        "cpu_us_per_event": round(cpu / n * 1e6, 1),
        "records_logged": records,
    }


def rendering(m: int) -> dict[str, Any]:
    producer = EventProducer(EventSettings(), {"host.name": "bench"})
    attrs = (
        ("hw.id", "GPU-7c1e2a90-3f4b-4d21-8e6a-0b9c5d3e1f70"), ("hw.name", "gpu0"),
        ("hw.vendor", "NVIDIA"), ("hw.model", "NVIDIA H100 80GB HBM3"),
        ("hw.serial_number", "1654123000000"), ("hw.driver_version", "570.172.08"),
        ("hw.firmware_version", "96.00.99.00.01"),
    )  # fmt: skip
    for i in range(m):
        producer.record(GpuEvent("xid", (13, 31, 48, 94, 95)[i % 5], f"GPU-{i}", attrs, 10**18 + i))
    t0 = time.perf_counter()
    req = producer.collect()
    took = time.perf_counter() - t0
    size = len(req.SerializeToString())
    return {"records": m, "us_per_record": round(took / m * 1e6, 1), "bytes_per_record": size // m}


def idle(seconds: float) -> dict[str, Any]:
    drv = sim.install(sim.load_scenario("h100-sxm"), latency="off")
    try:
        settings = EventSettings()  # the default 1 s wait
        sink = EventProducer(settings)
        col = Collector(Producer(), CollectionSettings(pid_max=4_194_304), Telemetry())
        col.attach_events(sink, settings)
        col.collect_once()
        assert col.events is not None and col.events.wait_registered(1, 30)
        waits0 = drv.call_count("nvmlEventSetWait_v2")
        cpu0 = time.process_time()
        threading.Event().wait(seconds)  # measuring an idle interval, not synchronising
        cpu = time.process_time() - cpu0
        waits = drv.call_count("nvmlEventSetWait_v2") - waits0
        assert col.stop(5)
    finally:
        sim.uninstall()
    return {"seconds": seconds, "cpu_ms": round(cpu * 1000, 2), "waits": waits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storm", type=int, default=10_000)
    parser.add_argument("--records", type=int, default=2_000)
    parser.add_argument("--idle-s", type=float, default=5.0)
    args = parser.parse_args()
    result = {
        "machine": machine(),
        "storm": storm(args.storm),
        "rendering": rendering(args.records),
        "idle": idle(args.idle_s),
    }
    for key in ("storm", "rendering", "idle"):
        print(f"{key}: {result[key]}")
    emit("events", result)


if __name__ == "__main__":
    main()
