"""Field cases F27-F32 through the real nvidia-ml-py, and the fidelity gaps found with them.

The gaps: a handle check that aborts the process (``driver.invalid_handle: abort``), driver
profiles 495/515/560/595, sample buffers with a phase, a library that is never present, a
device whose process lists are unsupported, the wall clock's boot origin, and the docs tables
that list profiles and field cases.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pynvml
import pytest

import nvmlsim as sim
from nvmlsim import codes
from nvmlsim.driver_profiles import DRIVER_PROFILES

from .sim_helpers import h0, one_gpu

START_US = 1_767_225_600_000_000
README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture
def case(simulate, scenarios_dir):
    def load(stem: str, **kwargs):
        return simulate(scenarios_dir / f"{stem}.yaml", **kwargs)

    return load


def test_f27_samples_only_for_processes_with_non_zero_utilisation(case):
    drv = case("F27_idle_process_zero_utilization")
    h = h0()
    drv.next_cycle()  # cycle 2: the cursor becomes B's sample at 0.5 s
    cursor = max(s.timeStamp for s in pynvml.nvmlDeviceGetProcessesUtilizationInfo(h, 0))
    assert cursor == START_US + 500_000
    drv.next_cycle()  # cycle 3
    samples = pynvml.nvmlDeviceGetProcessesUtilizationInfo(h, cursor)
    assert [(s.pid, s.timeStamp - START_US, s.smUtil) for s in samples] == [
        (2701, 1_200_000, 90),
        (2702, 1_500_000, 10),
    ]  # C's last sample (0.3 s) is older than the cursor; D never had one
    running = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    assert running == [2701, 2702, 2704]


def test_f28_process_memory_not_available(case):
    case("F28_process_memory_not_available")
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h0())
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(3801, None), (3802, None)]
    assert pynvml.nvmlSystemGetDriverVersion() == "566.36"


def test_f29_reserved_memory_in_v2_only(case):
    case("F29_reserved_memory_v2")
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h0(), version=pynvml.nvmlMemory_v2)
    assert (v2.used, v2.reserved) == (1 << 30, 300 << 20)
    assert pynvml.nvmlDeviceGetMemoryInfo(h0()).used == (1 << 30) + (300 << 20)


@pytest.mark.parametrize("name", ["F30_jetson_no_supported_telemetry", "jetson-orin"])
def test_f30_jetson_answers_not_supported_to_telemetry(simulate, scenarios_dir, name):
    simulate(name)
    assert pynvml.nvmlDeviceGetCount() == 1
    h = h0()
    assert pynvml.nvmlDeviceGetName(h) == "Orin (nvgpu)"
    assert pynvml.nvmlDeviceGetUUID(h).startswith("GPU-")
    assert pynvml.nvmlSystemGetDriverVersion() == "540.4.0"
    for call in (
        lambda: pynvml.nvmlDeviceGetPowerUsage(h),
        lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
        lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
        lambda: pynvml.nvmlDeviceGetTemperature(h, 0),
        lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
        lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
        lambda: pynvml.nvmlDeviceGetClockInfo(h, 0),
        lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
        lambda: pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h),
        lambda: pynvml.nvmlDeviceGetGraphicsRunningProcesses(h),
        lambda: pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h),
        lambda: pynvml.nvmlDeviceGetProcessUtilization(h, 0),
        lambda: pynvml.nvmlDeviceGetMigMode(h),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()


def test_process_lists_false_rejects_processes_naming_the_field():
    with pytest.raises(sim.ScenarioError, match=r"devices\[0\].*process_lists: false"):
        sim.scenario_from_data(one_gpu(process_lists=False, processes=[{"pid": 5}]))


def test_f31_boot_clock_under_the_wall_clock_is_the_hosts():
    drv = sim.install(sim.load_scenario("F31_boot_clock_samples"), clock=sim.WallClock())
    try:
        pynvml.nvmlInit()
        _, samples = pynvml.nvmlDeviceGetSamples(h0(), pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        boottime_us = time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1000
        newest = samples[-1].timeStamp
        # µs since this host booted: at most now, and within one sample period of it
        assert boottime_us - 166_667 - 1_000_000 <= newest <= boottime_us
        assert drv.sample_origin_us == drv.timeline.boot_us
    finally:
        sim.uninstall()


def test_f32_access_revoked_for_good_but_shutdown_releases(case):
    drv = case("F32_device_access_revoked")
    h = h0()
    assert pynvml.nvmlDeviceGetTemperature(h, 0) == 39
    drv.next_cycle(3)  # cycle 4
    for call in (
        lambda: pynvml.nvmlDeviceGetTemperature(h, 0),
        pynvml.nvmlDeviceGetCount,
        lambda: pynvml.nvmlDeviceGetHandleByIndex(1),
    ):
        with pytest.raises(pynvml.NVMLError_Unknown):
            call()
    pynvml.nvmlShutdown()
    assert drv.init_count == 0
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()  # "Failed to initialize NVML: Unknown Error"
    drv.next_cycle(20)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()  # never recovers


# --- driver profiles from the bindings' symbol history ---------------------------------------
@pytest.mark.parametrize(
    ("profile", "present", "absent"),
    [
        (
            "495",
            ["nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetMigMode"],
            [
                "nvmlDeviceGetComputeRunningProcesses_v3",
                "nvmlDeviceGetMemoryInfo_v2",
                "nvmlDeviceGetCurrentClocksEventReasons",
            ],
        ),
        (
            "515",
            ["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMemoryInfo_v2"],
            [
                "nvmlDeviceGetConfComputeMemSizeInfo",
                "nvmlDeviceGetCurrentClocksEventReasons",
                "nvmlDeviceGetTemperatureV",
            ],
        ),
        (
            "560",
            [
                "nvmlDeviceGetProcessesUtilizationInfo",
                "nvmlDeviceGetRunningProcessDetailList",
                "nvmlDeviceGetCurrentClocksEventReasons",
            ],
            ["nvmlDeviceGetTemperatureV"],
        ),
        (
            "595",
            ["nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksThrottleReasons"],
            [],
        ),
    ],
)
def test_new_driver_profiles_export_what_their_binding_calls(simulate, profile, present, absent):
    simulate(one_gpu(driver={"profile": profile}))
    version = DRIVER_PROFILES[profile].version
    assert pynvml.nvmlSystemGetDriverVersion() == version
    for symbol in present:
        pynvml._nvmlGetFunctionPointer(symbol)
    for symbol in absent:
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml._nvmlGetFunctionPointer(symbol)


def test_bad_struct_version_code_follows_the_branch(simulate):
    simulate(one_gpu(driver={"profile": "515"}, memory={"total_bytes": 1 << 30}))
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):  # 13 before R550 (F03)
        pynvml.nvmlDeviceGetMemoryInfo(h0(), version=2)
    sim.uninstall()
    simulate(one_gpu(driver={"profile": "595"}, memory={"total_bytes": 1 << 30}))
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(h0(), version=2)


# --- sample buffers with a phase ---------------------------------------------------------
def test_sample_buffer_phase_offsets_every_timestamp(simulate):
    drv = simulate(
        one_gpu(
            utilization={"gpu": 30},
            samples={"gpu_utilization": {"period_us": 100_000, "phase_us": 37_000}},
        )
    )
    drv.advance(0.5)
    _, samples = pynvml.nvmlDeviceGetSamples(h0(), pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    stamps = [s.timeStamp - START_US for s in samples]
    assert stamps[-5:] == [37_000, 137_000, 237_000, 337_000, 437_000]
    _, newer = pynvml.nvmlDeviceGetSamples(
        h0(), pynvml.NVML_GPU_UTILIZATION_SAMPLES, START_US + 237_000
    )
    assert [s.timeStamp - START_US for s in newer] == [337_000, 437_000]  # strictly newer


def test_sample_phase_must_lie_inside_the_period():
    with pytest.raises(sim.ScenarioError, match=r"samples\.gpu_utilization.*phase_us"):
        sim.scenario_from_data(
            one_gpu(samples={"gpu_utilization": {"period_us": 1000, "phase_us": 1000}})
        )


# --- a library that is never present ----------------------------------------------------------
def test_library_never_present(simulate):
    drv = simulate(one_gpu(driver={"library_present": False}), init=False)
    for _ in range(50):
        with pytest.raises(pynvml.NVMLError_LibraryNotFound):
            pynvml.nvmlInit()
    assert drv.load_attempts == 50 and drv.init_count == 0


# --- the handle check that aborts, as the real library crashes -------------------------------
_ABORT = textwrap.dedent(
    """
    import ctypes, sys
    import pynvml, nvmlsim
    gpu = {"uuid": "GPU-00000000-0000-4000-8000-000000000000", "power": {"usage_mw": 5}}
    data = {"driver": {"invalid_handle": "abort"}, "devices": [gpu]}
    drv = nvmlsim.install(nvmlsim.scenario_from_data(data))
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 5
    drv.trigger("restore_gpu", device=0)  # h is now stale: its code, no abort
    try:
        pynvml.nvmlDeviceGetPowerUsage(h)
    except pynvml.NVMLError_InvalidArgument:
        print("stale answered", flush=True)
    bogus = {bogus}
    pynvml.nvmlDeviceGetPowerUsage(bogus)
    print("not reached", flush=True)
    """
)


@pytest.mark.parametrize(
    "bogus",
    ["pynvml.c_nvmlDevice_t()", "ctypes.cast(ctypes.c_void_p(0xDEAD0000), pynvml.c_nvmlDevice_t)"],
)
def test_invalid_handle_abort_ends_the_process(bogus):
    proc = subprocess.run(
        [sys.executable, "-c", _ABORT.replace("{bogus}", bogus)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGABRT, proc.stderr
    assert proc.stdout.splitlines() == ["stale answered"]
    assert "NULL or never-issued device handle" in proc.stderr
    assert "nvmlDeviceGetPowerUsage" in proc.stderr


def test_invalid_handle_default_is_a_recorded_violation(simulate):
    drv = simulate(one_gpu(power={"usage_mw": 5}))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetPowerUsage(pynvml.c_nvmlDevice_t())
    assert [v.kind for v in drv.violations] == ["invalid_handle"]
    assert codes.INVALID_ARGUMENT == pynvml.NVML_ERROR_INVALID_ARGUMENT


# --- the README's tables list what ships ---------------------------------------------------
def _table_first_cells(heading: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)`", section, re.M)


def test_readme_lists_every_driver_profile_and_built_in_profile():
    assert [c.split(" ")[0] for c in _table_first_cells("Driver profiles")] == list(DRIVER_PROFILES)
    assert sorted(_table_first_cells("Built-in profiles")) == sorted(sim.list_profiles())


def test_readme_lists_every_field_case_file():
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Field-case scenarios", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`(F\d\d_[a-z0-9_]+)\.yaml`", section))
    assert listed == set(sim.list_field_cases())
