"""Per-process accounting (mode, buffer size, pids, stats) through the real pynvml wrappers."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from nvmlsim.symbols.accounting import ACCOUNTING_STATS

from .sim_helpers import MIG_DEVICE, h0, one_gpu


def test_stats_layout_agrees_with_the_binding():
    assert ACCOUNTING_STATS.size == ctypes.sizeof(pynvml.c_nvmlAccountingStats_t)


def _gpu(mode="enabled", buffer_size=4000, processes=(), **extra):
    return one_gpu(
        clock={"cycle_seconds": 1.0},
        accounting={"mode": mode, "buffer_size": buffer_size},
        processes=list(processes),
        **extra,
    )


def _scenario(**kwargs):
    data = _gpu(**kwargs)
    data["clock"] = data["devices"][0].pop("clock")
    return data


def test_a_device_without_accounting_answers_not_supported(simulate):
    simulate(one_gpu())
    for call in (
        pynvml.nvmlDeviceGetAccountingMode,
        pynvml.nvmlDeviceGetAccountingBufferSize,
        pynvml.nvmlDeviceGetAccountingPids,
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(h0())
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetAccountingStats(h0(), 10)


def test_unsupported_mode_answers_not_supported(simulate):
    simulate(_scenario(mode="unsupported"))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetAccountingMode(h0())


def test_disabled_mode_reads_disabled_and_refuses_pids_and_stats(simulate):
    simulate(_scenario(mode="disabled", processes=[{"pid": 10}]))
    assert pynvml.nvmlDeviceGetAccountingMode(h0()) == pynvml.NVML_FEATURE_DISABLED
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetAccountingPids(h0())
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetAccountingStats(h0(), 10)


def test_enabled_mode_buffer_size_and_a_running_process(simulate):
    drv = simulate(
        _scenario(
            buffer_size=16,
            processes=[{"pid": 10, "used_memory_bytes": 5000, "utilization": {"sm": 40, "mem": 7}}],
        )
    )
    assert pynvml.nvmlDeviceGetAccountingMode(h0()) == pynvml.NVML_FEATURE_ENABLED
    assert pynvml.nvmlDeviceGetAccountingBufferSize(h0()) == 16
    assert pynvml.nvmlDeviceGetAccountingPids(h0()) == [10]
    s = pynvml.nvmlDeviceGetAccountingStats(h0(), 10)
    assert (s.gpuUtilization, s.memoryUtilization, s.maxMemoryUsage) == (40, 7, 5000)
    assert s.isRunning == 1
    assert s.time == 0  # NVML: 0 while the process runs
    assert s.startTime == drv.world.timeline.start_us - 3_600_000_000
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetAccountingStats(h0(), 11)


def test_a_short_lived_process_is_kept_with_its_run_time(simulate):
    # runs from 1.2 s to 1.7 s after install: between two 1 s collections
    drv = simulate(_scenario(processes=[{"pid": 20, "from_s": 1.2, "until_s": 1.7}]))
    assert pynvml.nvmlDeviceGetAccountingPids(h0()) == []  # not started yet
    drv.advance(2.0)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h0()) == []  # gone from the lists
    assert pynvml.nvmlDeviceGetAccountingPids(h0()) == [20]
    s = pynvml.nvmlDeviceGetAccountingStats(h0(), 20)
    assert (s.isRunning, s.time) == (0, 500)
    assert s.startTime == drv.world.timeline.start_us + 1_200_000


def test_pid_reuse_answers_the_newest_process_only(simulate):
    drv = simulate(
        _scenario(
            processes=[
                {"pid": 30, "until_s": 1.0, "used_memory_bytes": 100},
                {"pid": 30, "from_s": 1.5, "used_memory_bytes": 200},
            ]
        )
    )
    drv.advance(1.2)
    s = pynvml.nvmlDeviceGetAccountingStats(h0(), 30)
    assert (s.isRunning, s.maxMemoryUsage) == (0, 100)
    drv.advance(0.5)
    assert pynvml.nvmlDeviceGetAccountingPids(h0()) == [30]  # listed once
    s = pynvml.nvmlDeviceGetAccountingStats(h0(), 30)
    assert (s.isRunning, s.maxMemoryUsage, s.time) == (1, 200, 0)
    assert s.startTime == drv.world.timeline.start_us + 1_500_000


def test_the_circular_buffer_keeps_the_newest_processes(simulate):
    procs = [{"pid": 40 + k, "from_s": 0.1 * k, "until_s": 0.1 * k + 0.05} for k in range(1, 6)]
    drv = simulate(_scenario(buffer_size=3, processes=procs))
    drv.advance(1.0)
    assert pynvml.nvmlDeviceGetAccountingPids(h0()) == [43, 44, 45]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetAccountingStats(h0(), 41)  # overwritten by newer processes


def test_too_small_a_pid_array_is_insufficient_size(simulate):
    simulate(_scenario(processes=[{"pid": 50}, {"pid": 51}]))
    count = ctypes.c_uint(1)
    pids = (ctypes.c_uint * 1)()
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetAccountingPids")  # noqa: SLF001
    assert fn(h0(), ctypes.byref(count), pids) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2


def test_a_process_added_at_run_time_starts_then(simulate):
    drv = simulate(_scenario())
    drv.advance(3.0)
    drv.add_process(0, 60, used_memory_bytes=10)
    s = pynvml.nvmlDeviceGetAccountingStats(h0(), 60)
    assert s.startTime == drv.world.timeline.start_us + 3_000_000
    drv.advance(0.25)
    drv.remove_process(0, 60)
    assert pynvml.nvmlDeviceGetAccountingStats(h0(), 60).time == 250


def test_mig_enabled_gpu_answers_not_supported(simulate):
    device = dict(MIG_DEVICE, accounting={"mode": "enabled"})
    simulate({"devices": [device]})
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetAccountingMode(h0())


def test_a_bad_mode_names_the_field():
    import nvmlsim

    with pytest.raises(nvmlsim.ScenarioError, match=r"devices\[0\]\.accounting\.mode"):
        nvmlsim.scenario_from_data(_scenario(mode="on"))
