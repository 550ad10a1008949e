"""Field cases F07-F09, F17, F18, F25, F26: capabilities, MIG, unified memory, units, strings."""

import logging

from gpumetrics.metrics import names

F07 = "GPU-f0700000-0000-4000-8000-000000000001"


def test_F07_energy_not_supported_is_absent_and_called_once(nvml_run, caplog):
    run = nvml_run("F07_energy_not_supported")
    with caplog.at_level(logging.INFO, logger="gpumetrics.nvml"):
        run.cycle(5)
    out = run.output()
    assert out.find(names.MetricEnergy) == []  # absent, never 0
    assert out.values(names.MetricPower) == [60.0] * 5  # 60000 mW
    assert out.values(names.MetricGPUPowerLimit) == [149.0] * 5
    assert out.values(names.MetricTemperature) == [43.0] * 5
    assert run.calls("nvmlDeviceGetTotalEnergyConsumption", 0) == 1
    assert run.errors("nvmlDeviceGetTotalEnergyConsumption", "NOT_SUPPORTED") == 1
    logged = [r for r in caplog.records if "nvmlDeviceGetTotalEnergyConsumption" in r.getMessage()]
    assert [r.levelno for r in logged] == [logging.INFO]
    assert all(p.value == 1 for p in out.find(names.MetricStatus, hw__state="ok"))


F08_PARENT = "GPU-f0800000-0000-4000-8000-000000000001"
F08_MIG0 = "MIG-f0800000-0000-5000-8000-000000000001"
F08_MIG3 = "MIG-f0800000-0000-5000-8000-000000000002"


def test_F08_mig_utilisation_absent_and_per_instance_processes_with_gi_ci(nvml_run):
    run = nvml_run("F08_mig_utilization_not_supported")
    run.cycle(3)
    out = run.output()
    # utilisation (device and process): absent, no zeros
    for metric in (
        names.MetricGPUUtilization,
        names.MetricGPUMemoryCopyUtilization,
        names.MetricProcessUtilization,
        names.MetricProcessMemoryCopyUtilization,
    ):
        assert out.find(metric) == [], metric
    # the parent carries mig.mode=enabled and the board-level values, once
    assert {p.attrs["nvidia.gpu.mig.mode"] for p in out.find(names.MetricPower)} == {"enabled"}
    power = out.values(names.MetricPower)  # each power sample its own point
    assert set(power) == {210.0} and len(power) >= 3
    assert {p.attrs["hw.id"] for p in out.find(names.MetricEnergy)} == {F08_PARENT}
    assert len(out.find(names.MetricEnergy)) == 3
    # memory per instance (hw.parent = the GPU), never on the parent
    usage = out.find(names.MetricGPUMemoryUsage)
    assert {p.attrs["hw.id"] for p in usage} == {F08_MIG0, F08_MIG3}
    assert {p.attrs["hw.parent"] for p in usage} == {F08_PARENT}
    # per-process memory from MIG handles, with GI/CI attributes
    p1 = out.find(names.MetricProcessMemoryUsage, pid=8801)
    assert [p.value for p in p1] == [16106127360] * 3
    assert p1[0].attrs == {
        "hw.id": F08_MIG0,
        "hw.parent": F08_PARENT,
        "nvidia.gpu.mig.gpu_instance.id": 1,
        "nvidia.gpu.mig.compute_instance.id": 0,
    }
    p2 = out.find(names.MetricProcessMemoryUsage, pid=8802)
    assert p2[0].attrs["nvidia.gpu.mig.gpu_instance.id"] == 9
    # the parent's process lists would answer NO_PERMISSION: never asked (the simulator counts
    # MIG-handle calls under the parent's index, so the error counter is the witness here)
    assert run.errors(code="NO_PERMISSION") == 0
    # utilisation calls are documented unsupported under MIG: never made
    for fn in (
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetProcessesUtilizationInfo",
    ):
        assert run.calls(fn, 0) == 0, fn
    assert run.failures() == 0
    # no error-counter growth after the first cycle
    before = run.errors()
    run.cycle(2)
    assert run.errors() == before


F09_CALLS = (
    "nvmlDeviceGetTemperature",  # driver 550: no TemperatureV
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetEnforcedPowerLimit",
)


def test_F09_vgpu_unsupported_sensors_absent_each_called_once(nvml_run):
    run = nvml_run("F09_vgpu_guest_sensors")
    run.cycle(12)  # past the 10 s PCIe cadence, so PCIe is due twice
    out = run.output()
    for metric in (
        names.MetricTemperature,
        names.MetricGPUPCIeThroughput,
        names.MetricEnergy,
        names.MetricGPUPowerLimit,
    ):
        assert out.find(metric) == [], metric
    for fn in F09_CALLS:
        assert run.calls(fn, 0) == 1, fn
    # the device is still exported under its UUID, with what works
    dev = "GPU-f0900000-0000-4000-8000-000000000001"
    assert out.values(names.MetricGPUMemoryLimit, hw__id=dev) == [17179869184] * 12
    assert len(out.find(names.MetricGPUUtilization, hw__gpu__task="general")) >= 12
    assert out.values(names.MetricProcessMemoryUsage, pid=9901) == [6442450944] * 12


GB10 = "GPU-f1700000-0000-4000-8000-000000000001"


