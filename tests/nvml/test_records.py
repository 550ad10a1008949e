"""Multi-record calls read with one C call into kept buffers, checked against nvidia-ml-py.

The binding's own wrappers are the oracle: on the same simulated driver, at the same simulated
time and cursor, ``gpumetrics.nvml.records`` must return what they return, and make one C
call per read once the device's buffer is sized (two when the answer outgrew it).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pynvml
import pytest
from gpumetrics.nvml import records
from gpumetrics.nvml.convert import U64_NA
from gpumetrics.nvml.processes import PROCESS_V1, _ProcessInfoV1

import nvmlsim as sim

LIST = "nvmlDeviceGetComputeRunningProcesses_v3"


@pytest.fixture
def drv() -> Iterator[sim.SimDriver]:
    data = sim.load_scenario("h100-sxm").model_dump(mode="json", exclude_unset=True)
    device = data["devices"][0]
    device["processes"] = [
        {"pid": 4001, "name": "a", "used_memory_bytes": 1 << 30, "utilization": {"sm": 40}},
        {"pid": 4002, "name": "b", "used_memory_bytes": "n/a", "utilization": {"sm": 7}},
        {"pid": 4003, "name": "c", "used_memory_bytes": 5 << 20, "utilization": {"mem": 3}},
    ]
    device["process_utilization"] = {}
    data["driver"]["pcie_window_ms"] = 0
    driver = sim.install(sim.scenario_from_data(data), latency="off")
    pynvml.nvmlInit()
    try:
        yield driver
    finally:
        pynvml.nvmlShutdown()
        sim.uninstall()


def _handle() -> object:
    return pynvml.nvmlDeviceGetHandleByIndex(0)


def _calls(drv: sim.SimDriver, function: str) -> int:
    return drv.calls.get((function, 0), 0)


@pytest.mark.parametrize(
    ("structure", "values"),
    [
        (pynvml.c_nvmlProcessInfo_v2_t, (4001, 2**40 + 3, 7, 0xFFFFFFFF)),
        (_ProcessInfoV1, (4002, U64_NA)),
        (pynvml.c_nvmlProcessUtilizationSample_t, (9, 2**50, 1, 2, 3, 4)),
        (pynvml.c_nvmlProcessUtilizationInfo_v1_t, (2**50, 9, 1, 2, 3, 4, 5, 6)),
    ],
)
def test_layouts_read_what_the_ctypes_structures_hold(structure, values):
    record = structure(*values)
    layout = records.layout(structure)
    assert layout.size == ctypes.sizeof(structure)
    assert layout.unpack(bytes(record)) == values


def test_layout_refuses_a_field_that_is_not_a_plain_number():
    with pytest.raises(TypeError, match="sampleValue"):
        records.layout(pynvml.c_nvmlSample_t)


def test_process_list_equals_the_binding_and_costs_one_call_once_sized(drv):
    handle, buffers = _handle(), records.Buffers()
    theirs = [
        (p.pid, U64_NA if p.usedGpuMemory is None else p.usedGpuMemory)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)
    ]
    drv.reset_calls()
    first = records.running_processes(LIST, handle, buffers)
    assert [(r[0], r[1]) for r in first] == theirs
    assert {r[1] for r in first} >= {U64_NA, 1 << 30}  # the not-available value as NVML wrote it
    assert _calls(drv, LIST) == 2  # the first read: sizing call, then the data call
    drv.reset_calls()
    assert records.running_processes(LIST, handle, buffers) == first
    assert _calls(drv, LIST) == 1  # the kept buffer: the data call alone


def test_a_list_that_outgrew_its_buffer_is_read_whole_in_the_same_read(drv):
    handle, buffers = _handle(), records.Buffers()
    records.running_processes(LIST, handle, buffers)  # 3 processes: room for 2 * 3 + 5 = 11
    for pid in range(5000, 5020):
        drv.add_process(0, pid, name="w", used_memory_bytes=1 << 20)
    drv.reset_calls()
    got = {r[0] for r in records.running_processes(LIST, handle, buffers)}
    assert _calls(drv, LIST) == 2  # INSUFFICIENT_SIZE with the count, then the data call
    assert got == {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)}
    assert len(got) == 23


def test_an_empty_list_costs_its_sizing_call_only(drv):
    handle, buffers = _handle(), records.Buffers()
    symbol = "nvmlDeviceGetMPSComputeRunningProcesses_v3"
    for _ in range(2):
        assert records.running_processes(symbol, handle, buffers) == []
    assert _calls(drv, symbol) == 2


def test_v1_records_have_no_mig_ids(drv):
    rows = records.running_processes(
        "nvmlDeviceGetComputeRunningProcesses", _handle(), records.Buffers(), PROCESS_V1
    )
    assert sorted(r[0] for r in rows) == [4001, 4002, 4003]
    assert all(len(r) == 2 for r in rows)


def _their_samples(handle: object, stype: int, cursor: int) -> list[tuple[int, int]]:
    value_type, raw = pynvml.nvmlDeviceGetSamples(handle, stype, cursor)
    assert value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    return [(int(s.timeStamp), int(s.sampleValue.uiVal)) for s in raw]


def test_samples_equal_the_binding_with_one_call_once_sized(drv):
    handle, buffers = _handle(), records.Buffers()
    stype = pynvml.NVML_TOTAL_POWER_SAMPLES
    value_type, first = records.samples(handle, stype, 0, buffers)
    assert value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert first == _their_samples(handle, stype, 0) and first
    drv.advance(1.0)
    cursor = first[-1][0]
    drv.reset_calls()
    _, later = records.samples(handle, stype, cursor, buffers)
    assert _calls(drv, "nvmlDeviceGetSamples") == 1
    assert later == _their_samples(handle, stype, cursor) and later
    assert all(ts > cursor for ts, _ in later)


def test_a_full_sample_buffer_is_read_again_whole(drv):
    handle, buffers = _handle(), records.Buffers()
    stype = pynvml.NVML_TOTAL_POWER_SAMPLES
    _, first = records.samples(handle, stype, 0, buffers)
    cursor = first[-1][0]
    drv.advance(0.2)  # a few new samples: the buffer gets room for 2n + 5 of them
    _, few = records.samples(handle, stype, cursor, buffers)
    drv.advance(10.0)  # many more than that: a data call alone would come back full
    cursor = few[-1][0]
    drv.reset_calls()
    _, many = records.samples(handle, stype, cursor, buffers)
    assert many == _their_samples(handle, stype, cursor)
    assert len(many) > 2 * len(few) + 5
    assert _calls(drv, "nvmlDeviceGetSamples") == 3  # full data call, then sizing and data


def test_no_new_sample_raises_not_found(drv):
    handle, buffers = _handle(), records.Buffers()
    stype = pynvml.NVML_TOTAL_POWER_SAMPLES
    _, first = records.samples(handle, stype, 0, buffers)
    with pytest.raises(pynvml.NVMLError) as err:
        records.samples(handle, stype, first[-1][0], buffers)
    assert err.value.value == pynvml.NVML_ERROR_NOT_FOUND


@pytest.mark.parametrize(
    ("ours", "wrapper", "fields"),
    [
        (
            records.processes_utilization_info,
            "nvmlDeviceGetProcessesUtilizationInfo",
            ("pid", "timeStamp", "smUtil", "memUtil", "encUtil", "decUtil"),
        ),
        (
            records.process_utilization,
            "nvmlDeviceGetProcessUtilization",
            ("pid", "timeStamp", "smUtil", "memUtil", "encUtil", "decUtil"),
        ),
    ],
)
def test_process_utilization_equals_the_binding(drv, ours, wrapper, fields):
    handle = _handle()
    theirs = [
        tuple(int(getattr(s, f)) for f in fields) for s in getattr(pynvml, wrapper)(handle, 0)
    ]
    assert ours(handle, 0, records.Buffers()) == theirs
    assert {row[0] for row in theirs} == {4001, 4002, 4003}
    with pytest.raises(pynvml.NVMLError) as err:  # nothing newer than the newest sample
        ours(handle, max(row[1] for row in theirs), records.Buffers())
    assert err.value.value == pynvml.NVML_ERROR_NOT_FOUND


def test_the_field_value_layout_is_the_bindings():
    fields = pynvml.c_nvmlFieldValue_t._fields_
    offsets = [getattr(pynvml.c_nvmlFieldValue_t, name).offset for name, _ in fields]
    assert ctypes.sizeof(pynvml.c_nvmlFieldValue_t) == records.FIELD_VALUE.size == 40
    assert offsets == [0, 4, 8, 16, 24, 28, 32]


def test_field_values_equal_the_binding_with_one_call_per_read(drv):
    handle = _handle()
    fields = [
        pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT,
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L3,
        (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, 13),
        (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, 99),  # no such link: NOT_SUPPORTED
        pynvml.NVML_FI_DEV_RETIRED_SBE,  # Hopper: NOT_SUPPORTED
    ]
    want = []
    for fv in pynvml.nvmlDeviceGetFieldValues(handle, fields):
        ret = int(fv.nvmlReturn)
        value = None
        if ret == pynvml.NVML_SUCCESS:
            value = getattr(fv.value, {1: "uiVal", 3: "ullVal"}[int(fv.valueType)])
        want.append((ret, value))
    buffers = records.Buffers()
    before = _calls(drv, "nvmlDeviceGetFieldValues")
    assert records.field_values(handle, fields, buffers) == want
    assert records.field_values(handle, fields, buffers) == want
    assert _calls(drv, "nvmlDeviceGetFieldValues") - before == 2
    assert [code for code, _ in want][-2:] == [pynvml.NVML_ERROR_NOT_SUPPORTED] * 2
