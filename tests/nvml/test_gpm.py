"""GPM profiling metrics (nvidia.gpu.prof.*): values, MIG GPU instances, support, buffers, cost."""

import logging

import pytest
from gpumetrics.metrics import names
from gpumetrics.metrics.spec import catalogue

import nvmlsim as sim

STEADY = {"cycle_timeout_s": 60.0}
PROF = [n for n in catalogue().metrics if n.startswith("nvidia.gpu.prof.")]
H100_0 = "GPU-7c1e2a90-3f4b-4d21-8e6a-0b9c5d3e1f70"
MIG_PARENT = "GPU-9e1c3a5f-7b2d-4c6e-8a0f-1d3b5c7e9f24"
MIG_GI = {
    1: "MIG-4b6d8f0a-2c4e-5a6b-8d0f-2a4c6e8b0d13",
    5: "MIG-7e9a1c3b-5d2f-5e4a-9c1b-3d5f7a9c1e26",
    13: "MIG-2d4f6b8c-0e1a-5c3d-a5e7-9b1d3f5a7c48",
}
MIB = 1 << 20


def _gpm_device(metrics, **extra):
    return {
        "uuid": "GPU-ab000000-0000-4000-8000-000000000000",
        "gpm": {"metrics": metrics},
        **extra,
    }


def test_h100_node_reports_every_gpm_metric_with_the_scenarios_values(nvml_run, helpers):
    on = frozenset({names.MetricGPUProfEngineActivity})  # off by default
    run = nvml_run("h100-8x-training", helpers.settings(enabled_metrics=on, **STEADY))
    run.cycle(2)
    out = run.output()
    # the first tick only takes a sample; the second reports the interval [0 s, 1 s], which is
    # all compute step (the square wave's first 1.6 s of each 2 s)
    assert {p.time for p in out.find(names.MetricGPUProfSMActivity)} == {
        run.drv.now_us * 1000 - 10**9
    }
    expected = {
        (names.MetricGPUProfGraphicsEngineActivity, ()): 0.99,
        (names.MetricGPUProfSMActivity, ()): 0.93,
        (names.MetricGPUProfSMOccupancy, ()): 0.47,
        (names.MetricGPUProfDRAMActivity, ()): 0.51,
        (names.MetricGPUProfPipeActivity, (("nvidia.gpu.pipe", "tensor"),)): 0.64,
        (names.MetricGPUProfPipeActivity, (("nvidia.gpu.pipe", "tensor_hmma"),)): 0.63,
        (names.MetricGPUProfPipeActivity, (("nvidia.gpu.pipe", "tensor_dfma"),)): 0.0,
        (names.MetricGPUProfPipeActivity, (("nvidia.gpu.pipe", "tensor_imma"),)): 0.0,
        (names.MetricGPUProfPipeActivity, (("nvidia.gpu.pipe", "fp64"),)): 0.0,
        (names.MetricGPUProfPipeActivity, (("nvidia.gpu.pipe", "fp32"),)): 0.09,
        (names.MetricGPUProfPipeActivity, (("nvidia.gpu.pipe", "fp16"),)): 0.03,
        (names.MetricGPUProfPipeActivity, (("nvidia.gpu.pipe", "integer"),)): 0.07,
        (names.MetricGPUProfPCIeThroughput, (("network.io.direction", "transmit"),)): 342 * MIB,
        (names.MetricGPUProfPCIeThroughput, (("network.io.direction", "receive"),)): 410 * MIB,
        (names.MetricGPUProfNVLinkThroughput, (("network.io.direction", "transmit"),)): 2100 * MIB,
        (names.MetricGPUProfNVLinkThroughput, (("network.io.direction", "receive"),)): 2100 * MIB,
    }
    for (metric, attrs), value in expected.items():
        points = out.find(metric, **{k.replace(".", "__"): v for k, v in attrs})
        assert {p.attrs["hw.id"] for p in points} == {d.uuid for d in run.col.devices()}, metric
        assert {round(p.value, 9) for p in points} == {value}, (metric, attrs)
    engines = out.find(names.MetricGPUProfEngineActivity, hw__id=H100_0)
    assert sorted(
        (p.attrs["nvidia.gpu.engine"], p.attrs["nvidia.gpu.engine.index"]) for p in engines
    ) == sorted(
        [("nvdec", i) for i in range(7)] + [("nvjpg", i) for i in range(7)] + [("nvofa", 0)]
    )  # H100 has 7 NVDEC, 7 NVJPG, 1 NVOFA: the 8th engines answer NOT_SUPPORTED
    assert all(p.value == 0.0 for p in engines)
    assert run.failures() == 0 and run.drv.violations == []