def test_F17_gb10_memory_and_limit_absent_power_and_process_memory_present(nvml_run, caplog):
    run = nvml_run("F17_gb10_unified_memory")
    with caplog.at_level(logging.INFO, logger="gpumetrics.nvml"):
        run.cycle(3)
    out = run.output()
    for metric in (
        names.MetricGPUMemoryUsage,
        names.MetricGPUMemoryLimit,
        names.MetricGPUMemoryUtilization,
        names.MetricGPUPowerLimit,
        names.MetricGPUPCIeThroughput,
    ):
        assert out.find(metric) == [], metric
    power = out.values(names.MetricPower)
    assert set(power) == {3.0} and len(power) >= 3
    assert out.values(names.MetricTemperature) == [36.0] * 3
    assert out.values(names.MetricProcessMemoryUsage, pid=7731) == [30064771072] * 3
    domains = {p.attrs["nvidia.gpu.clock.domain"] for p in out.find(names.MetricGPUClockSpeed)}
    assert domains == {"graphics", "sm", "video"}  # memory clock NOT_SUPPORTED alone
    # idle: empty sample buffers -> snapshot 0 %
    assert out.values(names.MetricGPUUtilization, hw__gpu__task="general") == [0.0] * 3
    # no host-RAM fallback attribute anywhere
    assert not any("memory.unified" in p.attrs for p in out.points)
    assert run.calls("nvmlDeviceGetMemoryInfo_v2", 0) == 1
    assert run.calls("nvmlDeviceGetMemoryInfo", 0) == 0  # v1 reads the same framebuffer
    assert run.failures() == 0
    # one log line per unsupported capability
    per_fn = {}
    for r in caplog.records:
        if "not called again" in r.getMessage():
            fn = r.getMessage().split(": ")[1]
            per_fn[fn] = per_fn.get(fn, 0) + 1
    assert per_fn and all(n == 1 for n in per_fn.values()), per_fn


def test_F18_discrete_gpu_memory_comes_from_nvml(nvml_run):
    run = nvml_run("F18_discrete_gpu_memory")
    run.cycle(2)
    out = run.output()
    assert out.values(names.MetricGPUMemoryLimit) == [8589934592] * 2
    assert out.values(names.MetricGPUMemoryUsage) == [1073741824] * 2
    assert out.values(names.MetricGPUMemoryUtilization) == [0.125] * 2


def test_F25_pcie_directions_and_kib_multiplier(nvml_run):
    run = nvml_run("F25_pcie_directions")
    run.cycle()
    out = run.output()
    assert (
        out.one(names.MetricGPUPCIeThroughput, network__io__direction="transmit").value
        == 1200 * 1024
    )
    assert (
        out.one(names.MetricGPUPCIeThroughput, network__io__direction="receive").value
        == 34000 * 1024
    )
    assert run.calls("nvmlDeviceGetPcieThroughput", 0) == 2  # TX and RX; counter 2 never queried
    assert run.failures() == 0


def test_F25_pcie_is_read_on_its_slow_cadence(nvml_run, helpers):
    run = nvml_run("F25_pcie_directions", helpers.settings(pcie_interval_s=5.0))
    run.cycle(11)
    assert len(run.output().find(names.MetricGPUPCIeThroughput)) == 2 * 3  # cycles 1, 6, 11
    assert run.calls("nvmlDeviceGetPcieThroughput", 0) == 6


def test_F26_non_utf8_device_name_is_sanitised_and_the_device_exported(nvml_run, caplog):
    run = nvml_run("F26_non_utf8_names")
    with caplog.at_level(logging.WARNING, logger="gpumetrics.nvml"):
        run.cycle(2)
    out = run.output()
    dev = "GPU-f2600000-0000-4000-8000-000000000001"
    power = out.find(names.MetricPower, hw__id=dev)
    assert [p.value for p in power] == [40.0, 40.0]
    assert (
        power[0].attrs["hw.model"] == "\ufffdNVIDIA"
    )  # invalid byte replaced, control char removed
    # the process is exported (its name is the identity package's business, not a metric attribute)
    assert out.values(names.MetricProcessMemoryUsage, pid=77) == [536870912] * 2
    assert run.errors("nvmlDeviceGetName", "UNICODE_DECODE_ERROR") == 1
    warned = [r for r in caplog.records if "nvmlDeviceGetName" in r.getMessage()]
    assert len(warned) == 1  # caught per field, logged once


def test_F08_destroyed_mig_instance_is_re_enumerated_away(nvml_run, helpers):
    run = nvml_run("a100-mig", helpers.settings(mig_interval_s=30.0))
    run.cycle(2)
    before = {p.attrs["hw.id"] for p in run.output().find(names.MetricGPUMemoryUsage)}
    assert len(before) == 3
    run.drv.trigger("destroy_mig_instance", device=0, slot=1)
    run.cycle(2)  # the stale handle is noticed, then the slots are enumerated again
    out = run.output()
    last = max(p.time for p in out.find(names.MetricGPUMemoryUsage))
    after = {p.attrs["hw.id"] for p in out.find(names.MetricGPUMemoryUsage) if p.time == last}
    assert after == before - {"MIG-1c3e5a7b-9d2f-5b4c-a6e8-0f2d4b6c8e13"}
    gone = out.find(names.MetricStatus, hw__id="MIG-1c3e5a7b-9d2f-5b4c-a6e8-0f2d4b6c8e13")
    assert gone and all(p.time < last for p in gone)  # reported until noticed, then no more
