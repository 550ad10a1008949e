"""Sample buffers and per-process utilisation: cursors, clock domains, value types, sizing."""

from __future__ import annotations

import struct

import pynvml
import pytest

from nvmlsim.samples import encode_value

from .sim_helpers import h0, one_gpu

START_US = 1_767_225_600_000_000  # the default manual clock start (2026-01-01Z)
GPU_UTIL = pynvml.NVML_GPU_UTILIZATION_SAMPLES


def _gpu_samples(period_us: int = 100_000, **buffer: object) -> dict:
    return one_gpu(
        utilization={
            "gpu": {
                "pattern": "trace",
                "per": "second",
                "step_s": 0.1,
                "values": list(range(1, 51)),
            }
        },
        samples={"gpu_utilization": {"period_us": period_us, **buffer}},
    )


def test_cursor_returns_only_newer_samples_then_not_found(simulate):
    drv = simulate(_gpu_samples(capacity=5))
    h = h0()
    drv.advance(1.0)
    vtype, samples = pynvml.nvmlDeviceGetSamples(h, GPU_UTIL, 0)
    assert vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    stamps = [s.timeStamp for s in samples]
    assert stamps == [START_US + k * 100_000 for k in range(6, 11)]  # the newest 5 (capacity)
    assert [s.sampleValue.uiVal for s in samples] == [7, 8, 9, 10, 11]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetSamples(h, GPU_UTIL, stamps[-1])  # nothing newer than the cursor
    drv.advance(0.25)
    _, newer = pynvml.nvmlDeviceGetSamples(h, GPU_UTIL, stamps[-1])
    assert [s.timeStamp for s in newer] == [START_US + 1_100_000, START_US + 1_200_000]


def test_boot_clock_domain(simulate):
    data = _gpu_samples()
    data["driver"] = {"sample_clock": "boot"}
    data["clock"] = {"uptime_s": 1000}
    drv = simulate(data)
    drv.advance(0.3)
    _, samples = pynvml.nvmlDeviceGetSamples(h0(), GPU_UTIL, 0)
    assert samples[-1].timeStamp == 1000_300_000  # µs since boot, not since the epoch
    with pytest.raises(pynvml.NVMLError_NotFound):
        # an epoch-µs cursor is "newer" than every boot-clock sample
        pynvml.nvmlDeviceGetSamples(h0(), GPU_UTIL, START_US)


@pytest.mark.parametrize(
    ("value_type", "member", "expected"),
    [
        ("DOUBLE", "dVal", 1.0),
        ("UNSIGNED_INT", "uiVal", 1),
        ("UNSIGNED_LONG", "ulVal", 1),
        ("UNSIGNED_LONG_LONG", "ullVal", 1),
        ("SIGNED_LONG_LONG", "sllVal", 1),
        ("SIGNED_INT", "siVal", 1),
        ("UNSIGNED_SHORT", "usVal", 1),
    ],
)
def test_value_types_fill_the_matching_union_member(simulate, value_type, member, expected):
    drv = simulate(_gpu_samples(value_type=value_type))
    drv.advance(0.05)
    vtype, samples = pynvml.nvmlDeviceGetSamples(h0(), GPU_UTIL, 0)
    assert vtype == pynvml.__dict__[f"NVML_VALUE_TYPE_{value_type}"]
    assert getattr(samples[-1].sampleValue, member) == expected


def test_dirty_high_bytes_only_show_in_the_wide_members(simulate):
    drv = simulate(_gpu_samples(dirty_high_bytes=0xDEADBEEF))
    drv.advance(0.05)
    _, samples = pynvml.nvmlDeviceGetSamples(h0(), GPU_UTIL, 0)
    assert samples[-1].sampleValue.uiVal == 1
    assert samples[-1].sampleValue.ullVal == (0xDEADBEEF << 32) | 1


def test_encode_value_bytes():
    assert encode_value(6, 7, 0x01020304) == struct.pack("<HHI", 7, 0, 0x01020304)
    assert encode_value(4, -3, 0) == struct.pack("<q", -3)


