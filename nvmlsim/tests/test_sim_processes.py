"""Process lists, names and the two-call protocol, through the real pynvml wrappers."""

from __future__ import annotations

import ctypes
import os

import pynvml
import pytest

from nvmlsim import memio
from nvmlsim.symbols.fieldvalues import FIELD_VALUE
from nvmlsim.symbols.identity import PCI_INFO
from nvmlsim.symbols.memory import CONF_COMPUTE, MEMORY_V1, MEMORY_V2, MEMORY_V2_VERSION
from nvmlsim.symbols.processes import DETAIL_LIST, DETAIL_LIST_VERSION
from nvmlsim.symbols.procutil import UTIL_INFO, UTIL_INFO_VERSION
from nvmlsim.symbols.sensors import TEMPERATURE_V1, TEMPERATURE_V1_VERSION
from nvmlsim.symbols.utilization import UTILIZATION

from .sim_helpers import h0, one_gpu


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (memio.RECORD_V2, pynvml.c_nvmlProcessInfo_v2_t),
        (memio.RECORD_DETAIL, pynvml.c_nvmlProcessDetail_v1_t),
        (memio.PROC_UTIL_SAMPLE, pynvml.c_nvmlProcessUtilizationSample_t),
        (memio.PROC_UTIL_INFO, pynvml.c_nvmlProcessUtilizationInfo_v1_t),
        (MEMORY_V1, pynvml.c_nvmlMemory_t),
        (MEMORY_V2, pynvml.c_nvmlMemory_v2_t),
        (TEMPERATURE_V1, pynvml.c_nvmlTemperature_v1_t),
        (UTILIZATION, pynvml.c_nvmlUtilization_t),
        (DETAIL_LIST, pynvml.c_nvmlProcessDetailList_t),
        (UTIL_INFO, pynvml.c_nvmlProcessesUtilizationInfo_v1_t),
        (FIELD_VALUE, pynvml.c_nvmlFieldValue_t),
        (PCI_INFO, pynvml.nvmlPciInfo_t),
        (CONF_COMPUTE, pynvml.c_nvmlConfComputeMemSizeInfo_t),
    ],
)
def test_struct_layouts_agree_with_the_binding(ours, theirs):
    # Our layouts are written from nvml.h; this trips if either side drifts.
    assert ours.size == ctypes.sizeof(theirs)


def test_version_words_agree_with_the_binding():
    assert MEMORY_V2_VERSION == pynvml.nvmlMemory_v2 == 0x02000028
    assert TEMPERATURE_V1_VERSION == pynvml.nvmlTemperature_v1
    assert DETAIL_LIST_VERSION == pynvml.nvmlProcessDetailList_v1
    assert UTIL_INFO_VERSION == pynvml.ProcessesUtilizationInfo_v1


def test_empty_list_sizing_call_answers_success(simulate):
    drv = simulate(one_gpu())
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h0()) == []
    assert drv.call_count("nvmlDeviceGetComputeRunningProcesses_v3", 0) == 1  # no data call


def test_success_on_a_sizing_call_is_an_empty_list(simulate):
    data = one_gpu(processes=[{"pid": 10}])
    data["faults"] = [
        {
            "function": "nvmlDeviceGetComputeRunningProcesses_v3",
            "call": "sizing",
            "code": "SUCCESS",
            "calls": 1,
        }
    ]
    simulate(data)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h0()) == []
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h0())] == [10]


def test_data_call_insufficient_size_reports_the_new_count(simulate):
    simulate(one_gpu(processes=[{"pid": 10 + i} for i in range(4)]))
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v2")
    count = ctypes.c_uint(2)
    buf = (pynvml.c_nvmlProcessInfo_v2_t * 2)()
    assert fn(h0(), ctypes.byref(count), buf) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 4
    assert buf[0].pid == 0  # nothing written


def test_processes_start_and_exit_over_cycles(simulate):
    drv = simulate(
        one_gpu(
            processes=[
                {"pid": 1, "until_cycle": 3},
                {"pid": 2, "from_cycle": 2},
                {"pid": 3, "from_s": 0.5, "until_s": 1.5},
            ]
        )
    )
    h = h0()
    seen = []
    for _ in range(4):
        seen.append(sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)))
        drv.advance(0.5)
        seen.append(sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)))
        drv.advance(0.5)
    assert seen == [[1], [1, 3], [1, 2, 3], [1, 2], [2], [2], [2], [2]]


