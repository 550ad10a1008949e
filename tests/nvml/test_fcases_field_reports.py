"""Field cases F27-F32 and the F11 index move: what the field reports of issues 11 and 12 found.

F27 idle processes are 0, F28 processes whose memory NVML cannot report stay visible, F29
reserved memory (v2 only), F30 a device with no supported telemetry (Jetson), F31 boot-clock
samples under the wall clock, F32 NVML that stops answering everywhere; and GPUs that changed
index (F11 variant B). Each scenario ships with nvmlsim (``nvmlsim/src/nvmlsim/fieldcases/``).
"""

import logging
import time

import pytest
import yaml
from gpumetrics.metrics import names
from gpumetrics.metrics.producer import Producer
from gpumetrics.nvml.collector import Collector
from gpumetrics.selftelemetry import Telemetry

import nvmlsim as sim

PROC_UTIL = names.MetricProcessUtilization
PROC_COPY = names.MetricProcessMemoryCopyUtilization
PROC_MEM = names.MetricProcessMemoryUsage
GPU_METRICS = names.ScopeName


def _device_points(out):
    return [p for p in out.points if p.scope == GPU_METRICS]


# --- F27: a running process without a sample was idle --------------------------------------
F27 = "GPU-f2700000-0000-4000-8000-000000000001"
A, B, C, D = 2701, 2702, 2703, 2704


def test_F27_running_process_without_a_sample_is_0_and_the_cursor_moves_to_t2(nvml_run):
    run = nvml_run("F27_idle_process_zero_utilization")
    run.cycle(2)  # cycle 2 leaves the cursor at B's sample at 0.5 s (t0)
    dev = run.col.devices()[0]
    start_us = run.drv.timeline.start_us
    assert dev.cursors.get("process_utilization") - start_us == 500_000
    run.output()
    tick_ns = run.drv.now_us * 1000
    run.cycle()  # cycle 3: the trigger
    out = run.output()
    general = {p.resource["process.pid"]: p for p in out.find(PROC_UTIL, hw__gpu__task="general")}
    assert set(general) == {A, B, D}  # no point for C (exited, sample older than the cursor)
    assert general[A].value == 0.9 and general[A].time == (start_us + 1_200_000) * 1000  # t1
    assert general[B].value == 0.1 and general[B].time == (start_us + 1_500_000) * 1000  # t2
    assert general[D].value == 0.0 and general[D].time == tick_ns  # idle: 0, at the tick
    for task in ("encoder", "decoder"):
        assert out.values(PROC_UTIL, pid=D, hw__gpu__task=task) == [0.0]
    assert out.values(PROC_COPY, pid=D) == [0.0]
    assert out.values(PROC_COPY, pid=A) == [0.3]
    assert out.find(PROC_UTIL, pid=C) == [] and out.find(PROC_MEM, pid=C) == []
    assert dev.cursors.get("process_utilization") - start_us == 1_500_000  # next cursor: t2
    assert run.failures() == 0


def test_F27_no_zero_where_nothing_was_read(nvml_run, helpers):
    # NOT_FOUND for the whole device: no process had a sample newer than the cursor
    run = nvml_run("F19_idle_empty_sample_buffers")
    run.drv.add_process(0, 4100, used_memory_bytes=1 << 30)
    run.cycle(2)
    out = run.output()
    assert out.values(PROC_MEM, pid=4100) == [1 << 30] * 2
    assert out.find(PROC_UTIL) == [] and out.find(PROC_COPY) == []
    # the call itself fails: no zeros either
    data = helpers.variant("F27_idle_process_zero_utilization").model_dump(mode="json")
    data["faults"] = [{"function": "nvmlDeviceGetProcessesUtilizationInfo", "code": "UNKNOWN"}]
    sim.uninstall()
    failing = nvml_run(data)
    failing.cycle(3)
    out = failing.output()
    assert out.find(PROC_UTIL) == [] and out.find(PROC_COPY) == []
    assert out.values(PROC_MEM, pid=D) == [1073741824] * 3
    # unsupported (no process_utilization on the device): no zeros
    data = helpers.variant("F27_idle_process_zero_utilization").model_dump(mode="json")
    data["devices"][0]["process_utilization"] = None
    sim.uninstall()
    unsupported = nvml_run(data)
    unsupported.cycle(3)
    out = unsupported.output()
    assert out.find(PROC_UTIL) == [] and len(out.find(PROC_MEM, pid=D)) == 3


