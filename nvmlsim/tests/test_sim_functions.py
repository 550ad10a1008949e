"""Every pynvml function the collectors call returns the scenario's value, raises pynvml's own
exception for an injected return code, and FunctionNotFound (or NVMLLibraryMismatchError for
the unversioned process wrappers) when the driver lacks the symbol.

The calls below are the real nvidia-ml-py 13.615.71 functions; nothing in pynvml is patched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml
import pytest

import nvmlsim as sim
from nvmlsim import codes

from .sim_helpers import MIG_UUID, UUID0, UUID1, full_scenario, handle_value


@dataclass
class Handles:
    gpu: Any
    mig_parent: Any
    mig: Any


def _handles() -> Handles:
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)
    return Handles(gpu, parent, pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0))


def _procs(entries: list[Any]) -> list[tuple[int, int | None, int, int]]:
    return [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in entries]


def _raw_v1(h: Any) -> list[tuple[int, int]]:
    """Call the unversioned 16-byte C symbol directly, as a v1 fallback would."""
    import ctypes

    class V1(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses")
    count = ctypes.c_uint(0)
    ret = fn(h, ctypes.byref(count), None)
    if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
        raise pynvml.NVMLError(ret)
    buf = (V1 * count.value)()
    pynvml._nvmlCheckReturn(fn(h, ctypes.byref(count), buf))
    return [(buf[i].pid, buf[i].usedGpuMemory) for i in range(count.value)]


NA = None  # what pynvml makes of NVML_VALUE_NOT_AVAILABLE
NO_MIG = 0xFFFFFFFF

# (id, C symbol, call, expected value, exception for a missing symbol)
CASES: list[tuple[str, str, Callable[[Handles], Any], Any, type[BaseException]]] = [
    (
        "driver_version",
        "nvmlSystemGetDriverVersion",
        lambda h: pynvml.nvmlSystemGetDriverVersion(),
        "570.172.08",
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "cuda_version",
        "nvmlSystemGetCudaDriverVersion",
        lambda h: pynvml.nvmlSystemGetCudaDriverVersion(),
        12080,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "cuda_version_v2",
        "nvmlSystemGetCudaDriverVersion_v2",
        lambda h: pynvml.nvmlSystemGetCudaDriverVersion_v2(),
        12080,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "nvml_version",
        "nvmlSystemGetNVMLVersion",
        lambda h: pynvml.nvmlSystemGetNVMLVersion(),
        "12.570.172.08",
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "process_name",
        "nvmlSystemGetProcessName",
        lambda h: pynvml.nvmlSystemGetProcessName(101),
        "python",
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "count",
        "nvmlDeviceGetCount_v2",
        lambda h: pynvml.nvmlDeviceGetCount(),
        2,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "handle_by_index",
        "nvmlDeviceGetHandleByIndex_v2",
        lambda h: pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(1)),
        UUID1,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "handle_by_uuid",
        "nvmlDeviceGetHandleByUUID",
        lambda h: handle_value(pynvml.nvmlDeviceGetHandleByUUID(UUID0)) == handle_value(h.gpu),
        True,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "handle_by_mig_uuid",
        "nvmlDeviceGetHandleByUUID",
        lambda h: handle_value(pynvml.nvmlDeviceGetHandleByUUID(MIG_UUID)) == handle_value(h.mig),
        True,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "uuid",
        "nvmlDeviceGetUUID",
        lambda h: pynvml.nvmlDeviceGetUUID(h.gpu),
        UUID0,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "uuid_mig",
        "nvmlDeviceGetUUID",
        lambda h: pynvml.nvmlDeviceGetUUID(h.mig),
        MIG_UUID,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "name",
        "nvmlDeviceGetName",
        lambda h: pynvml.nvmlDeviceGetName(h.gpu),
        "NVIDIA H100 80GB HBM3",
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "serial",
        "nvmlDeviceGetSerial",
        lambda h: pynvml.nvmlDeviceGetSerial(h.gpu),
        "1654123001234",
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "board_part_number",
        "nvmlDeviceGetBoardPartNumber",
        lambda h: pynvml.nvmlDeviceGetBoardPartNumber(h.gpu),
        "692-2G520-0200-000",
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "vbios",
        "nvmlDeviceGetVbiosVersion",
        lambda h: pynvml.nvmlDeviceGetVbiosVersion(h.gpu),
        "96.00.99.00.01",
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "pci_info",
        "nvmlDeviceGetPciInfo_v3",
        lambda h: (
            lambda p: (
                p.busId,
                p.busIdLegacy,
                p.domain,
                p.bus,
                p.device,
                p.pciDeviceId,
                p.pciSubSystemId,
            )
        )(pynvml.nvmlDeviceGetPciInfo(h.gpu)),
        ("00000000:18:00.0", "0000:18:00.0", 0, 0x18, 0, 0x233010DE, 0x16C110DE),
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "pci_info_v3",
        "nvmlDeviceGetPciInfo_v3",
        lambda h: pynvml.nvmlDeviceGetPciInfo_v3(h.gpu).busId,
        "00000000:18:00.0",
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "minor_number",
        "nvmlDeviceGetMinorNumber",
        lambda h: pynvml.nvmlDeviceGetMinorNumber(h.gpu),
        4,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "index",
        "nvmlDeviceGetIndex",
        lambda h: pynvml.nvmlDeviceGetIndex(h.mig_parent),
        1,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "memory_v1",
        "nvmlDeviceGetMemoryInfo",
        lambda h: (lambda m: (m.total, m.used, m.free))(pynvml.nvmlDeviceGetMemoryInfo(h.gpu)),
        (85520809984, 1024, 85520809984 - 1024),
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "memory_v2",
        "nvmlDeviceGetMemoryInfo_v2",
        lambda h: (lambda m: (m.version, m.total, m.reserved, m.used, m.free))(
            pynvml.nvmlDeviceGetMemoryInfo(h.gpu, version=pynvml.nvmlMemory_v2)
        ),
        (pynvml.nvmlMemory_v2, 85520809984, 24, 1000, 85520809984 - 1024),
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "memory_mig",
        "nvmlDeviceGetMemoryInfo",
        lambda h: pynvml.nvmlDeviceGetMemoryInfo(h.mig).total,
        20937965568,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "power",
        "nvmlDeviceGetPowerUsage",
        lambda h: pynvml.nvmlDeviceGetPowerUsage(h.gpu),
        123456,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "enforced_limit",
        "nvmlDeviceGetEnforcedPowerLimit",
        lambda h: pynvml.nvmlDeviceGetEnforcedPowerLimit(h.gpu),
        650000,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "management_limit",
        "nvmlDeviceGetPowerManagementLimit",
        lambda h: pynvml.nvmlDeviceGetPowerManagementLimit(h.gpu),
        700000,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "energy",
        "nvmlDeviceGetTotalEnergyConsumption",
        lambda h: pynvml.nvmlDeviceGetTotalEnergyConsumption(h.gpu),
        987654321,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "temperature",
        "nvmlDeviceGetTemperature",
        lambda h: pynvml.nvmlDeviceGetTemperature(h.gpu, pynvml.NVML_TEMPERATURE_GPU),
        47,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "temperature_v",
        "nvmlDeviceGetTemperatureV",
        lambda h: pynvml.nvmlDeviceGetTemperatureV(h.gpu, pynvml.NVML_TEMPERATURE_GPU),
        47,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "clock_info",
        "nvmlDeviceGetClockInfo",
        lambda h: [pynvml.nvmlDeviceGetClockInfo(h.gpu, t) for t in range(4)],
        [1111, 1222, 2619, 1555],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "pcie_throughput",
        "nvmlDeviceGetPcieThroughput",
        lambda h: [pynvml.nvmlDeviceGetPcieThroughput(h.gpu, c) for c in (0, 1)],
        [1200, 34000],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "utilization_rates",
        "nvmlDeviceGetUtilizationRates",
        lambda h: (lambda u: (u.gpu, u.memory))(pynvml.nvmlDeviceGetUtilizationRates(h.gpu)),
        (57, 21),
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "encoder",
        "nvmlDeviceGetEncoderUtilization",
        lambda h: pynvml.nvmlDeviceGetEncoderUtilization(h.gpu),
        [7, 167000],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "decoder",
        "nvmlDeviceGetDecoderUtilization",
        lambda h: pynvml.nvmlDeviceGetDecoderUtilization(h.gpu),
        [9, 200000],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "samples",
        "nvmlDeviceGetSamples",
        lambda h: (lambda r: (r[0], {s.sampleValue.uiVal for s in r[1]}, len(r[1]) > 0))(
            pynvml.nvmlDeviceGetSamples(h.gpu, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        ),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, {57}, True),
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "ecc",
        "nvmlDeviceGetTotalEccErrors",
        lambda h: [pynvml.nvmlDeviceGetTotalEccErrors(h.gpu, e, c) for c in (0, 1) for e in (0, 1)],
        [1, 2, 3, 4],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "fan",
        "nvmlDeviceGetFanSpeed",
        lambda h: pynvml.nvmlDeviceGetFanSpeed(h.gpu),
        33,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "pstate",
        "nvmlDeviceGetPerformanceState",
        lambda h: pynvml.nvmlDeviceGetPerformanceState(h.gpu),
        2,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "event_reasons",
        "nvmlDeviceGetCurrentClocksEventReasons",
        lambda h: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h.gpu),
        0x44,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "throttle_reasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        lambda h: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h.gpu),
        0x44,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "mig_mode",
        "nvmlDeviceGetMigMode",
        lambda h: (pynvml.nvmlDeviceGetMigMode(h.gpu), pynvml.nvmlDeviceGetMigMode(h.mig_parent)),
        ([0, 0], [1, 1]),
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "max_mig_count",
        "nvmlDeviceGetMaxMigDeviceCount",
        lambda h: (
            pynvml.nvmlDeviceGetMaxMigDeviceCount(h.gpu),
            pynvml.nvmlDeviceGetMaxMigDeviceCount(h.mig_parent),
        ),
        (0, 7),
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "mig_handle_by_index",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        lambda h: pynvml.nvmlDeviceGetUUID(
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h.mig_parent, 0)
        ),
        MIG_UUID,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "is_mig_handle",
        "nvmlDeviceIsMigDeviceHandle",
        lambda h: (
            pynvml.nvmlDeviceIsMigDeviceHandle(h.mig).value,
            pynvml.nvmlDeviceIsMigDeviceHandle(h.gpu).value,
        ),
        (1, 0),
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "gpu_instance_id",
        "nvmlDeviceGetGpuInstanceId",
        lambda h: pynvml.nvmlDeviceGetGpuInstanceId(h.mig),
        1,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "compute_instance_id",
        "nvmlDeviceGetComputeInstanceId",
        lambda h: pynvml.nvmlDeviceGetComputeInstanceId(h.mig),
        0,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "parent_handle",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        lambda h: pynvml.nvmlDeviceGetUUID(
            pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h.mig)
        ),
        UUID1,
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "compute_procs",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        lambda h: _procs(pynvml.nvmlDeviceGetComputeRunningProcesses(h.gpu)),
        [(101, 1000, NO_MIG, NO_MIG)],
        pynvml.NVMLLibraryMismatchError,
    ),
    (
        "compute_procs_v3",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        lambda h: _procs(pynvml.nvmlDeviceGetComputeRunningProcesses_v3(h.gpu)),
        [(101, 1000, NO_MIG, NO_MIG)],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "compute_procs_v2",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        lambda h: _procs(pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h.gpu)),
        [(101, 1000, NO_MIG, NO_MIG)],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "compute_procs_mig",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        lambda h: _procs(pynvml.nvmlDeviceGetComputeRunningProcesses(h.mig)),
        [(201, 1048576, 1, 0)],
        pynvml.NVMLLibraryMismatchError,
    ),
    (
        "compute_procs_raw_v1",
        "nvmlDeviceGetComputeRunningProcesses",
        lambda h: _raw_v1(h.gpu),
        [(101, 1000)],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "graphics_procs",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        lambda h: _procs(pynvml.nvmlDeviceGetGraphicsRunningProcesses(h.gpu)),
        [(102, NA, NO_MIG, NO_MIG)],
        pynvml.NVMLLibraryMismatchError,
    ),
    (
        "graphics_procs_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        lambda h: _procs(pynvml.nvmlDeviceGetGraphicsRunningProcesses_v3(h.gpu)),
        [(102, NA, NO_MIG, NO_MIG)],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "graphics_procs_v2",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        lambda h: _procs(pynvml.nvmlDeviceGetGraphicsRunningProcesses_v2(h.gpu)),
        [(102, NA, NO_MIG, NO_MIG)],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "mps_procs",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        lambda h: _procs(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h.gpu)),
        [(103, 3000, NO_MIG, NO_MIG)],
        pynvml.NVMLLibraryMismatchError,
    ),
    (
        "mps_procs_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        lambda h: _procs(pynvml.nvmlDeviceGetMPSComputeRunningProcesses_v3(h.gpu)),
        [(103, 3000, NO_MIG, NO_MIG)],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "mps_procs_v2",
        "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        lambda h: _procs(pynvml.nvmlDeviceGetMPSComputeRunningProcesses_v2(h.gpu)),
        [(103, 3000, NO_MIG, NO_MIG)],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "detail_list",
        "nvmlDeviceGetRunningProcessDetailList",
        lambda h: [
            (p.pid, p.usedGpuMemory, p.usedGpuCcProtectedMemory)
            for p in pynvml.nvmlDeviceGetRunningProcessDetailList(
                h.gpu, pynvml.nvmlProcessDetailList_v1, 0
            )
        ],
        [(101, 1000, 0)],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "process_utilization",
        "nvmlDeviceGetProcessUtilization",
        lambda h: [(s.pid, s.smUtil) for s in pynvml.nvmlDeviceGetProcessUtilization(h.gpu, 0)],
        [(101, 40)],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "processes_utilization_info",
        "nvmlDeviceGetProcessesUtilizationInfo",
        lambda h: [
            (s.pid, s.smUtil) for s in pynvml.nvmlDeviceGetProcessesUtilizationInfo(h.gpu, 0)
        ],
        [(101, 40)],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "conf_compute",
        "nvmlDeviceGetConfComputeMemSizeInfo",
        lambda h: (lambda c: (c.protectedMemSizeKib, c.unprotectedMemSizeKib))(
            pynvml.nvmlDeviceGetConfComputeMemSizeInfo(h.gpu)
        ),
        (1, 2),
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "field_values",
        "nvmlDeviceGetFieldValues",
        lambda h: [
            (v.fieldId, v.nvmlReturn, v.valueType, v.value.uiVal)
            for v in pynvml.nvmlDeviceGetFieldValues(
                h.gpu, [pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_POWER_AVERAGE]
            )
        ],
        [(186, 0, 1, 120000), (185, 3, 0, 0)],
        pynvml.NVMLError_FunctionNotFound,
    ),
    (
        "shutdown",
        "nvmlShutdown",
        lambda h: pynvml.nvmlShutdown(),
        None,
        pynvml.NVMLError_FunctionNotFound,
    ),
]

# Codes to inject, cycled over the cases so each pynvml error class is exercised somewhere.
INJECTED = [
    "NOT_SUPPORTED",
    "NO_PERMISSION",
    "GPU_IS_LOST",
    "UNKNOWN",
    "TIMEOUT",
    "NOT_FOUND",
    "INVALID_ARGUMENT",
    "RESET_REQUIRED",
    "OPERATING_SYSTEM",
    "IN_USE",
    "NO_DATA",
    "ARGUMENT_VERSION_MISMATCH",
    "IRQ_ISSUE",
    "INSUFFICIENT_POWER",
    "CORRUPTED_INFOROM",
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize(("case", "symbol", "call", "expected", "missing"), CASES, ids=IDS)
def test_returns_scenario_value(simulate, case, symbol, call, expected, missing):
    drv = simulate(full_scenario())
    handles = _handles()
    assert call(handles) == expected
    assert drv.call_count(symbol) >= 1
    assert drv.violations == []


@pytest.mark.parametrize(("case", "symbol", "call", "expected", "missing"), CASES, ids=IDS)
def test_injected_code_raises_pynvml_class(simulate, case, symbol, call, expected, missing):
    name = INJECTED[IDS.index(case) % len(INJECTED)]
    code = codes.CODES[name]
    # The fault starts at cycle 2, so the handles are obtained normally in cycle 1.
    drv = simulate(full_scenario(faults=[{"function": symbol, "code": name, "from_cycle": 2}]))
    handles = _handles()
    drv.next_cycle()
    with pytest.raises(pynvml.NVMLError) as raised:
        call(handles)
    assert raised.value.value == code
    assert type(raised.value) is pynvml.NVMLError._valClassMapping[code]


@pytest.mark.parametrize(("case", "symbol", "call", "expected", "missing"), CASES, ids=IDS)
def test_missing_symbol_raises(simulate, case, symbol, call, expected, missing):
    drv = simulate(full_scenario(driver={"profile": "570", "missing_symbols": [symbol]}))
    handles = _handles() if symbol not in _HANDLE_SYMBOLS else None
    with pytest.raises(missing):
        call(handles or Handles(None, None, None))
    assert drv.call_count(symbol) == 0


_HANDLE_SYMBOLS = {
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetMigDeviceHandleByIndex",
}


def test_error_string_is_the_library_text(simulate):
    simulate(full_scenario())
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_NOT_SUPPORTED) == "Not Supported"
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    assert pynvml.nvmlErrorString(123456) == "Unknown Error"


def test_error_string_missing_symbol(simulate):
    simulate(full_scenario(driver={"missing_symbols": ["nvmlErrorString"]}))
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlErrorString(3)
    # str() of an error falls back to the binding's own text when the library cannot answer
    assert str(pynvml.NVMLError(27)) == "NVML Error with code 27"


def test_every_code_maps_to_its_pynvml_class(simulate):
    names = [n for n in codes.CODES if n != "SUCCESS"]
    faults = [
        {
            "function": "nvmlDeviceGetPowerUsage",
            "code": n,
            "from_cycle": i + 2,
            "until_cycle": i + 3,
        }
        for i, n in enumerate(names)
    ]
    drv = simulate(full_scenario(faults=faults))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 123456
    for name in names:
        drv.next_cycle()
        with pytest.raises(pynvml.NVMLError) as raised:
            pynvml.nvmlDeviceGetPowerUsage(h)
        assert raised.value.value == codes.CODES[name]
        assert isinstance(raised.value, pynvml.NVMLError._valClassMapping[codes.CODES[name]])
    drv.next_cycle()
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 123456


def test_init_with_flags_and_missing_init_symbol(simulate):
    drv = simulate(full_scenario(), init=False)
    pynvml.nvmlInitWithFlags(pynvml.NVML_INIT_FLAG_NO_ATTACH)
    pynvml.nvmlInit()
    assert drv.init_count == 2
    assert drv.call_count("nvmlInitWithFlags") == 2
    sim.uninstall()
    simulate(full_scenario(driver={"missing_symbols": ["nvmlInitWithFlags"]}), init=False)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlInit()


@pytest.mark.parametrize("name", ["NO_PERMISSION", "DRIVER_NOT_LOADED", "UNKNOWN"])
def test_init_injected_code(simulate, name):
    drv = simulate(
        full_scenario(faults=[{"function": "nvmlInitWithFlags", "code": name}]), init=False
    )
    with pytest.raises(pynvml.NVMLError) as raised:
        pynvml.nvmlInit()
    assert type(raised.value) is pynvml.NVMLError._valClassMapping[codes.CODES[name]]
    assert drv.init_count == 0


@pytest.mark.parametrize(
    ("symbol", "pid"),
    [
        ("nvmlDeviceGetGraphicsRunningProcesses", 102),
        ("nvmlDeviceGetMPSComputeRunningProcesses", 103),
    ],
)
def test_raw_unversioned_graphics_and_mps_symbols(simulate, symbol, pid):
    import ctypes

    class V1(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

    simulate(full_scenario())
    fn = pynvml._nvmlGetFunctionPointer(symbol)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    count = ctypes.c_uint(0)
    assert fn(h, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    buf = (V1 * count.value)()
    assert fn(h, ctypes.byref(count), buf) == pynvml.NVML_SUCCESS
    assert [buf[i].pid for i in range(count.value)] == [pid]
