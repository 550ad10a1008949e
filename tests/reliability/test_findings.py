"""Defects the reliability suite found in other packages, kept as regression tests.

A hang in the tick that recovers a lost GPU used to be caught only at the cycle deadline and
counted as ``nvml.function=unknown``: the per-call watcher followed the failed device record,
not the recovered one the job was reading (fixed in ``nvml/collector.py``). See
docs/reliability.md, "Findings".
"""

from __future__ import annotations

from gpumetrics.metrics.producer import Producer
from gpumetrics.nvml.collector import Collector
from gpumetrics.nvml.settings import CollectionSettings
from gpumetrics.selftelemetry import Telemetry

import nvmlsim as sim


def test_a_hang_in_the_tick_that_recovers_a_gpu_is_caught_by_the_call_deadline() -> None:
    data = sim.load_scenario("h100-sxm").model_dump(mode="json", exclude_none=True)
    uuid = data["devices"][0]["uuid"]
    # The first memory read of the recovered GPU (cycle 3, same tick as the probe) hangs.
    data["faults"] = [
        {
            "function": "nvmlDeviceGetMemoryInfo_v2",
            "device": uuid,
            "hang": True,
            "from_cycle": 3,
            "until_cycle": 4,
            "calls": 1,
        }
    ]
    drv = sim.install(sim.scenario_from_data(data), latency="off", max_hang_s=20)
    telemetry = Telemetry()
    now = lambda: drv.clock.now_us() * 1000  # noqa: E731
    settings = CollectionSettings(
        pid_max=2**22,
        pcie_interval_s=0,
        call_timeout_s=1.0,  # under the cycle deadline; past any ordinary call, loaded
        cycle_timeout_s=3.0,
        device_backoff_initial_s=1,
        device_backoff_max_s=1,
    )
    collector = Collector(Producer(), settings, telemetry, clock_ns=now, monotonic_ns=now)
    try:
        collector.collect_once()
        drv.next_cycle()
        drv.trigger("lose_gpu", device=uuid)
        assert collector.collect_once().states[uuid] == "failed"
        drv.next_cycle()
        drv.trigger("restore_gpu", device=uuid)
        report = collector.collect_once()  # probe succeeds, the recovered GPU is read, and hangs
        assert drv.wait_until_held(1, timeout_s=5)
        assert report.timed_out == [uuid]
        by_function = telemetry.value(
            "gpumetrics.collection.timeouts", {"nvml.function": "nvmlDeviceGetMemoryInfo_v2"}
        )
        assert by_function == 1, telemetry.value(
            "gpumetrics.collection.timeouts", {"nvml.function": "unknown"}
        )
    finally:
        drv.release_hangs()
        collector.stop(5.0)
        sim.uninstall()