def test_add_and_remove_processes_from_a_test(simulate):
    drv = simulate(one_gpu())
    h = h0()
    drv.add_process(0, 4242, name="python", used_memory_bytes=123, types=["compute", "graphics"])
    assert [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)] == [
        (4242, 123)
    ]
    assert [p.pid for p in pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)] == [4242]
    assert pynvml.nvmlSystemGetProcessName(4242) == "python"
    assert drv.remove_process(0, 4242) == 1
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlSystemGetProcessName(4242)
    drv.add_process(0, 4242, name="ffmpeg")  # pid reuse
    assert pynvml.nvmlSystemGetProcessName(4242) == "ffmpeg"
    with pytest.raises(KeyError, match="no device"):
        drv.add_process(7, 1)


def test_process_sets_expand(simulate):
    simulate(
        one_gpu(
            process_sets=[
                {
                    "count": 3,
                    "pid_start": 100,
                    "pid_step": 2,
                    "name": "w{n}-{pid}",
                    "used_memory_bytes": 5,
                }
            ]
        )
    )
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h0())
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(100, 5), (102, 5), (104, 5)]
    assert pynvml.nvmlSystemGetProcessName(104) == "w2-104"


def test_local_pids_resolve_through_proc(simulate):
    simulate(one_gpu(processes=[{"pid": "self"}]))
    (proc,) = pynvml.nvmlDeviceGetComputeRunningProcesses(h0())
    assert proc.pid == os.getpid()
    argv0 = open(f"/proc/{os.getpid()}/cmdline", "rb").read().split(b"\0")[0].decode()
    assert pynvml.nvmlSystemGetProcessName(os.getpid()) == argv0


def test_unknown_pid_names(simulate):
    simulate(one_gpu(processes=[{"pid": 5, "name_error": "NO_PERMISSION"}]))
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlSystemGetProcessName(5)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlSystemGetProcessName(os.getpid())  # not in the scenario


def test_local_process_names_option(simulate):
    simulate(one_gpu(driver={"local_process_names": True}))
    assert pynvml.nvmlSystemGetProcessName(os.getpid())


def test_long_process_names_are_truncated_like_nvml(simulate):
    simulate(one_gpu(processes=[{"pid": 5, "name": "x" * 2000}]))
    assert pynvml.nvmlSystemGetProcessName(5) == "x" * 1023


def test_too_small_string_buffer_is_insufficient_size(simulate):
    simulate(one_gpu(name="NVIDIA H100 80GB HBM3"))
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetName")
    buf = ctypes.create_string_buffer(8)
    assert fn(h0(), buf, ctypes.c_uint(8)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE


def test_detail_list_modes_and_bad_version(simulate):
    simulate(
        one_gpu(
            processes=[
                {"pid": 1, "cc_protected_memory_bytes": 7},
                {"pid": 2, "types": ["graphics"], "used_memory_bytes": 12},
                {"pid": 3, "types": ["mps"]},
            ]
        )
    )
    h = h0()
    by_mode = [
        [
            (p.pid, p.usedGpuMemory, p.usedGpuCcProtectedMemory)
            for p in pynvml.nvmlDeviceGetRunningProcessDetailList(
                h, pynvml.nvmlProcessDetailList_v1, m
            )
        ]
        for m in (0, 1, 2)
    ]
    assert by_mode == [[(1, 0, 7)], [(2, 12, 0)], [(3, 0, 0)]]
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):  # profile 570: code 25
        pynvml.nvmlDeviceGetRunningProcessDetailList(h, 1, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetRunningProcessDetailList(h, pynvml.nvmlProcessDetailList_v1, 3)


def test_detail_list_not_available_memory_trips_the_binding(simulate):
    # nvidia-ml-py 13.615.71 assigns None to a ctypes field when usedGpuMemory is
    # NVML_VALUE_NOT_AVAILABLE, which raises TypeError: callers must catch it.
    simulate(one_gpu(processes=[{"pid": 2, "used_memory_bytes": "n/a"}]))
    with pytest.raises(TypeError):
        pynvml.nvmlDeviceGetRunningProcessDetailList(h0(), pynvml.nvmlProcessDetailList_v1, 0)


def test_process_overrides_inject_garbage_for_one_pid(simulate):
    data = one_gpu(
        processes=[{"pid": 1, "used_memory_bytes": 5}, {"pid": 2, "used_memory_bytes": 6}]
    )
    data["overrides"] = [
        {
            "function": "nvmlDeviceGetComputeRunningProcesses_v3",
            "field": "pid",
            "pid": 2,
            "value": 0,
        }
    ]
    simulate(data)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h0())
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(1, 5), (0, 6)]
