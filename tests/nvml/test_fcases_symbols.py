"""Field cases F01-F06: struct versions and missing symbols, on the simulated driver."""

import logging

from gpumetrics.metrics import names

PROC_MEM = names.MetricProcessMemoryUsage


def test_F01_r535_32byte_records_drop_the_process_list_and_keep_device_metrics(nvml_run, caplog):
    run = nvml_run("F01_r535_32byte_process_records")
    with caplog.at_level(logging.WARNING, logger="gpumetrics.nvml"):
        run.cycle(3)
    out = run.output()
    # 32-byte records read at a 24-byte stride give pid 0 / 0xFFFFFFFF entries: list dropped
    assert out.find(PROC_MEM) == []
    assert out.pids() == set()
    assert run.dropped("process_struct_mismatch") == 3  # once per cycle
    # device metrics intact
    assert out.values(names.MetricGPUMemoryLimit) == [85520809984] * 3
    assert out.values(names.MetricTemperature) == [45.0] * 3
    assert out.values(names.MetricPower) == [250.0] * 3
    # logged once (WARNING) with the driver version
    mismatch = [r for r in caplog.records if "struct mismatch" in r.getMessage()]
    assert len(mismatch) == 1 and "535.54.03" in mismatch[0].getMessage()


def test_F02_v1_symbol_read_with_the_16_byte_struct(nvml_run):
    run = nvml_run("F02_v1_symbol_16byte_records")
    run.cycle()
    out = run.output()
    got = {p.resource["process.pid"]: p for p in out.find(PROC_MEM)}
    assert {pid: p.value for pid, p in got.items()} == {
        6201: 4294967296,
        6202: 1073741824,
        6203: 536870912,
    }
    # v1 records carry no MIG ids: the attributes are absent, not 0xFFFFFFFF
    for p in got.values():
        assert set(p.attrs) == {"hw.id"}
    assert run.calls("nvmlDeviceGetComputeRunningProcesses", 0) >= 2  # sizing + data
    assert run.failures() == 0


def test_F03_memory_v2_is_called_with_the_struct_version_word(nvml_run):
    run = nvml_run("F03_memory_v2_struct_version")
    run.cycle(2)
    out = run.output()
    # device 0 (bad_struct_version_code 13 for a wrong version): we pass nvmlMemory_v2, so v2 works
    d0 = "GPU-f0300000-0000-4000-8000-000000000001"
    assert (
        out.values(names.MetricGPUMemoryUsage, hw__id=d0) == [1073741824] * 2
    )  # v2 used excludes reserved
    assert run.calls("nvmlDeviceGetMemoryInfo", 0) == 0
    assert run.errors("nvmlDeviceGetMemoryInfo_v2", "FUNCTION_NOT_FOUND") == 0


def test_F03_wsl_v2_unknown_falls_back_to_v1_once(nvml_run, caplog):
    run = nvml_run("F03_memory_v2_struct_version")
    with caplog.at_level(logging.INFO, logger="gpumetrics.nvml"):
        run.cycle(3)
    out = run.output()
    d1 = "GPU-f0300000-0000-4000-8000-000000000002"
    # v1 used = used + reserved; emitted every cycle, first cycle included
    assert out.values(names.MetricGPUMemoryUsage, hw__id=d1) == [2147483648 + 209715200] * 3
    assert out.values(names.MetricGPUMemoryLimit, hw__id=d1) == [10737418240] * 3
    assert run.calls("nvmlDeviceGetMemoryInfo_v2", 1) == 1  # tried once, then v1 for good
    assert run.calls("nvmlDeviceGetMemoryInfo", 1) == 3
    assert run.errors("nvmlDeviceGetMemoryInfo_v2", "UNKNOWN") == 1
    notes = [r for r in caplog.records if "using nvmlDeviceGetMemoryInfo" in r.getMessage()]
    assert len(notes) == 1
    # the fallback does not degrade the device
    assert all(p.value == 1 for p in out.find(names.MetricStatus, hw__id=d1, hw__state="ok"))


def _process_memory(out):
    return {p.resource["process.pid"]: p.value for p in out.find(PROC_MEM)}


def test_F04_driver_470_uses_the_v2_symbols(nvml_run):
    run = nvml_run("F04_driver_470_no_v3")
    run.cycle()
    assert _process_memory(run.output()) == {7401: 4294967296, 7402: 33554432}
    assert run.calls("nvmlDeviceGetComputeRunningProcesses_v3") == 0  # probed at init, never called
    assert run.calls("nvmlDeviceGetGraphicsRunningProcesses_v2", 0) >= 1
    assert run.failures() == 0


def test_F04_driver_440_has_a_correct_v1_path_and_never_crashes(nvml_run, caplog):
    run = nvml_run("F04_driver_440_no_v2")
    with caplog.at_level(logging.WARNING, logger="gpumetrics.nvml"):
        report = run.cycle(2)
    assert report.up
    out = run.output()
    assert _process_memory(out) == {7441: 2147483648}
    assert out.values(names.MetricPower) == [61.0, 61.0]
    assert run.failures() == 0
    # the MPS list has no symbol at all on 440: one warning naming the symbols tried
    warned = [r.getMessage() for r in caplog.records if "process-list symbol" in r.getMessage()]
    assert len(warned) == 1 and "nvmlDeviceGetMPSComputeRunningProcesses" in warned[0]


def test_F05_535_98_decides_by_symbol_presence_not_version(nvml_run):
    run = nvml_run("F05_driver_535_98_no_v3")
    run.cycle()
    # 8502 is in both the compute and graphics lists: one process, memory counted once
    assert _process_memory(run.output()) == {8501: 3221225472, 8502: 1048576}
    assert run.calls("nvmlDeviceGetComputeRunningProcesses_v2", 0) >= 1
    assert run.calls("nvmlDeviceGetComputeRunningProcesses_v3") == 0
    assert run.failures() == 0


def test_F06_missing_clock_event_reasons_uses_the_throttle_call(nvml_run, caplog):
    run = nvml_run("F06_missing_clock_event_reasons")
    with caplog.at_level(logging.DEBUG, logger="gpumetrics.nvml"):
        run.cycle(2)
    out = run.output()
    active = {
        p.attrs["nvidia.gpu.clock.event_reason"]
        for p in out.find(names.MetricGPUClockEventReason)
        if p.value == 1
    }
    assert active == {"sw_power_cap", "hw_thermal_slowdown"}  # 0x44
    assert len(out.find(names.MetricGPUClockEventReason)) == 2 * 9
    assert out.values(names.MetricTemperature) == [61.0, 61.0]
    assert run.calls("nvmlDeviceGetCurrentClocksThrottleReasons", 0) == 2
    assert run.calls("nvmlDeviceGetTemperature", 0) == 2
    assert run.failures() == 0
    debug = [r for r in caplog.records if "missing; using" in r.getMessage()]
    assert {r.levelno for r in debug} == {logging.DEBUG} and len(debug) == 2  # one per fallback
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_F06_missing_temperature_v_uses_the_deprecated_call(nvml_run):
    run = nvml_run("F06_missing_temperature_v")
    run.cycle(2)
    out = run.output()
    assert out.values(names.MetricTemperature) == [57.0, 57.0]
    active = {
        p.attrs["nvidia.gpu.clock.event_reason"]
        for p in out.find(names.MetricGPUClockEventReason)
        if p.value == 1
    }
    assert active == {"gpu_idle", "sw_power_cap"}
    assert run.calls("nvmlDeviceGetTemperatureV") == 0
    assert run.calls("nvmlDeviceGetCurrentClocksEventReasons", 0) == 2
    assert run.failures() == 0