# --- F28: memory not available -----------------------------------------------------------------
def test_F28_process_with_memory_not_available_keeps_its_resource_and_utilisation(nvml_run):
    run = nvml_run("F28_process_memory_not_available")
    run.cycle(3)
    out = run.output()
    assert out.find(PROC_MEM) == []  # never a number for NVML_VALUE_NOT_AVAILABLE
    assert out.pids() == {3801, 3802}  # both processes keep their resource
    assert set(out.values(PROC_UTIL, pid=3801, hw__gpu__task="general")) == {0.4}
    assert set(out.values(PROC_COPY, pid=3801)) == {0.12}
    assert out.values(PROC_UTIL, pid=3802, hw__gpu__task="general") == [0.0] * 3  # idle
    assert run.dropped("sentinel") == 0 and run.dropped("process_struct_mismatch") == 0
    assert run.failures() == 0


def test_F28_a_listed_process_without_any_readable_value_is_counted(nvml_run):
    """Issue 28 item 7: on WSL2 / WDDM NVML lists the process, its memory is N/A and there is
    no per-process utilisation; nothing showed the GPU was in use. The per-list count does."""
    data = yaml.safe_load(sim.field_case_path("F28_process_memory_not_available").read_text())
    device = data["devices"][0]
    del device["process_utilization"]  # NOT_SUPPORTED, as WSL2 answers (nvtop #432)
    device["processes"].append(
        {"pid": 3803, "name": "game", "types": ["compute", "graphics"], "used_memory_bytes": "n/a"}
    )
    run = nvml_run(data)
    run.cycle(2)
    out = run.output()
    assert out.find(PROC_MEM) == [] and out.find(PROC_UTIL) == []  # nothing else to read
    counts = {}
    for p in out.find(names.MetricGPUProcessCount):
        counts.setdefault(p.attrs["nvidia.gpu.process.type"], []).append(p.value)
    # a C+G process is in both lists; each list is counted as NVML returned it
    assert counts == {"compute": [3, 3], "graphics": [1, 1], "mps": [0, 0]}
    start = run.col.devices()[0].start_ns
    assert {p.start for p in out.find(names.MetricGPUProcessCount)} == {start}


# --- F29: reserved memory --------------------------------------------------------------------
F29 = "GPU-f2900000-0000-4000-8000-000000000001"


def test_F29_reserved_memory_from_v2_only(nvml_run):
    run = nvml_run("F29_reserved_memory_v2")
    run.cycle(2)
    out = run.output()
    reserved = out.find(names.MetricGPUMemoryReserved, hw__id=F29)
    assert [p.value for p in reserved] == [314572800] * 2
    assert all(p.start == run.col.devices()[0].start_ns for p in reserved)
    assert out.values(names.MetricGPUMemoryUsage) == [1073741824] * 2  # v2: allocated only
    assert run.calls("nvmlDeviceGetMemoryInfo_v2", 0) == 2  # one read feeds all four metrics
    assert run.calls("nvmlDeviceGetMemoryInfo", 0) == 0


def test_F29_reserved_memory_absent_with_v1(nvml_run, helpers):
    run = nvml_run(
        helpers.variant("F29_reserved_memory_v2", missing_symbols=["nvmlDeviceGetMemoryInfo_v2"])
    )
    run.cycle(2)
    out = run.output()
    assert out.find(names.MetricGPUMemoryReserved) == []  # absent, never 0
    assert out.values(names.MetricGPUMemoryUsage) == [1073741824 + 314572800] * 2  # v1 used


# --- F30: a device with no supported telemetry ---------------------------------------------
F30 = "GPU-f3000000-0000-4000-8000-000000000001"


@pytest.mark.parametrize("scenario", ["F30_jetson_no_supported_telemetry", "jetson-orin"])
def test_F30_device_with_no_supported_telemetry(nvml_run, caplog, scenario):
    run = nvml_run(scenario)
    with caplog.at_level(logging.INFO, logger="gpumetrics.nvml"):
        run.cycle(4)
    out = run.output()
    device = _device_points(out)
    assert {p.metric for p in device} == {names.MetricStatus}  # no zeros, nothing invented
    status = out.find(names.MetricStatus, hw__state="ok")
    assert [p.value for p in status] == [1] * 4
    assert status[0].attrs["hw.model"] == "Orin (nvgpu)"  # the identity is still emitted
    assert status[0].attrs["hw.driver_version"] == "540.4.0"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "reports no supported telemetry" in warnings[0]
    for source in (
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetClockInfo:0",
        "nvmlDeviceGetComputeRunningProcesses_v3",
    ):
        assert source in warnings[0], source
    messages = [r.getMessage() for r in caplog.records]
    assert not any("symbol" in m for m in messages)  # nothing claims a symbol is missing
    per_gpu_info = [
        r for r in caplog.records if r.levelno == logging.INFO and "GPU " in r.getMessage()
    ]
    assert per_gpu_info == []  # the per-capability lines went to DEBUG
    # every source was asked once, the older versions of a list never (same capability)
    assert run.calls("nvmlDeviceGetComputeRunningProcesses_v3", 0) == 1
    assert run.calls("nvmlDeviceGetComputeRunningProcesses_v2", 0) == 0
    assert run.calls("nvmlDeviceGetCurrentClocksThrottleReasons", 0) == 0
    calls = sum(n for (fn, dev), n in run.drv.calls.items() if dev == 0)
    run.cycle(2)
    assert sum(n for (fn, dev), n in run.drv.calls.items() if dev == 0) == calls
    assert run.failures() == 0


