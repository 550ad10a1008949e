"""Named driver profiles: which NVML C symbols a driver branch exports, and its quirks.

The symbol history (NVML API reference, https://docs.nvidia.com/deploy/nvml-api/, and the
drivers' ``nvml.h``): the process calls' ``_v2``/``_v3`` versions (after nvitop PRs #89/#94 and
gpustat's notes), ``nvmlDeviceGetProcessesUtilizationInfo`` from ~R550,
``nvmlDeviceGetMemoryInfo_v2`` from ~R510, ``…ClocksEventReasons`` from R535 and
``nvmlDeviceGetTemperatureV`` from ~R570, the GPM calls from R520 (the R525 reference is the
first to list them), ``nvmlDeviceGetRemappedRows`` and the per-fan calls from R450, plus the field
cases F01–F06 (README).

Cross-checked against NVIDIA's own binding of each branch: every nvidia-ml-py release is cut
from one branch's ``nvml.h`` (release 11.495.46 from R495, 11.515.75 from R515, 12.560.30 from
R560, 13.595.45 from R595, https://pypi.org/project/nvidia-ml-py/#history), and the C symbols
its ``pynvml.py`` looks up (``_nvmlGetFunctionPointer("...")``) are the ones that branch's
library exports for those wrappers. First release referencing each symbol we implement:
``…MemoryInfo_v2`` and the ``…RunningProcesses_v3`` calls 11.515.75; ``…ConfComputeMemSizeInfo``,
``…RunningProcessDetailList`` and ``…ClocksEventReasons`` 12.535.x; ``…ProcessesUtilizationInfo``
12.550.x; ``…TemperatureV`` 12.570.86; nothing we implement was removed up to 13.615.71. (The
``_v2`` process wrappers are missing from the 11.515–12.535 bindings only; the libraries of
those branches still export the symbols, which is why F05's 535.98 could fall back to them.)

A symbol missing from a profile is *absent from the simulated library object*, so
nvidia-ml-py's ``getattr`` fails and it raises ``NVMLError_FunctionNotFound`` (or
``NVMLLibraryMismatchError`` from the unversioned process wrappers).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ALL_SYMBOLS", "DriverProfile", "DRIVER_PROFILES", "driver_profile"]

_LIFECYCLE = {
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
}
_SYSTEM = {
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetProcessName",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID",
}
_IDENTITY = {
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetBoardPartNumber",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetIndex",
}
_READINGS = {
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetBAR1MemoryInfo",
    "nvmlDeviceGetViolationStatus",
    "nvmlDeviceGetEncoderStats",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
}
_PROC_V1 = {"nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"}
_MPS_V1 = {"nvmlDeviceGetMPSComputeRunningProcesses"}
_PROC_V2 = {
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
}
_PROC_V3 = {
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
}
_MIG = {
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
}
# Accounting statistics (NVML 5.319, every branch simulated here).
_ACCOUNTING = {
    "nvmlDeviceGetAccountingMode",
    "nvmlDeviceGetAccountingBufferSize",
    "nvmlDeviceGetAccountingPids",
    "nvmlDeviceGetAccountingStats",
}
_MEM_V2 = {"nvmlDeviceGetMemoryInfo_v2"}
_CONF_COMPUTE = {"nvmlDeviceGetConfComputeMemSizeInfo"}
_DETAIL_LIST = {"nvmlDeviceGetRunningProcessDetailList"}
_EVENT_REASONS = {"nvmlDeviceGetCurrentClocksEventReasons"}
_PROC_UTIL_INFO = {"nvmlDeviceGetProcessesUtilizationInfo"}
_TEMP_V = {"nvmlDeviceGetTemperatureV"}
# Event sets (NVML 2.285); the MIG-aware wait (instance ids in nvmlEventData_t) is ``_v2``,
# which nvidia-ml-py's nvmlEventSetWait calls, from the R450 branch with MIG.
_EVENTS = {
    "nvmlEventSetCreate",
    "nvmlEventSetFree",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
}
_EVENT_WAIT_V2 = {"nvmlEventSetWait_v2"}
_R450 = {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetNumFans", "nvmlDeviceGetFanSpeed_v2"}
_GPM = {
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
    "nvmlGpmMetricsGet",
}

#: Every symbol the simulated library implements.
ALL_SYMBOLS: frozenset[str] = frozenset(
    _LIFECYCLE
    | _SYSTEM
    | _IDENTITY
    | _READINGS
    | _PROC_V1
    | _MPS_V1
    | _PROC_V2
    | _PROC_V3
    | _MIG
    | _ACCOUNTING
    | _MEM_V2
    | _CONF_COMPUTE
    | _DETAIL_LIST
    | _EVENT_REASONS
    | _PROC_UTIL_INFO
    | _TEMP_V
    | _EVENTS
    | _EVENT_WAIT_V2
    | _R450
    | _GPM
)


@dataclass(frozen=True)
class DriverProfile:
    """One driver branch as the simulation presents it.

    Attributes:
        name: profile name used in scenario files (``driver.profile``).
        version: default ``nvmlSystemGetDriverVersion`` string.
        cuda_version: default CUDA driver version as NVML encodes it (major*1000 + minor*10).
        missing: C symbols this branch does not export.
        v3_record_bytes: stride the ``…RunningProcesses_v3`` symbols write (24, or 32 on
            535.43–535.86, F01).
        bad_struct_version_code: what a present versioned symbol returns for a wrong struct
            ``version`` word (13 FUNCTION_NOT_FOUND on older branches, F03; 25
            ARGUMENT_VERSION_MISMATCH on newer ones).
        summary: one line for the docs.

    """

    name: str
    version: str
    cuda_version: int
    missing: frozenset[str]
    v3_record_bytes: int
    bad_struct_version_code: int
    summary: str

    @property
    def symbols(self) -> frozenset[str]:
        """The symbols this profile exports (``ALL_SYMBOLS`` minus ``missing``)."""
        return ALL_SYMBOLS - self.missing


def _p(
    name: str,
    version: str,
    cuda: int,
    missing: set[str],
    summary: str,
    *,
    stride: int = 24,
    bad_version: int = 13,
) -> DriverProfile:
    return DriverProfile(name, version, cuda, frozenset(missing), stride, bad_version, summary)


_NEWER_THAN_470 = _PROC_V3 | _MEM_V2 | _CONF_COMPUTE | _DETAIL_LIST | _EVENT_REASONS
_NEWER_THAN_470 |= _PROC_UTIL_INFO | _TEMP_V

#: The named profiles, oldest first.
DRIVER_PROFILES: dict[str, DriverProfile] = {
    p.name: p
    for p in (
        _p(
            "440",
            "440.33.01",
            10020,
            _NEWER_THAN_470 | _MIG | _PROC_V2 | _MPS_V1 | _EVENT_WAIT_V2 | _R450 | _GPM,
            "only the unversioned 16-byte process symbols (F02, F04); no MIG, no memory v2, "
            "no nvmlEventSetWait_v2, no GPM, no remapped rows or per-fan calls",
        ),
        _p(
            "470",
            "470.256.02",
            11040,
            _NEWER_THAN_470 | _GPM,
            "`_v2` process symbols but no `_v3` (F04); no memory v2 (from ~R510), no GPM",
        ),
        _p(
            "495",
            "495.46",
            11050,
            _NEWER_THAN_470 | _GPM,
            "as 470 (nvidia-ml-py 11.495.46): `_v2` process symbols, no `_v3`, no memory v2, "
            "no GPM",
        ),
        _p(
            "515",
            "515.105.01",
            11070,
            _CONF_COMPUTE | _DETAIL_LIST | _EVENT_REASONS | _PROC_UTIL_INFO | _TEMP_V | _GPM,
            "memory v2 and `_v3` (24-byte records) arrive (nvidia-ml-py 11.515.75); "
            "no ClocksEventReasons, no TemperatureV, no GPM (from R525, NVML 12)",
        ),
        _p(
            "525",
            "525.147.05",
            12000,
            _CONF_COMPUTE | _DETAIL_LIST | _EVENT_REASONS | _PROC_UTIL_INFO | _TEMP_V,
            "`_v3` with 24-byte records; no ClocksEventReasons (F06), no TemperatureV",
        ),
        _p(
            "535.54",
            "535.54.03",
            12020,
            _DETAIL_LIST | _PROC_UTIL_INFO | _TEMP_V,
            "`_v3` writes 32-byte records (F01); ConfCompute present, DetailList absent",
            stride=32,
        ),
        _p(
            "535.98",
            "535.98",
            12020,
            _PROC_V3 | _DETAIL_LIST | _PROC_UTIL_INFO | _TEMP_V,
            "the regression without `_v3` process symbols (F05)",
        ),
        _p(
            "550",
            "550.163.01",
            12040,
            set(_TEMP_V),
            "535.104+ behaviour: `_v3` 24-byte, DetailList, ProcessesUtilizationInfo; "
            "no TemperatureV (F06)",
            bad_version=25,
        ),
        _p(
            "560",
            "560.35.03",
            12060,
            set(_TEMP_V),
            "as 550 (nvidia-ml-py 12.560.30): no TemperatureV",
            bad_version=25,
        ),
        _p(
            "570",
            "570.172.08",
            12080,
            set(),
            "every implemented symbol, including TemperatureV",
            bad_version=25,
        ),
        _p(
            "580",
            "580.95.05",
            13000,
            set(),
            "as 570 with a CUDA 13 driver version string",
            bad_version=25,
        ),
        _p(
            "595",
            "595.45",
            13020,
            set(),
            "every implemented symbol (nvidia-ml-py 13.595.45); the deprecated "
            "ClocksThrottleReasons is still exported",
            bad_version=25,
        ),
    )
}


def driver_profile(name: str) -> DriverProfile:
    """Return the named profile; raises KeyError naming the known profiles."""
    try:
        return DRIVER_PROFILES[name]
    except KeyError:
        known = ", ".join(DRIVER_PROFILES)
        raise KeyError(f"unknown driver profile {name!r}; known: {known}") from None
