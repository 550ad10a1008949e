"""Field cases F10-F14: handle failures, lost GPUs, driver upgrade, release, late driver."""

import pytest
from gpumetrics.metrics import names
from gpumetrics.nvml.library import EXIT_VERSION_MISMATCH

import nvmlsim as sim

STATUS = names.MetricStatus


def _status(out, hw_id):
    """hw.status per cycle for one device: list of {state: value} in time order."""
    by_time: dict[int, dict[str, int]] = {}
    for p in out.find(STATUS, hw__id=hw_id):
        by_time.setdefault(p.time, {})[p.attrs["hw.state"]] = p.value
    return [by_time[t] for t in sorted(by_time)]


def _current(states):
    return [next(s for s, v in st.items() if v == 1) for st in states]


@pytest.mark.parametrize(
    ("scenario", "prefix", "code"),
    [
        ("F10_handle_failure_unknown", "GPU-f1000000", "UNKNOWN"),
        ("F10_handle_failure_gpu_lost", "GPU-f1b00000", "GPU_IS_LOST"),
    ],
)
def test_F10_one_gpu_without_handle_does_not_stop_the_others(
    nvml_run, helpers, scenario, prefix, code
):
    run = nvml_run(
        scenario, helpers.settings(device_backoff_initial_s=2.0, device_backoff_max_s=8.0)
    )
    run.cycle(8)
    out = run.output()
    healthy = [f"{prefix}-0000-4000-8000-00000000000{i}" for i in (0, 1, 3)]
    for uuid in healthy:
        assert len(out.find(names.MetricGPUMemoryLimit, hw__id=uuid)) == 8
        assert len(out.find(names.MetricTemperature, hw__id=uuid)) == 8
        assert _current(_status(out, uuid)) == ["ok"] * 8
    # GPU 2: keyed by index, failed in every cycle, no other metric
    assert _current(_status(out, "index:2")) == ["failed"] * 8
    assert {p.attrs["hw.id"] for p in out.points if p.scope == "parca.nvidia_gpu_metrics"} == {
        *healthy,
        "index:2",
    }
    assert {p.attrs.get("hw.name") for p in out.find(STATUS, hw__id="index:2")} == {"gpu2"}
    # every state is emitted every cycle (1 for the current, 0 for the rest)
    assert all(
        set(st) == {"ok", "degraded", "failed", "predicted_failure"}
        for st in _status(out, "index:2")
    )
    # retried on back-off (2 s, then 4 s): discovery in cycle 1, probes in cycles 3 and 7
    assert run.calls("nvmlDeviceGetHandleByIndex_v2", 2) == 3
    assert run.errors("nvmlDeviceGetHandleByIndex", code) == 3
    devices = run.self_output()
    assert devices.one("gpumetrics.devices", hw__state="failed").value == 1
    assert devices.one("gpumetrics.devices", hw__state="ok").value == 3


F11_B = "GPU-f1100000-0000-4000-8000-000000000001"


def test_F11_lost_gpu_reports_failed_with_reduced_probing_and_comes_back(nvml_run, helpers):
    run = nvml_run(
        "F11_gpu_lost_and_back",
        helpers.settings(device_backoff_initial_s=2.0, device_backoff_max_s=2.0),
    )
    run.cycle(3)
    first = run.output()
    start = first.find(names.MetricEnergy, hw__id=F11_B)[0].start
    assert _current(_status(first, F11_B)) == ["ok"] * 3
    errors_before = run.errors(code="GPU_IS_LOST")
    run.cycle()  # cycle 4: lost
    calls_before = sum(n for (fn, dev), n in run.drv.calls.items() if dev == 1)
    run.cycle(3)  # cycles 5-7: one probe (cycle 6)
    calls_during = sum(n for (fn, dev), n in run.drv.calls.items() if dev == 1) - calls_before
    lost = run.output()
    assert _current(_status(lost, F11_B)) == ["failed"] * 4
    b_points = [p for p in lost.points if p.attrs.get("hw.id") == F11_B and p.metric != STATUS]
    assert b_points == []  # no metric points while lost
    assert run.errors(code="GPU_IS_LOST") - errors_before == 2  # cycle 4 and the cycle-6 probe
    assert calls_during <= 2  # the probe only: handle by UUID (and its index)
    # the other GPUs never noticed
    assert (
        len(lost.find(names.MetricTemperature, hw__id="GPU-f1100000-0000-4000-8000-000000000000"))
        == 4
    )
    run.cycle(2)  # cycle 8: probe succeeds and the GPU is read in the same cycle
    back = run.output()
    assert _current(_status(back, F11_B)) == ["ok"] * 2
    assert len(back.find(names.MetricTemperature, hw__id=F11_B)) == 2
    energy = back.find(names.MetricEnergy, hw__id=F11_B)
    # restarted from 0 after the reset: a new series start time, no negative delta
    assert energy[0].value < 1001.0 and energy[0].start > start
    assert energy[0].start < energy[0].time