def test_F30_one_unsupported_capability_still_logs_one_info_line(nvml_run, caplog):
    run = nvml_run("F07_energy_not_supported")
    with caplog.at_level(logging.INFO, logger="gpumetrics.nvml"):
        run.cycle(2)
    assert not any(r.levelno >= logging.WARNING for r in caplog.records)
    energy = [r for r in caplog.records if "nvmlDeviceGetTotalEnergyConsumption" in r.getMessage()]
    assert [r.levelno for r in energy] == [logging.INFO]


# --- F31: boot-clock samples under the wall clock -----------------------------------------
def test_F31_boot_clock_samples_land_at_their_wall_time_under_the_wall_clock(helpers):
    # no manual clock here: the collector uses the host's clocks and boot time, as serve does
    sim.install(sim.load_scenario("F31_boot_clock_samples"), clock=sim.WallClock())
    tel = Telemetry()
    prod = Producer(self_telemetry=tel)
    col = Collector(prod, helpers.settings(), tel)
    try:
        before = time.time_ns()
        report = col.collect_once()
        after = time.time_ns()
        assert report.up
        out = helpers.Output.of(prod.collect())
    finally:
        assert col.stop(5.0)
        sim.uninstall()
    assert tel.value("gpumetrics.values.dropped", {"reason": "timestamp_out_of_range"}) is None
    power = out.find(names.MetricPower)
    sampled = [p for p in power if p.time != report_time(out)]
    assert sampled, "no power sample survived"
    window = helpers.settings().interval_s * 1e9
    for p in power + out.find(names.MetricGPUUtilization, hw__gpu__task="general"):
        assert before - window - 1e9 <= p.time <= after, p  # real wall time, the last tick
    assert len(out.find(PROC_UTIL, pid=3101, hw__gpu__task="general")) == 1


def report_time(out):
    """The tick's time: that of the snapshot readings (hw.temperature has no samples)."""
    return out.one(names.MetricTemperature).time


def test_F31_boot_clock_follows_the_scenario_uptime_under_a_manual_clock(nvml_run):
    run = nvml_run("F31_boot_clock_samples")
    run.cycle()
    out = run.output()
    assert run.dropped("timestamp_out_of_range") == 0
    now_ns = out.one(names.MetricTemperature).time
    assert all(now_ns - 2 * 10**9 <= p.time <= now_ns for p in out.find(names.MetricPower))


# --- F32: NVML stops answering everywhere ----------------------------------------------------
F32 = "GPU-f3200000-0000-4000-8000-000000000000"


def _f32(nvml_run, helpers):
    return nvml_run(
        "F32_device_access_revoked",
        helpers.settings(init_backoff_initial_s=2.0, init_backoff_max_s=2.0),
    )


def test_F32_nvml_unknown_everywhere_takes_nvml_down_within_one_cycle(nvml_run, helpers):
    run = _f32(nvml_run, helpers)
    run.cycle(3)
    assert len(run.output().find(names.MetricTemperature)) == 2 * 3
    assert run.col.nvml_down_s() is None
    shutdowns = run.calls("nvmlShutdown")
    report = run.cycle()  # cycle 4: access revoked, every call answers UNKNOWN
    assert not report.up and report.reason == "unknown"
    assert _device_points(run.output()) == []  # never the last values re-served
    up = run.self_output().one("gpumetrics.nvml.up")
    assert up.value == 0 and up.attrs == {"reason": "unknown"}
    assert run.calls("nvmlShutdown") == shutdowns + 1  # the init is balanced at once
    assert run.calls("nvmlDeviceGetCount_v2") == 2  # discovery, then the one confirmation
    assert run.col.nvml_down_s() == 1.0  # down since cycle 4; run.cycle() stepped to cycle 5
    inits = run.calls("nvmlInitWithFlags")
    run.cycle(6)  # cycles 5-10: re-init on back-off (every 2 s), UNKNOWN each time
    assert run.calls("nvmlInitWithFlags") - inits == 3
    assert run.errors("nvmlInit", "UNKNOWN") == 3
    assert _device_points(run.output()) == []
    assert run.self_output().one("gpumetrics.nvml.up").attrs == {"reason": "unknown"}
    assert run.col.nvml_down_s() == 7.0
    assert run.drv.init_count == 0  # nothing left initialised behind the failures
    run.drv.trigger("restore_access")  # (in a real container this needs a restart)
    run.cycle(2)
    assert run.col.nvml_up() and run.col.nvml_down_s() is None
    assert len(run.output().find(names.MetricTemperature, hw__id=F32)) >= 1