def test_gpm_needs_two_calls_per_tick_and_buffers_allocated_once_then_freed(nvml_run, helpers):
    run = nvml_run("h100-sxm", helpers.settings(**STEADY))
    run.cycle(5)
    assert run.calls("nvmlGpmQueryDeviceSupport", 0) == 1
    assert run.calls("nvmlGpmSampleAlloc") == 2
    assert run.calls("nvmlGpmSampleGet", 0) == 5
    assert run.calls("nvmlGpmMetricsGet") == 4
    assert run.calls("nvmlGpmSetStreamingEnabled") == 0  # device settings are never changed
    assert len(run.output().find(names.MetricGPUProfSMActivity)) == 4
    assert run.drv.gpm_samples_live == 2
    assert run.col.stop(5.0)
    assert run.drv.gpm_samples_live == 0 and run.calls("nvmlGpmSampleFree") == 2
    assert run.drv.violations == []


def test_unsupported_gpm_metrics_are_dropped_after_one_answer_counted_once_logged_once(
    nvml_run, helpers, caplog
):
    data = {"format": 1, "devices": [_gpm_device({"SM_UTIL": 42})]}
    run = nvml_run(data, helpers.settings(**STEADY))
    with caplog.at_level(logging.INFO, logger="gpumetrics.nvml"):
        run.cycle(4)
    out = run.output()
    assert out.values(names.MetricGPUProfSMActivity) == [0.42] * 3
    assert {p.metric for p in out.points} & set(PROF) == {names.MetricGPUProfSMActivity}
    lines = [r for r in caplog.records if "GPM metrics not supported" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    sm_occupancy = run.errors("nvmlGpmMetricsGet:SM_OCCUPANCY", "NOT_SUPPORTED")
    assert sm_occupancy == 1  # counted once, not per tick
    assert run.failures() == 0


def test_a100_mig_has_no_gpm_and_says_so_once(nvml_run, helpers, caplog):
    run = nvml_run("a100-mig", helpers.settings(**STEADY))
    with caplog.at_level(logging.INFO, logger="gpumetrics.nvml"):
        run.cycle(5)
    out = run.output()
    assert not {p.metric for p in out.points} & set(PROF)
    assert run.calls("nvmlGpmQueryDeviceSupport", 0) == 1
    for fn in ("nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmMigSampleGet"):
        assert run.calls(fn) == 0, fn
    gpm_lines = [r for r in caplog.records if "nvmlGpm" in r.getMessage()]
    assert len(gpm_lines) == 1 and gpm_lines[0].levelno == logging.INFO
    assert "isSupportedDevice = 0" in gpm_lines[0].getMessage()


def test_h100_mig_each_gpu_instance_has_its_own_gpm_and_no_board_value_is_copied(nvml_run, helpers):
    run = nvml_run("h100-mig", helpers.settings(**STEADY))
    run.cycle(3)
    out = run.output()
    sm = out.find(names.MetricGPUProfSMActivity)
    by_id = {}
    for p in sm:
        by_id.setdefault(p.attrs["hw.id"], []).append(p)
    assert set(by_id) == {MIG_PARENT, *MIG_GI.values()}
    for gi, uuid in MIG_GI.items():
        assert {p.attrs["nvidia.gpu.mig.gpu_instance.id"] for p in by_id[uuid]} == {gi}
        assert {p.attrs["hw.parent"] for p in by_id[uuid]} == {MIG_PARENT}
    # the interval [0 s, 1 s] of each GPU instance's sine / square wave lies within its range
    assert all(0.77 <= p.value <= 0.91 for p in by_id[MIG_GI[1]])
    assert {p.value for p in by_id[MIG_GI[5]]} == {0.58}  # a 6 s square wave: first 3 s at 58
    assert {p.value for p in by_id[MIG_GI[13]]} == {0.0}  # idle, and still reported
    assert all(0.33 <= p.value <= 0.45 for p in by_id[MIG_PARENT])  # the whole GPU
    # device utilisation is not available under MIG: GPM is the utilisation signal
    assert out.find(names.MetricGPUUtilization) == []
    # nothing board-level (or per-GPU GPM rate) is repeated on an instance
    instance_metrics = {p.metric for p in out.points if p.attrs.get("hw.id", "").startswith("MIG-")}
    assert instance_metrics == {
        names.MetricStatus,
        names.MetricGPUMemoryUsage,
        names.MetricGPUMemoryLimit,
        names.MetricGPUMemoryUtilization,
        names.MetricGPUMemoryReserved,  # each instance's own memory info (v2)
        names.MetricGPUProfGraphicsEngineActivity,
        names.MetricGPUProfSMActivity,
        names.MetricGPUProfSMOccupancy,
        names.MetricGPUProfPipeActivity,
        names.MetricGPUProfDRAMActivity,
        names.MetricProcessMemoryUsage,
        names.MetricGPUProcessCount,  # each instance's own process lists
    }
    for metric in (names.MetricPower, names.MetricGPUBAR1MemoryLimit, names.MetricNetworkUp):
        assert {p.attrs.get("hw.parent", p.attrs["hw.id"]) for p in out.find(metric)} == {
            MIG_PARENT
        }, metric
    assert run.calls("nvmlGpmMigSampleGet", 0) == 3 * 3  # three GPU instances, every tick
    assert run.failures() == 0


def test_a_gpu_instance_with_two_compute_instances_reports_once_on_the_parent(nvml_run, helpers):
    parent = "GPU-ab000000-0000-4000-8000-000000000000"
    instances = [
        {
            "slot": s,
            "gpu_instance_id": 5,
            "compute_instance_id": s,
            "uuid": f"MIG-ab{s}00000-0000-5000-8000-000000000000",
        }
        for s in (0, 1)
    ]
    instances[0]["gpm"] = {"metrics": {"SM_UTIL": 61}}
    device = _gpm_device({"SM_UTIL": 30}, mig={"current": "enabled", "instances": instances})
    run = nvml_run({"format": 1, "devices": [device]}, helpers.settings(**STEADY))
    run.cycle(2)
    points = run.output().find(names.MetricGPUProfSMActivity)
    got = {
        (p.attrs["hw.id"], p.attrs.get("nvidia.gpu.mig.gpu_instance.id"), p.value) for p in points
    }
    assert got == {(parent, None, 0.30), (parent, 5, 0.61)}


def test_disabled_gpm_metrics_make_no_gpm_call(nvml_run, helpers):
    run = nvml_run("h100-sxm", helpers.settings(disabled_metrics=frozenset(PROF), **STEADY))
    run.cycle(3)
    assert not {p.metric for p in run.output().points} & set(PROF)
    for fn in ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet"):
        assert run.calls(fn) == 0, fn


def test_a_lost_gpu_frees_its_buffers_and_allocates_afresh_when_back(nvml_run, helpers):
    device = _gpm_device({"SM_UTIL": 50})
    data = {
        "format": 1,
        "devices": [device],
        "events": [
            {"at_cycle": 3, "action": "lose_gpu", "device": 0},
            {"at_cycle": 5, "action": "restore_gpu", "device": 0},
        ],
    }
    run = nvml_run(data, helpers.settings(device_backoff_initial_s=1.0, **STEADY))
    run.cycle(2)
    assert run.drv.gpm_samples_live == 2
    run.cycle()  # cycle 3: lost
    assert run.drv.gpm_samples_live == 0 and run.calls("nvmlGpmSampleFree") == 2
    # probes on back-off: cycle 4 (still lost), cycle 6 (back: new buffers, a first sample)
    run.cycle(4)
    assert run.drv.gpm_samples_live == 2 and run.calls("nvmlGpmSampleAlloc") == 4
    times = [p.time for p in run.output().find(names.MetricGPUProfSMActivity)]
    start = run.drv.scenario.clock.start_unix * 10**9
    assert times == [start + 1 * 10**9, start + 6 * 10**9]  # cycles 2 and 7
    assert run.drv.violations == []


def test_no_gpm_on_a_driver_without_the_symbols(nvml_run, helpers):
    run = nvml_run("old-driver-v100", helpers.settings(**STEADY))
    run.cycle(3)
    assert not {p.metric for p in run.output().points} & set(PROF)
    assert sum(n for (fn, _), n in run.drv.calls.items() if fn.startswith("nvmlGpm")) == 0


@pytest.mark.parametrize("value", [-1.0, 100.5])
def test_a_gpm_ratio_outside_0_100_is_dropped_and_counted(nvml_run, helpers, value):
    # the scenario format rejects such values, so the driver's answer is changed afterwards
    scn = sim.scenario_from_data({"format": 1, "devices": [_gpm_device({"SM_UTIL": 10})]})
    gpm = scn.devices[0].gpm.model_copy(update={"metrics": {2: value}})
    device = scn.devices[0].model_copy(update={"gpm": gpm})
    run = nvml_run(scn.model_copy(update={"devices": [device]}), helpers.settings(**STEADY))
    run.cycle(3)
    assert run.output().find(names.MetricGPUProfSMActivity) == []
    assert run.dropped("out_of_range") == 2


def test_engine_activity_is_off_by_default_and_costs_no_extra_call(nvml_run, helpers):
    run = nvml_run("h100-sxm", helpers.settings(**STEADY))
    run.cycle(3)
    out = run.output()
    assert out.find(names.MetricGPUProfEngineActivity) == []
    assert out.find(names.MetricGPUProfSMActivity) != []
    assert run.calls("nvmlGpmMetricsGet") == 2  # the same single request per tick


def test_gpm_works_below_a_100_ms_interval(nvml_run, helpers):
    """Issue 28 item 5: at a 50 ms interval every pair of consecutive samples was under
    NVML's 100 ms minimum and discarded: nvmlGpmSampleGet every tick, nvmlGpmMetricsGet never,
    no point ever. The older sample is kept until the pair spans 100 ms."""
    ramp = {"pattern": "ramp", "start": 10, "per_s": 20}  # SM_UTIL 10 % at install, +1 % / 50 ms
    data = {
        "format": 1,
        "clock": {"cycle_seconds": 0.05},
        "devices": [_gpm_device({"SM_UTIL": ramp})],
    }
    run = nvml_run(data, helpers.settings(interval_s=0.05, pcie_interval_s=1.0, **STEADY))
    start_ns = run.drv.now_us * 1000
    run.cycle(9)  # ticks at 0, 50, ..., 400 ms
    points = run.output().find(names.MetricGPUProfSMActivity)
    # a pair every other tick, each spanning exactly 100 ms: [0, 100], [100, 200], ...
    assert [(p.time - start_ns) // 1_000_000 for p in points] == [100, 200, 300, 400]
    # the mean of the ramp over each pair: 10 + 20 % / s at the pair's midpoint
    assert [round(p.value, 9) for p in points] == [0.11, 0.13, 0.15, 0.17]
    assert run.calls("nvmlGpmSampleGet", 0) == 9 and run.calls("nvmlGpmMetricsGet") == 4
    assert run.failures() == 0 and run.drv.violations == []


def test_non_finite_gpm_values_are_dropped_and_counted(nvml_run, helpers):
    """A real GPM answer can be NaN or Inf (issue 28 item 9): never emitted, counted as
    gpumetrics.values.dropped{reason=non_finite}; the finite metrics of the same read stay."""
    nan_step = {"pattern": "trace", "values": [40, float("nan"), 40, 40]}
    metrics = {"SM_UTIL": nan_step, "DRAM_BW_UTIL": float("inf"), "GRAPHICS_UTIL": 55}
    run = nvml_run({"format": 1, "devices": [_gpm_device(metrics)]}, helpers.settings(**STEADY))
    run.cycle(4)  # pairs [0 s, 1 s] 40 %, [1, 2] the NaN step, [2, 3] 40 %
    out = run.output()
    assert out.values(names.MetricGPUProfSMActivity) == [0.4, 0.4]
    assert out.find(names.MetricGPUProfDRAMActivity) == []
    assert out.values(names.MetricGPUProfGraphicsEngineActivity) == [0.55] * 3
    assert run.dropped("non_finite") == 1 + 3  # SM_UTIL once, DRAM_BW_UTIL every pair
    assert run.dropped("out_of_range") == 0