def test_F11_gpu_back_at_a_new_index_keeps_its_uuid(nvml_run, helpers):
    run = nvml_run(
        "F11_gpu_lost_back_at_new_index",
        helpers.settings(device_backoff_initial_s=2.0, device_backoff_max_s=2.0),
    )
    uuid = "GPU-f1200000-0000-4000-8000-000000000001"
    run.cycle(9)
    out = run.output()
    assert _current(_status(out, uuid)) == ["ok"] * 3 + ["failed"] * 4 + ["ok"] * 2
    assert {p.attrs["hw.name"] for p in out.find(names.MetricTemperature, hw__id=uuid)} == {
        "gpu1",
        "gpu3",
    }
    assert len(out.find(names.MetricTemperature, hw__id=uuid)) == 5
    # the GPU that moved to index 1 kept reporting under its own UUID throughout
    other = "GPU-f1200000-0000-4000-8000-000000000003"
    assert len(out.find(names.MetricTemperature, hw__id=other)) == 9


def test_F12_driver_upgrade_reports_nvml_down_and_requests_exit(nvml_run, helpers):
    run = nvml_run(
        "F12_driver_upgraded",
        helpers.settings(
            init_backoff_initial_s=1.0, init_backoff_max_s=1.0, max_version_mismatch_inits=3
        ),
    )
    run.cycle(3)
    assert len(run.output().find(names.MetricTemperature)) == 3
    report = run.cycle()  # cycle 4: every call answers UNINITIALIZED
    assert not report.up and report.reason == "uninitialized"
    out = run.output()
    assert [
        p for p in out.points if p.scope == "parca.nvidia_gpu_metrics"
    ] == []  # no stale metrics
    run.cycle(3)  # cycles 5-7: init answers LIB_RM_VERSION_MISMATCH three times
    up = run.self_output().one("gpumetrics.nvml.up")
    assert up.value == 0 and up.attrs == {"reason": "lib_rm_version_mismatch"}
    assert run.errors("nvmlInit", "LIB_RM_VERSION_MISMATCH") == 3
    assert run.col.exit_requested.is_set() and run.col.exit_code == EXIT_VERSION_MISMATCH
    assert [p for p in run.output().points if p.scope == "parca.nvidia_gpu_metrics"] == []
    calls = sum(run.drv.calls.values())
    run.cycle(2)
    assert sum(run.drv.calls.values()) == calls  # no more init attempts once exit is requested
    # "process restart": a fresh driver and collector give clean data
    run.col.stop(1.0)
    sim.uninstall()
    fresh = nvml_run("F12_driver_upgraded")
    fresh.cycle()
    assert fresh.output().values(names.MetricTemperature) == [38.0]


def test_F13_release_lets_the_gpu_reset_and_resume_collects_again(nvml_run):
    run = nvml_run("F13_reset_blocked_while_initialised")
    run.cycle(2)
    assert run.drv.request_reset(0) == 19  # IN_USE while we hold NVML
    assert run.col.release(1.0)
    assert run.drv.init_count == 0 and run.calls("nvmlShutdown") == 1
    assert run.drv.request_reset(0) == 0
    run.output()
    calls = sum(run.drv.calls.values())
    report = run.cycle(2)
    assert not report.up and report.reason == "released"
    assert sum(run.drv.calls.values()) == calls  # no NVML calls while released
    assert [p for p in run.output().points if p.scope == "parca.nvidia_gpu_metrics"] == []
    up = run.self_output().one("gpumetrics.nvml.up")
    assert up.value == 0 and up.attrs == {"reason": "released"}
    run.col.resume()
    report = run.cycle()
    assert report.up
    out = run.output()
    assert out.values(names.MetricTemperature) == [37.0]
    assert run.drv.init_count == 1
    assert run.drv.violations == []


@pytest.mark.parametrize(
    ("scenario", "reason", "code"),
    [
        ("F14_library_not_found_first_attempts", "library_not_found", "LIBRARY_NOT_FOUND"),
        ("F14_driver_not_loaded_first_attempts", "driver_not_loaded", "DRIVER_NOT_LOADED"),
    ],
)
def test_F14_late_driver_no_crash_loop_then_full_metrics(nvml_run, helpers, scenario, reason, code):
    run = nvml_run(scenario, helpers.settings(init_backoff_initial_s=1.0, init_backoff_max_s=1.0))
    for _ in range(3):
        report = run.cycle()
        assert not report.up and report.reason == reason
        assert not run.col.ready.is_set()
    assert run.errors("nvmlInit", code) == 3
    assert run.calls("nvmlDeviceGetCount_v2") == 0  # nothing probed before a successful init
    assert [p for p in run.output().points if p.scope == "parca.nvidia_gpu_metrics"] == []
    report = run.cycle()
    assert report.up and run.col.ready.is_set()
    out = run.output()
    assert out.values(names.MetricTemperature) == [35.0]
    assert out.values(names.MetricGPUMemoryLimit) == [85520809984]
    assert run.self_output().one("gpumetrics.nvml.up").attrs == {"reason": "ok"}


def test_F14_init_back_off_doubles(nvml_run, helpers):
    run = nvml_run(
        "F14_driver_not_loaded_first_attempts",
        helpers.settings(init_backoff_initial_s=1.0, init_backoff_max_s=4.0),
    )
    run.cycle(7)  # attempts at t=0, 1, 3 (fail), 7 would be next; t=6 is the last cycle here
    assert run.calls("nvmlInitWithFlags") == 3
    run.cycle()  # t=7: the 4th attempt succeeds
    assert run.col.nvml_up()