def test_F32_one_broken_gpu_answering_unknown_is_degraded_not_nvml_down(nvml_run):
    data = sim.load_scenario("F32_device_access_revoked").model_dump(mode="json")
    data["events"] = []
    data["faults"] = [{"function": "*", "device": 1, "code": "UNKNOWN", "from_cycle": 2}]
    run = nvml_run(data)
    run.cycle(3)
    assert run.col.nvml_up()
    states = run.col.collect_once().states
    assert states[F32] == "ok" and states[F32[:-1] + "1"] == "degraded"
    assert run.calls("nvmlDeviceGetCount_v2") == 1  # another GPU answered: no confirmation call


def test_F32_a_single_gpu_answering_unknown_is_confirmed_by_the_count(nvml_run):
    data = sim.load_scenario("F32_device_access_revoked").model_dump(mode="json")
    data["events"] = []
    data["devices"] = data["devices"][:1]
    data["faults"] = [
        {"function": "*", "device": 0, "code": "UNKNOWN", "from_cycle": 2},
    ]
    run = nvml_run(data)
    run.cycle(3)
    assert run.col.nvml_up()  # nvmlDeviceGetCount answered: the GPU is broken, not NVML
    assert run.col.collect_once().states == {F32: "degraded"}


# --- F11 variant B: a GPU that moved to another index -------------------------------------
F11_MOVED = "GPU-f1200000-0000-4000-8000-000000000003"
F11_BACK = "GPU-f1200000-0000-4000-8000-000000000001"


def test_F11_every_gpu_that_changed_index_is_renamed_from_the_first_collection(nvml_run, helpers):
    run = nvml_run(
        "F11_gpu_lost_back_at_new_index",
        # a long back-off: the lost GPU is not probed in the cycle of the move
        helpers.settings(device_backoff_initial_s=2.0, device_backoff_max_s=60.0),
    )
    run.cycle(7)
    assert {p.attrs["hw.name"] for p in run.output().find(names.MetricPower, hw__id=F11_MOVED)} == {
        "gpu3"
    }
    run.cycle()  # cycle 8: GPU 1 is back at index 3, and the GPU at index 3 moved to index 1
    out = run.output()
    for p in out.points:
        if p.attrs.get("hw.id") == F11_MOVED:
            assert p.attrs["hw.name"] == "gpu1", p
    moved = next(d for d in run.col.devices() if d.uuid == F11_MOVED)
    assert moved.index == 1 and moved.gpu.name == "gpu1"
    run.cycle(8)  # the lost GPU comes back at index 3 on its next probe (cycle 12)
    out = run.output()
    names_by_id = {}
    for p in out.find(names.MetricStatus):
        names_by_id.setdefault(p.attrs["hw.id"], set()).add(p.attrs["hw.name"])
    assert names_by_id[F11_MOVED] == {"gpu1"}
    assert names_by_id[F11_BACK] == {"gpu1", "gpu3"}  # failed under its old identity, then back
    back = next(d for d in run.col.devices() if d.uuid == F11_BACK)
    assert back.index == 3 and back.health.state.value == "ok"
    power = out.find(names.MetricPower, hw__id=F11_BACK)
    assert power and {p.attrs["hw.name"] for p in power} == {"gpu3"}
    # indexes are checked only while some GPU is failed: none once all are back
    calls = run.calls("nvmlDeviceGetIndex")
    run.cycle(2)
    assert run.calls("nvmlDeviceGetIndex") == calls


def test_F11_healthy_node_makes_no_index_calls(nvml_run):
    run = nvml_run("h100-8x-training")
    run.cycle(3)
    assert run.calls("nvmlDeviceGetIndex") == 0
