"""Output fields that ``overrides`` may target, per C symbol.

Field names are the members of the C structs nvidia-ml-py reads (``c_nvmlUtilization_t.gpu``,
``c_nvmlProcessInfo_t.usedGpuMemory``...); ``value`` is the single scalar output of functions
that have one. The second element is the field's maximum (its C type's range).
"""

from __future__ import annotations

__all__ = ["OVERRIDE_FIELDS", "field_max"]

_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF
_I32 = 0x7FFFFFFF

_PROC = {
    "pid": _U32,
    "usedGpuMemory": _U64,
    "gpuInstanceId": _U32,
    "computeInstanceId": _U32,
    "usedGpuCcProtectedMemory": _U64,
}
_PROC_UTIL = {
    "pid": _U32,
    "timeStamp": _U64,
    "smUtil": _U32,
    "memUtil": _U32,
    "encUtil": _U32,
    "decUtil": _U32,
}
_SCALAR32 = {"value": _U32}
_SCALAR64 = {"value": _U64}

#: C symbol -> {field: maximum value}.
OVERRIDE_FIELDS: dict[str, dict[str, int]] = {
    "nvmlSystemGetCudaDriverVersion": {"value": _I32},
    "nvmlSystemGetCudaDriverVersion_v2": {"value": _I32},
    "nvmlDeviceGetCount_v2": _SCALAR32,
    "nvmlDeviceGetMinorNumber": _SCALAR32,
    "nvmlDeviceGetIndex": _SCALAR32,
    "nvmlDeviceGetPciInfo_v3": {
        "domain": _U32,
        "bus": _U32,
        "device": _U32,
        "pciDeviceId": _U32,
        "pciSubSystemId": _U32,
    },
    "nvmlDeviceGetMemoryInfo": {"total": _U64, "free": _U64, "used": _U64},
    "nvmlDeviceGetMemoryInfo_v2": {"total": _U64, "reserved": _U64, "free": _U64, "used": _U64},
    "nvmlDeviceGetConfComputeMemSizeInfo": {
        "protectedMemSizeKib": _U64,
        "unprotectedMemSizeKib": _U64,
    },
    "nvmlDeviceGetPowerUsage": _SCALAR32,
    "nvmlDeviceGetEnforcedPowerLimit": _SCALAR32,
    "nvmlDeviceGetPowerManagementLimit": _SCALAR32,
    "nvmlDeviceGetTotalEnergyConsumption": _SCALAR64,
    "nvmlDeviceGetTemperature": _SCALAR32,
    "nvmlDeviceGetTemperatureV": {"temperature": _I32},
    "nvmlDeviceGetFanSpeed": _SCALAR32,
    "nvmlDeviceGetPerformanceState": _SCALAR32,
    "nvmlDeviceGetClockInfo": _SCALAR32,
    "nvmlDeviceGetCurrentClocksEventReasons": _SCALAR64,
    "nvmlDeviceGetCurrentClocksThrottleReasons": _SCALAR64,
    "nvmlDeviceGetPcieThroughput": _SCALAR32,
    "nvmlDeviceGetTotalEccErrors": _SCALAR64,
    "nvmlDeviceGetUtilizationRates": {"gpu": _U32, "memory": _U32},
    "nvmlDeviceGetEncoderUtilization": {"value": _U32, "samplingPeriodUs": _U32},
    "nvmlDeviceGetDecoderUtilization": {"value": _U32, "samplingPeriodUs": _U32},
    "nvmlDeviceGetSamples": {"timeStamp": _U64, "value": _U64, "raw": _U64},
    "nvmlDeviceGetComputeRunningProcesses": _PROC,
    "nvmlDeviceGetComputeRunningProcesses_v2": _PROC,
    "nvmlDeviceGetComputeRunningProcesses_v3": _PROC,
    "nvmlDeviceGetGraphicsRunningProcesses": _PROC,
    "nvmlDeviceGetGraphicsRunningProcesses_v2": _PROC,
    "nvmlDeviceGetGraphicsRunningProcesses_v3": _PROC,
    "nvmlDeviceGetMPSComputeRunningProcesses": _PROC,
    "nvmlDeviceGetMPSComputeRunningProcesses_v2": _PROC,
    "nvmlDeviceGetMPSComputeRunningProcesses_v3": _PROC,
    "nvmlDeviceGetRunningProcessDetailList": _PROC,
    "nvmlDeviceGetProcessUtilization": _PROC_UTIL,
    "nvmlDeviceGetProcessesUtilizationInfo": _PROC_UTIL | {"jpgUtil": _U32, "ofaUtil": _U32},
    "nvmlDeviceGetNvLinkState": _SCALAR32,
    "nvmlDeviceGetNvLinkErrorCounter": _SCALAR64,
    "nvmlDeviceGetNumFans": _SCALAR32,
    "nvmlDeviceGetFanSpeed_v2": _SCALAR32,
    "nvmlDeviceGetBAR1MemoryInfo": {"bar1Total": _U64, "bar1Free": _U64, "bar1Used": _U64},
    "nvmlDeviceGetRemappedRows": {
        "corrRows": _U32,
        "uncRows": _U32,
        "isPending": _U32,
        "failureOccurred": _U32,
    },
    "nvmlDeviceGetViolationStatus": {"violationTime": _U64},
    "nvmlDeviceGetEncoderStats": {"sessionCount": _U32, "averageFps": _U32, "averageLatency": _U32},
    "nvmlDeviceGetPowerManagementDefaultLimit": _SCALAR32,
    "nvmlDeviceGetPowerManagementLimitConstraints": {"minLimit": _U32, "maxLimit": _U32},
    "nvmlDeviceGetRetiredPagesPendingStatus": _SCALAR32,
    "nvmlDeviceGetMigMode": {"currentMode": _U32, "pendingMode": _U32},
    "nvmlDeviceGetMaxMigDeviceCount": _SCALAR32,
    "nvmlDeviceIsMigDeviceHandle": _SCALAR32,
    "nvmlDeviceGetGpuInstanceId": _SCALAR32,
    "nvmlDeviceGetComputeInstanceId": _SCALAR32,
}


def field_max(function: str, field: str) -> int | None:
    """Maximum raw value of ``field`` of ``function``; None if it cannot be overridden."""
    return OVERRIDE_FIELDS.get(function, {}).get(field)
