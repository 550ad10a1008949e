"""Record how a real NVML driver answers the corners the simulator models without evidence.

Run on a machine with a GPU (real ``libnvidia-ml.so.1``):
``python benchmarks/sim_hardware_probe.py > probe.json``; or against the simulation, to check
the script itself: ``python -m nvmlsim exec --simulate h100-sxm -- \
benchmarks/sim_hardware_probe.py``. Compare the JSON with the simulator's choices listed under
"Behaviour reference" in nvmlsim/README.md (MIG error codes, sizing counts, sample clock
domain, bad struct version code, symbol presence per driver branch, NVLink throughput per
scope id, the recovery-action field, remapped rows, the retired-pages size probe).

Read-only: it only queries; it never changes a clock, limit or MIG setting.
"""

from __future__ import annotations

import ctypes
import json
import time
from collections.abc import Callable
from typing import Any

import pynvml
from nvmlsim.driver_profiles import ALL_SYMBOLS


def _code(fn: Callable[[], Any]) -> Any:
    try:
        return {"ok": repr(fn())[:200]}
    except pynvml.NVMLError as exc:
        return {"error": int(exc.value)}
    except Exception as exc:  # noqa: BLE001 - recorded, not raised
        return {"exception": type(exc).__name__}


def _sizing(symbol: str, h: Any, *args: Any) -> dict[str, int]:
    fn = pynvml._nvmlGetFunctionPointer(symbol)
    count = ctypes.c_uint(0)
    if symbol == "nvmlDeviceGetSamples":
        vtype = ctypes.c_uint(0)
        ret = fn(
            h,
            ctypes.c_uint(args[0]),
            ctypes.c_ulonglong(0),
            ctypes.byref(vtype),
            ctypes.byref(count),
            None,
        )
    else:
        ret = fn(h, None, ctypes.byref(count), ctypes.c_ulonglong(0))
    return {"ret": int(ret), "count": int(count.value)}


def _retired_probe(h: Any) -> dict[str, int]:
    """nvml.h: ``pageCount`` 0 asks for the size (expected INSUFFICIENT_SIZE with the count)."""
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetRetiredPages")
    count = ctypes.c_uint(0)
    ret = fn(h, ctypes.c_uint(0), ctypes.byref(count), None)
    return {"ret": int(ret), "count": int(count.value)}


def probe() -> dict[str, Any]:
    """Query the installed library; every answer is recorded, nothing raises."""
    pynvml.nvmlInit()
    out: dict[str, Any] = {"driver": pynvml.nvmlSystemGetDriverVersion()}
    out["symbols"] = {}
    for name in sorted(ALL_SYMBOLS):
        try:
            pynvml._nvmlGetFunctionPointer(name)
            out["symbols"][name] = True
        except pynvml.NVMLError:
            out["symbols"][name] = False
    out["error_strings"] = {
        c: pynvml.nvmlErrorString(c) for c in (1, 2, 3, 6, 7, 13, 15, 18, 19, 21, 25, 999)
    }
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    out["memory_v2_version_2"] = _code(lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=2))
    out["mig_mode"] = _code(lambda: pynvml.nvmlDeviceGetMigMode(h))
    out["max_mig_count"] = _code(lambda: pynvml.nvmlDeviceGetMaxMigDeviceCount(h))
    out["mig_handle_0"] = _code(lambda: pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0))
    out["gpu_instance_id_of_gpu"] = _code(lambda: pynvml.nvmlDeviceGetGpuInstanceId(h))
    out["parent_of_gpu"] = _code(lambda: pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h))
    out["temperature_v"] = _code(lambda: pynvml.nvmlDeviceGetTemperatureV(h, 0))
    out["fan"] = _code(lambda: pynvml.nvmlDeviceGetFanSpeed(h))
    out["field_values_power"] = _code(
        lambda: [
            (v.fieldId, v.nvmlReturn, v.valueType, v.value.uiVal)
            for v in pynvml.nvmlDeviceGetFieldValues(h, [185, 186])
        ]
    )
    out["nvlink_throughput_by_scope"] = _code(  # nvml.h: scope = link, UINT_MAX = all links
        lambda: [
            (v.scopeId, v.nvmlReturn, v.value.ullVal)
            for v in pynvml.nvmlDeviceGetFieldValues(
                h, [(138, 0), (138, 1), (138, 0xFFFFFFFF), (138, 63), (91, 0)]
            )
        ]
    )
    out["recovery_action_field"] = _code(
        lambda: [
            (v.nvmlReturn, v.valueType, v.value.uiVal)
            for v in pynvml.nvmlDeviceGetFieldValues(h, [230])
        ]
    )
    out["remapped_rows"] = _code(lambda: pynvml.nvmlDeviceGetRemappedRows(h))
    out["retired_pages_probe"] = _code(lambda: _retired_probe(h))
    out["supported_event_types"] = _code(lambda: pynvml.nvmlDeviceGetSupportedEventTypes(h))
    out["uuid"] = _code(lambda: pynvml.nvmlDeviceGetUUID(h))
    now_us = time.time_ns() // 1000
    boot_us = int((time.time() - time.monotonic()) * 1e6)  # CLOCK_MONOTONIC ~ since boot
    samples = {}
    for stype in range(10):
        entry: dict[str, Any] = {
            "sizing": _code(lambda s=stype: _sizing("nvmlDeviceGetSamples", h, s))
        }
        try:
            vtype, got = pynvml.nvmlDeviceGetSamples(h, stype, 0)
            stamps = [s.timeStamp for s in got]
            entry.update(
                value_type=vtype,
                count=len(got),
                newest=max(stamps, default=0),
                oldest=min(stamps, default=0),
            )
        except pynvml.NVMLError as exc:
            entry["error"] = int(exc.value)
        samples[stype] = entry
    out["samples"] = samples
    out["clock"] = {"epoch_us": now_us, "boot_origin_us": boot_us}
    out["process_utilization_sizing"] = _code(lambda: _sizing("nvmlDeviceGetProcessUtilization", h))
    out["process_name_missing_pid"] = _code(lambda: pynvml.nvmlSystemGetProcessName(4_000_000))
    out["pcie_counter_2"] = _code(lambda: pynvml.nvmlDeviceGetPcieThroughput(h, 2))
    started = time.perf_counter()
    out["pcie_tx"] = _code(lambda: pynvml.nvmlDeviceGetPcieThroughput(h, 0))
    out["pcie_seconds"] = time.perf_counter() - started
    pynvml.nvmlShutdown()
    return out


if __name__ == "__main__":
    print(json.dumps(probe(), indent=2, sort_keys=True, default=str))
