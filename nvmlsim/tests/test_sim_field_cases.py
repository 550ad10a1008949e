"""Each field case F01-F26 (README, "Field-case scenarios"): its scenario file loads and
produces the case's trigger through the real nvidia-ml-py functions (F27-F32:
``test_sim_field_reports.py``)."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import pynvml
import pytest

import nvmlsim as sim
from nvmlsim import codes

from .sim_helpers import h0

NO_MIG = 0xFFFFFFFF
GIB = 1 << 30


def _pids(entries: list[Any]) -> list[int]:
    return [p.pid for p in entries]


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker, out


@pytest.fixture
def case(simulate, scenarios_dir) -> Callable[..., sim.SimDriver]:
    def load(stem: str, **kwargs: Any) -> sim.SimDriver:
        return simulate(scenarios_dir / f"{stem}.yaml", **kwargs)

    return load


def test_f01_r535_writes_32_byte_records(case):
    drv = case("F01_r535_32byte_process_records")
    h = h0()
    assert pynvml.nvmlSystemGetDriverVersion() == "535.54.03"
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert (procs[0].pid, procs[0].usedGpuMemory, procs[0].gpuInstanceId) == (5101, 8 * GIB, NO_MIG)
    assert _pids(procs) == [5101, 0, 4294967295]  # the repeating pid, 0, 4294967295 run
    assert procs[1].usedGpuMemory == 5102  # the next record's pid read as memory
    assert pynvml.nvmlDeviceGetConfComputeMemSizeInfo(h).unprotectedMemSizeKib == 83517952
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetRunningProcessDetailList(h, pynvml.nvmlProcessDetailList_v1, 0)
    assert drv.v3_record_bytes == 32


def test_f02_v1_symbol_writes_16_byte_records(case):
    case("F02_v1_symbol_16byte_records")
    h = h0()
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h)
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses")

    def read(struct: type[ctypes.Structure]) -> list[tuple[int, int]]:
        count = ctypes.c_uint(0)
        assert fn(h, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        buf = (struct * count.value)()
        assert fn(h, ctypes.byref(count), buf) == pynvml.NVML_SUCCESS
        return [(buf[i].pid, buf[i].usedGpuMemory) for i in range(count.value)]

    class V1(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

    assert read(V1) == [(6201, 4 * GIB), (6202, GIB), (6203, 512 << 20)]
    shifted = read(pynvml.c_nvmlProcessInfo_v2_t)  # the F02 bug: 24-byte parse of v1 records
    assert shifted[0] == (6201, 4 * GIB)
    assert shifted[1] != (6202, GIB)


def test_f03_memory_v2_version_word(case):
    drv = case("F03_memory_v2_struct_version")
    ok, wsl = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetMemoryInfo(ok, version=2)  # the literal 2 instead of nvmlMemory_v2
    mem = pynvml.nvmlDeviceGetMemoryInfo(ok, version=pynvml.nvmlMemory_v2)
    assert (mem.used, mem.reserved) == (GIB, 300 << 20)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetMemoryInfo(wsl, version=pynvml.nvmlMemory_v2)
    assert pynvml.nvmlDeviceGetMemoryInfo(wsl).used == 2 * GIB + (200 << 20)
    assert drv.call_count("nvmlDeviceGetMemoryInfo_v2") == 3


def test_f04_driver_470_has_no_v3(case):
    case("F04_driver_470_no_v3")
    h = h0()
    for wrapper in (
        pynvml.nvmlDeviceGetComputeRunningProcesses,
        pynvml.nvmlDeviceGetGraphicsRunningProcesses,
    ):
        with pytest.raises(pynvml.NVMLLibraryMismatchError) as raised:
            wrapper(h)
        assert not isinstance(raised.value, pynvml.NVMLError)
    assert _pids(pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h)) == [7401]
    assert _pids(pynvml.nvmlDeviceGetGraphicsRunningProcesses_v2(h)) == [7402]


def test_f04_driver_440_has_neither_v2_nor_v3(case):
    case("F04_driver_440_no_v2")
    h = h0()
    assert pynvml.nvmlSystemGetDriverVersion() == "440.59"
    for fn in (
        pynvml.nvmlDeviceGetComputeRunningProcesses_v2,
        pynvml.nvmlDeviceGetComputeRunningProcesses_v3,
    ):
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            fn(h)
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(h)


def test_f05_driver_535_98_lost_v3(case):
    case("F05_driver_535_98_no_v3")
    h = h0()
    assert pynvml.nvmlSystemGetDriverVersion() == "535.98"
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetComputeRunningProcesses_v3(h)
    assert _pids(pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h)) == [8501, 8502]
    assert _pids(pynvml.nvmlDeviceGetGraphicsRunningProcesses_v2(h)) == [8502]


def test_f06_temperature_v_missing(case):
    case("F06_missing_temperature_v")
    h = h0()
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU)
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 57
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == 0x5


def test_f06_clock_event_reasons_missing(case):
    case("F06_missing_clock_event_reasons")
    h = h0()
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 0x44


def test_f07_energy_not_supported(case):
    drv = case("F07_energy_not_supported")
    h = h0()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 60000
    assert pynvml.nvmlDeviceGetName(h) == "Tesla K80"
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 37
    assert drv.call_count("nvmlDeviceGetTotalEnergyConsumption", 0) == 1


def test_f08_mig_removes_utilisation(case):
    case("F08_mig_utilization_not_supported")
    parent = h0()
    assert pynvml.nvmlDeviceGetMigMode(parent) == [1, 1]
    migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i) for i in (0, 3)]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)  # an empty slot
    for h in (parent, *migs):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetUtilizationRates(h)
        for stype in (1, 2, 3, 4):
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetSamples(h, stype, 0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetProcessUtilization(h, 0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetProcessesUtilizationInfo(h, 0)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetComputeRunningProcesses(parent)
    listed = [
        [
            (p.pid, p.gpuInstanceId, p.computeInstanceId)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        ]
        for h in migs
    ]
    assert listed == [[(8801, 1, 0)], [(8802, 9, 0)]]
    assert pynvml.nvmlDeviceGetPowerUsage(parent) == 210000  # board sensors on the parent


def test_f09_vgpu_guest_lacks_board_sensors(case):
    drv = case("F09_vgpu_guest_sensors")
    h = h0()
    unsupported = [
        ("nvmlDeviceGetTemperature", lambda: pynvml.nvmlDeviceGetTemperature(h, 0)),
        ("nvmlDeviceGetPcieThroughput", lambda: pynvml.nvmlDeviceGetPcieThroughput(h, 0)),
        (
            "nvmlDeviceGetTotalEnergyConsumption",
            lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
        ),
        ("nvmlDeviceGetPowerManagementLimit", lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h)),
        ("nvmlDeviceGetEnforcedPowerLimit", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h)),
    ]
    for symbol, call in unsupported:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()
        assert drv.call_count(symbol, 0) == 1
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 42
    assert pynvml.nvmlDeviceGetMemoryInfo(h).used == 6 * GIB
    assert _pids(pynvml.nvmlDeviceGetComputeRunningProcesses(h)) == [9901]


@pytest.mark.parametrize(
    ("stem", "error"),
    [
        ("F10_handle_failure_unknown", pynvml.NVMLError_Unknown),
        ("F10_handle_failure_gpu_lost", pynvml.NVMLError_GpuIsLost),
    ],
)
def test_f10_one_handle_fails(case, stem, error):
    drv = case(stem)
    assert pynvml.nvmlDeviceGetCount() == 4
    with pytest.raises(error):
        pynvml.nvmlDeviceGetHandleByIndex(2)
    for i in (0, 1, 3):
        assert pynvml.nvmlDeviceGetTemperature(pynvml.nvmlDeviceGetHandleByIndex(i), 0) == 40 + i
    assert drv.call_count("nvmlDeviceGetHandleByIndex_v2", 2) == 1


@pytest.mark.parametrize(
    ("stem", "back_index"),
    [("F11_gpu_lost_and_back", 1), ("F11_gpu_lost_back_at_new_index", 3)],
)
def test_f11_gpu_lost_and_back(case, stem, back_index):
    drv = case(stem)
    lost_uuid = drv.scenario.devices[1].uuid
    old = pynvml.nvmlDeviceGetHandleByIndex(1)
    for _ in range(3):
        assert pynvml.nvmlDeviceGetUUID(old) == lost_uuid
        drv.next_cycle()
    for _ in range(4):  # cycles 4-7
        assert pynvml.nvmlDeviceGetCount() == 4
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetPowerUsage(old)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetHandleByIndex(1)
        assert pynvml.nvmlDeviceGetPowerUsage(pynvml.nvmlDeviceGetHandleByIndex(0)) == 90000
        drv.next_cycle()
    assert drv.cycle == 8
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetPowerUsage(old)
    fresh = pynvml.nvmlDeviceGetHandleByIndex(back_index)
    assert pynvml.nvmlDeviceGetUUID(fresh) == lost_uuid
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(fresh) == 0  # restarted after the reset
    uuids = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(4)]
    assert sorted(uuids) == sorted(d.uuid for d in drv.scenario.devices)
    assert drv.violations == []


def test_f12_upgraded_driver_needs_a_new_process(case, scenarios_dir):
    drv = case("F12_driver_upgraded")
    h = h0()
    for _ in range(3):
        assert pynvml.nvmlDeviceGetTemperature(h, 0) == 38
        drv.next_cycle()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetTemperature(h, 0)
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
        pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
        pynvml.nvmlInit()
    sim.uninstall()  # the "process restart": a fresh driver
    case("F12_driver_upgraded")
    assert pynvml.nvmlDeviceGetTemperature(h0(), 0) == 38


def test_f13_reset_blocked_while_initialised(case):
    drv = case("F13_reset_blocked_while_initialised")
    h = h0()
    drv.advance(10)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == 5_000_000 + 10 * 110_000
    assert drv.request_reset(0) == codes.IN_USE
    pynvml.nvmlShutdown()
    assert drv.request_reset(0) == codes.SUCCESS
    uuid = drv.scenario.devices[0].uuid
    assert drv.reset_log == [(uuid, codes.IN_USE), (uuid, codes.SUCCESS)]
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetTotalEnergyConsumption(h)  # a handle from before the reset
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h0()) == 0
    drv.advance(1)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h0()) == 110_000


def test_f14_library_not_found_for_first_attempts(case):
    drv = case("F14_library_not_found_first_attempts", init=False)
    for _ in range(3):
        with pytest.raises(pynvml.NVMLError_LibraryNotFound):
            pynvml.nvmlInit()
        assert pynvml.nvmlLib is None
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 1
    assert drv.load_attempts == 4
    assert drv.call_count("nvmlInitWithFlags") == 1


def test_f14_driver_not_loaded_for_first_inits(case):
    drv = case("F14_driver_not_loaded_first_attempts", init=False)
    for _ in range(3):
        with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
            pynvml.nvmlInit()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 1
    assert drv.call_count("nvmlInitWithFlags") == 4
    assert drv.init_count == 1


def test_f15_host_pids_have_no_local_name(case):
    case("F15_container_pid_namespace")
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h0())
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(3412001, 4 * GIB), (3412002, 2 * GIB)]
    for pid in (3412001, 3412002):
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlSystemGetProcessName(pid)


def test_f15_local_pid_collision(case):
    case("F15_container_pid_collision")
    assert _pids(pynvml.nvmlDeviceGetComputeRunningProcesses(h0())) == [3412001, 3412002]
    assert pynvml.nvmlSystemGetProcessName(3412002) == "bash"
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlSystemGetProcessName(3412001)


def test_f16_pid_reuse(case):
    drv = case("F16_pid_reuse")
    h = h0()
    seen = []
    for _ in range(3):
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        names = [pynvml.nvmlSystemGetProcessName(p.pid) for p in procs]
        seen.append([(p.pid, n, p.usedGpuMemory) for p, n in zip(procs, names, strict=True)])
        if procs:
            starts = [p["start_time_unix"] for p in drv.live_processes()]
            seen[-1].append(starts)
        drv.next_cycle()
    assert seen == [
        [(4242, "python", 8 * GIB), [1767222000.0]],
        [],
        [(4242, "ffmpeg", GIB), [1767225602.0]],
    ]


def test_f17_gb10_unified_memory(case):
    case("F17_gb10_unified_memory")
    h = h0()
    assert pynvml.nvmlSystemGetDriverVersion() == "580.95.05"
    for call in (
        lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
        lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
        lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h),
        lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
        lambda: pynvml.nvmlDeviceGetPcieThroughput(h, 0),
        lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
        lambda: pynvml.nvmlDeviceGetMigMode(h),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 3000
    assert pynvml.nvmlDeviceGetTemperature(h, 0) == 36
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 208
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == 41_000_000
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(7731, 30064771072)]


def test_f18_discrete_gpu_memory_is_reported(case):
    case("F18_discrete_gpu_memory")
    mem = pynvml.nvmlDeviceGetMemoryInfo(h0(), version=pynvml.nvmlMemory_v2)
    assert (mem.total, mem.used, mem.free) == (8 * GIB, GIB, 7 * GIB)


def test_f19_idle_buffers_are_empty(case):
    drv = case("F19_idle_empty_sample_buffers")
    h = h0()
    drv.advance(5)
    for stype in (pynvml.NVML_GPU_UTILIZATION_SAMPLES, pynvml.NVML_MEMORY_UTILIZATION_SAMPLES):
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetSamples(h, stype, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    util = pynvml.nvmlDeviceGetUtilizationRates(h)
    assert (util.gpu, util.memory) == (0, 0)


def test_f20_lists_grow_between_sizing_and_data_call(case):
    drv = case("F20_process_list_growth")
    h = h0()
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert len(procs) == 20
    drv.advance(1)
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    samples = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    assert sorted(s.pid for s in samples) == [2001, 2002, 2003, 2004, 2005, 2006]
    assert drv.call_count("nvmlDeviceGetComputeRunningProcesses_v3", 0) == 4


def test_f21_slow_pcie_slow_call_and_hang(case):
    drv = case("F21_slow_and_hung_calls")
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    before = drv.now_us
    assert pynvml.nvmlDeviceGetPcieThroughput(handles[0], 0) == 1000
    assert drv.now_us - before == 20_000  # the built-in 20 ms, in simulated time
    drv.next_cycle(4)  # cycle 5
    before = drv.now_us
    pynvml.nvmlDeviceGetProcessUtilization(handles[0], 0)
    assert drv.now_us == before
    pynvml.nvmlDeviceGetProcessUtilization(handles[3], 0)
    assert drv.now_us - before == 8_000_000
    assert drv.cycle == 13  # 8 s of simulated time went by inside the call
    drv.next_cycle()  # from cycle 7 on, every call on GPU 2 hangs
    worker, out = _in_thread(lambda: pynvml.nvmlDeviceGetPowerUsage(handles[2]))
    assert drv.wait_until_held(1, timeout_s=10)
    assert pynvml.nvmlDeviceGetPowerUsage(handles[1]) == 150000  # other GPUs unaffected
    drv.release_hangs()
    worker.join(timeout=10)
    assert out == [150000]
    assert drv.violations == []


def test_f21_slow_init_blocks_until_the_clock_moves(case):
    drv = case("F21_slow_init", init=False, latency="block")
    worker, out = _in_thread(pynvml.nvmlInit)
    assert drv.wait_until_held(1, timeout_s=10)
    assert drv.init_count == 0
    drv.advance(90)
    worker.join(timeout=10)
    assert out == [None]
    assert drv.init_count == 1
    assert pynvml.nvmlDeviceGetCount() == 1


def test_f22_strict_shutdown_during_call(case):
    drv = case("F22_shutdown_race")
    h = h0()
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == 1_000_000
    drv.next_cycle()  # from cycle 2 the energy call hangs
    worker, out = _in_thread(lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
    assert drv.wait_until_held(1, timeout_s=10)
    pynvml.nvmlShutdown()
    assert [v.kind for v in drv.violations] == ["shutdown_during_call"]
    drv.release_hangs()
    worker.join(timeout=10)
    assert isinstance(out[0], pynvml.NVMLError_Uninitialized)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    assert [v.kind for v in drv.violations] == ["shutdown_during_call", "call_while_uninitialized"]


def test_f23_energy_counter_resets(case):
    drv = case("F23_energy_counter_reset")
    h = h0()
    readings = []
    for _ in range(5):
        readings.append(pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
        drv.next_cycle()
    assert readings == [1_000_000, 1_000_000, 1_250_000, 3_000, 9_000]


def test_f24_garbage_values(case):
    drv = case("F24_garbage_utilization")
    h = h0()
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 808334905
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 57  # only once
    drv.advance(1)
    vtype, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert {s.sampleValue.uiVal for s in samples} == {57}
    assert {s.sampleValue.ullVal for s in samples} == {57 + (0x5A5A5A5A << 32)}
    util = {s.pid: s.smUtil for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0)}
    assert util == {2401: 40, 2402: 4294967295}


def test_f25_pcie_directions(case):
    case("F25_pcie_directions", latency="off")
    h = h0()
    assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES) == 1200
    assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES) == 34000
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_COUNT)


def test_f26_non_utf8_names(case):
    case("F26_non_utf8_names")
    h = h0()
    with pytest.raises(UnicodeDecodeError):
        pynvml.nvmlDeviceGetName(h)
    with pytest.raises(UnicodeDecodeError):
        pynvml.nvmlSystemGetProcessName(77)
    assert pynvml.nvmlDeviceGetUUID(h) == "GPU-f2600000-0000-4000-8000-000000000001"
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetName")
    buf = ctypes.create_string_buffer(96)
    assert fn(h, buf, ctypes.c_uint(96)) == pynvml.NVML_SUCCESS
    assert buf.value == b"\xf8\x01NVIDIA"