def test_capacity_sizing_reports_the_buffer_size(simulate):
    drv = simulate(_gpu_samples(sizing="capacity", capacity=50))
    drv.advance(0.3)
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
    import ctypes

    count, vtype = ctypes.c_uint(0), ctypes.c_uint(9)
    ret = fn(
        h0(),
        ctypes.c_uint(GPU_UTIL),
        ctypes.c_ulonglong(START_US),
        ctypes.byref(vtype),
        ctypes.byref(count),
        None,
    )
    assert (ret, count.value, vtype.value) == (0, 50, 1)
    _, samples = pynvml.nvmlDeviceGetSamples(h0(), GPU_UTIL, START_US)
    assert len(samples) == 3  # the data call says how many it wrote (0.1, 0.2, 0.3 s)


def test_unconfigured_and_invalid_sample_types(simulate):
    simulate(_gpu_samples())
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetSamples(h0(), pynvml.NVML_TOTAL_POWER_SAMPLES, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetSamples(h0(), 42, 0)


def _proc_util(**spec: object) -> dict:
    return one_gpu(
        process_utilization=spec,
        processes=[
            {"pid": 1, "utilization": {"sm": 10, "mem": 1}},
            {"pid": 2, "utilization": {"sm": 20}, "sample_phase_us": 500_000},
            {"pid": 3, "utilization": {"sm": 0}},  # idle: no sample
            {"pid": 4, "utilization": {"sm": 40}, "until_s": 2.2},  # exits
        ],
    )


def test_process_samples_have_their_own_timestamps_and_cursor(simulate):
    drv = simulate(_proc_util())
    h = h0()
    drv.advance(2.7)
    samples = {
        s.pid: (s.timeStamp - START_US, s.smUtil)
        for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    }
    assert samples == {1: (2_000_000, 10), 2: (2_500_000, 20), 4: (2_000_000, 40)}
    cursor = START_US + 2_000_000
    newer = [s.pid for s in pynvml.nvmlDeviceGetProcessUtilization(h, cursor)]
    assert newer == [2]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h, START_US + 2_500_000)
    info = {s.pid: s.smUtil for s in pynvml.nvmlDeviceGetProcessesUtilizationInfo(h, 0)}
    assert info == {1: 10, 2: 20, 4: 40}


def test_exited_process_samples_leave_the_buffer(simulate):
    drv = simulate(_proc_util(buffer_s=3))
    h = h0()
    drv.advance(4.0)
    assert 4 in {s.pid for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0)}
    drv.advance(2.0)
    assert 4 not in {s.pid for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0)}


def test_process_utilization_capacity_sizing(simulate):
    drv = simulate(_proc_util(sizing="capacity", capacity=100))
    drv.advance(1.0)
    import ctypes

    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
    count = ctypes.c_uint(0)
    ret = fn(h0(), None, ctypes.byref(count), ctypes.c_ulonglong(0))
    assert (ret, count.value) == (pynvml.NVML_ERROR_INSUFFICIENT_SIZE, 100)
    assert len(pynvml.nvmlDeviceGetProcessUtilization(h0(), 0)) == 3  # pids 1, 2 and 4


def test_success_on_the_sizing_call_raises_plain_nvmlerror(simulate):
    data = _proc_util()
    data["faults"] = [
        {"function": "nvmlDeviceGetProcessUtilization", "call": "sizing", "code": "SUCCESS"}
    ]
    drv = simulate(data)
    drv.advance(1)
    with pytest.raises(pynvml.NVMLError) as raised:
        pynvml.nvmlDeviceGetProcessUtilization(h0(), 0)
    assert raised.value.value == 0
    assert type(raised.value) is pynvml.NVMLError


def test_bad_struct_version_of_processes_utilization_info(simulate):
    import ctypes

    data = _proc_util()
    data["driver"] = {"bad_struct_version_code": "FUNCTION_NOT_FOUND"}
    simulate(data)
    info = pynvml.c_nvmlProcessesUtilizationInfo_v1_t()
    info.version = 1
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessesUtilizationInfo")
    assert fn(h0(), ctypes.byref(info)) == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
