"""NVLink, fans, BAR1, remapped rows, retired pages, violations, encoder stats and power limits
through the real nvidia-ml-py wrappers."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml
import pytest

import nvmlsim as sim
from nvmlsim.symbols.fieldvalues import ALL_LINKS

from .sim_helpers import UUID0

BOARD: dict[str, Any] = {
    "uuid": UUID0,
    "power": {
        "usage_mw": 300000,
        "default_limit_mw": 700000,
        "min_limit_mw": 200000,
        "max_limit_mw": 700000,
    },
    "fans_percent": [40, {"pattern": "trace", "values": [50, 55]}],
    "bar1": {"total_bytes": 137438953472, "used_bytes": 33554432},
    "ecc": {},
    "remapped_rows": {"correctable": 2, "uncorrectable": 1, "pending": True},
    "retired_pages": {"single_bit": 3, "double_bit": 1},
    "violations_ns": {"power": {"pattern": "ramp", "start": 1000, "per_s": 500000000}},
    "encoder_stats": {"sessions": 2, "average_fps": 60, "average_latency_us": 1800},
    "nvlink": {
        "links": 4,
        "down": [2],
        "data_tx_kib": {"pattern": "ramp", "start": 1000, "per_s": 100},
        "data_rx_kib": 77,
        "errors": {1: {"replay": 5, "crc_flit": 2}, 3: {"replay": 1}},
    },
}


def _scenario(device: dict[str, Any] | None = None, **driver: Any) -> dict[str, Any]:
    return {"format": 1, "driver": driver, "devices": [device or BOARD]}


def test_nvlink_state_errors_and_field_values(simulate):
    drv = simulate(_scenario(), latency="off")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert [pynvml.nvmlDeviceGetNvLinkState(h, link) for link in range(4)] == [1, 1, 0, 1]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkState(h, 4)
    counts = [
        pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 1, c)
        for c in (
            pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
            pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
            pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
        )
    ]
    assert counts == [5, 0, 2, 0]
    drv.advance(2.0)
    fields = [
        pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT,
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS),
        pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX,
    ]
    values = pynvml.nvmlDeviceGetFieldValues(h, fields)
    assert [v.nvmlReturn for v in values] == [0, 0, 0, 0, pynvml.NVML_ERROR_NOT_SUPPORTED]
    assert values[0].value.uiVal == 4
    assert [values[i].value.ullVal for i in (1, 2, 3)] == [1200, 77, 6]


def test_nvlink_state_and_error_fields_by_link(simulate):
    simulate(_scenario(), latency="off")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    state = pynvml.NVML_FI_DEV_NVLINK_GET_STATE
    values = pynvml.nvmlDeviceGetFieldValues(h, [(state, link) for link in range(5)])
    assert [v.nvmlReturn for v in values] == [0, 0, 0, 0, pynvml.NVML_ERROR_NOT_SUPPORTED]
    assert [v.value.uiVal for v in values[:4]] == [
        pynvml.NVML_NVLINK_STATE_ACTIVE,
        pynvml.NVML_NVLINK_STATE_ACTIVE,
        pynvml.NVML_NVLINK_STATE_INACTIVE,
        pynvml.NVML_NVLINK_STATE_ACTIVE,
    ]
    errors = pynvml.nvmlDeviceGetFieldValues(
        h,
        [
            pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L1,
            pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L1,
            (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, 3),
        ],
    )
    assert [v.value.ullVal for v in errors] == [5, 2, 1]


def test_nvlink_without_the_state_and_error_fields(simulate):
    nvlink = {**BOARD["nvlink"], "state_field": False, "error_fields": False}  # type: ignore[dict-item]
    simulate(_scenario({**BOARD, "nvlink": nvlink}), latency="off")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    values = pynvml.nvmlDeviceGetFieldValues(
        h,
        [
            (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 0),
            pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L1,
            pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT,
        ],
    )
    assert [v.nvmlReturn for v in values] == [pynvml.NVML_ERROR_NOT_SUPPORTED] * 2 + [0]
    assert pynvml.nvmlDeviceGetNvLinkState(h, 0) == 1  # the per-link calls still answer
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 1, pynvml.NVML_NVLINK_ERROR_DL_REPLAY) == 5


def _link_kib(h: Any, field: int, links: range) -> list[int]:
    values = pynvml.nvmlDeviceGetFieldValues(h, [(field, link) for link in links])
    assert {v.nvmlReturn for v in values} == {pynvml.NVML_SUCCESS}
    return [int(v.value.ullVal) for v in values]


def test_nvlink_throughput_fields_answer_per_link_by_scope_id(simulate):
    """nvml.h: the NVLink throughput fields' scopeId is the link; UINT_MAX sums all links.
    Before, every scope answered the GPU's total, so a reader of link 0 saw all links."""
    drv = simulate(_scenario(), latency="off")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    tx, rx = (
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    )
    seen = []
    for _ in range(4):
        total = pynvml.nvmlDeviceGetFieldValues(h, [(tx, ALL_LINKS)])[0].value.ullVal
        per_link = _link_kib(h, tx, range(4))
        assert sum(per_link) == total  # the links sum exactly to the GPU's total
        seen.append(per_link)
        drv.advance(0.37)
    for before, after in zip(seen, seen[1:], strict=False):  # each link's counter grows
        assert all(a <= b for a, b in zip(before, after, strict=True))
    assert _link_kib(h, rx, range(4)) == [20, 19, 19, 19]  # 77 KiB over 4 links
    (beyond,) = pynvml.nvmlDeviceGetFieldValues(h, [(tx, 4)])
    assert beyond.nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_nvlink_per_link_counters_and_windowed_link_state(simulate):
    device = {
        **BOARD,
        "nvlink": {
            "links": 3,
            "down": [{"link": 1, "from_cycle": 2, "until_cycle": 4}],
            "per_link": {0: {"data_tx_kib": 500, "data_rx_kib": 7}, 2: {"data_tx_kib": 40}},
        },
    }
    drv = simulate(_scenario(device), latency="off")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    tx = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    assert _link_kib(h, tx, range(3)) == [500, 0, 40]
    assert pynvml.nvmlDeviceGetFieldValues(h, [(tx, ALL_LINKS)])[0].value.ullVal == 540
    state = pynvml.NVML_FI_DEV_NVLINK_GET_STATE
    states, fields = [], []
    for _ in range(5):  # cycles 1..5: link 1 is down in cycles 2 and 3 only
        states.append([pynvml.nvmlDeviceGetNvLinkState(h, link) for link in range(3)])
        values = pynvml.nvmlDeviceGetFieldValues(h, [(state, link) for link in range(3)])
        fields.append([v.value.uiVal for v in values])
        drv.next_cycle()
    assert states == [[1, 1, 1], [1, 0, 1], [1, 0, 1], [1, 1, 1], [1, 1, 1]]
    assert fields == states  # the state field answers what the per-link call answers


def test_fans_bar1_pstate_less_devices_and_encoder_stats(simulate):
    drv = simulate(_scenario(), latency="off")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetNumFans(h) == 2
    assert [pynvml.nvmlDeviceGetFanSpeed_v2(h, f) for f in (0, 1)] == [40, 50]
    assert pynvml.nvmlDeviceGetFanSpeed(h) == 40  # fan 0
    drv.next_cycle()
    assert pynvml.nvmlDeviceGetFanSpeed_v2(h, 1) == 55
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetFanSpeed_v2(h, 2)
    bar1 = pynvml.nvmlDeviceGetBAR1MemoryInfo(h)
    assert (bar1.bar1Total, bar1.bar1Used, bar1.bar1Free) == (
        137438953472,
        33554432,
        137438953472 - 33554432,
    )
    assert pynvml.nvmlDeviceGetEncoderStats(h) == (2, 60, 1800)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPerformanceState(h)  # not in the scenario


def test_remapped_rows_retired_pages_violations_and_power_limits(simulate):
    drv = simulate(_scenario(), latency="off")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (2, 1, 1, 0)
    retired = pynvml.nvmlDeviceGetFieldValues(
        h,
        [
            pynvml.NVML_FI_DEV_RETIRED_SBE,
            pynvml.NVML_FI_DEV_RETIRED_DBE,
            pynvml.NVML_FI_DEV_RETIRED_PENDING,
        ],
    )
    assert [(v.nvmlReturn, v.value.ullVal) for v in retired] == [(0, 3), (0, 1), (0, 0)]
    drv.advance(2.0)
    status = pynvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_POWER)
    assert status.violationTime == 1000 + 1_000_000_000
    assert status.referenceTime == drv.now_us
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_THERMAL)
    assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) == 700000
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200000, 700000]


def test_remapped_rows_answer_not_supported_while_mig_is_enabled(simulate):
    """nvml.h (nvmlDeviceGetRemappedRows): NOT_SUPPORTED "If MIG is enabled". Before, a
    scenario's remapped rows were answered on a MIG-enabled GPU."""
    simulate("h100-mig")  # its parent has remapped_rows and MIG enabled
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(pynvml.nvmlDeviceGetHandleByIndex(0))


def test_remapped_rows_on_a_board_without_ecc_are_refused():
    """A GeForce has no ECC and no row remapping (the driver answers NOT_SUPPORTED), so a
    scenario cannot describe one with remapped rows."""
    device = {k: v for k, v in BOARD.items() if k != "ecc"}
    with pytest.raises(
        sim.ScenarioError, match=r"devices\[0\]\.remapped_rows: a board without ecc"
    ):
        sim.scenario_from_data(_scenario(device))


def test_remapped_rows_change_over_time(simulate):
    trace = {"pattern": "trace", "per": "cycle"}
    device = {
        **BOARD,
        "remapped_rows": {
            "correctable": {**trace, "values": [0, 1, 1, 1]},
            "uncorrectable": 0,
            "pending": {**trace, "values": [0, 1, 0, 0]},  # pending until the GPU reset
            "failure": False,
        },
    }
    overrides = [  # the raw output, as for any other call with outputs
        {
            "function": "nvmlDeviceGetRemappedRows",
            "field": "failureOccurred",
            "value": 1,
            "from_cycle": 4,
        },
    ]
    drv = simulate({**_scenario(device), "overrides": overrides}, latency="off")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    seen = []
    for _ in range(4):
        seen.append(tuple(pynvml.nvmlDeviceGetRemappedRows(h)))
        drv.next_cycle()
    assert seen == [(0, 0, 0, 0), (1, 0, 1, 0), (1, 0, 0, 0), (1, 0, 0, 1)]


def test_board_outputs_accept_overrides():
    """Every output a board handler can write is an override field (before, NvLinkState,
    RemappedRows, BAR1, fans, violations and encoder stats were refused by the checks)."""
    for function, field in [
        ("nvmlDeviceGetNvLinkState", "value"),
        ("nvmlDeviceGetNvLinkErrorCounter", "value"),
        ("nvmlDeviceGetRemappedRows", "isPending"),
        ("nvmlDeviceGetBAR1MemoryInfo", "bar1Used"),
        ("nvmlDeviceGetFanSpeed_v2", "value"),
        ("nvmlDeviceGetViolationStatus", "violationTime"),
        ("nvmlDeviceGetEncoderStats", "sessionCount"),
        ("nvmlDeviceGetPowerManagementLimitConstraints", "maxLimit"),
    ]:
        data = {**_scenario(), "overrides": [{"function": function, "field": field, "value": 1}]}
        sim.scenario_from_data(data)


def test_omitted_readings_answer_not_supported(simulate):
    simulate(_scenario({"uuid": UUID0}))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for call in (
        lambda: pynvml.nvmlDeviceGetNvLinkState(h, 0),
        lambda: pynvml.nvmlDeviceGetNumFans(h),
        lambda: pynvml.nvmlDeviceGetBAR1MemoryInfo(h),
        lambda: pynvml.nvmlDeviceGetRemappedRows(h),
        lambda: pynvml.nvmlDeviceGetViolationStatus(h, 0),
        lambda: pynvml.nvmlDeviceGetEncoderStats(h),
        lambda: pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h),
        lambda: pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()


def test_the_440_driver_has_no_remapped_rows_or_per_fan_calls(simulate):
    simulate(_scenario(profile="440"))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for call in (
        lambda: pynvml.nvmlDeviceGetRemappedRows(h),
        lambda: pynvml.nvmlDeviceGetNumFans(h),
        lambda: pynvml.nvmlDeviceGetFanSpeed_v2(h, 0),
    ):
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            call()


def test_board_calls_answer_not_supported_on_mig_handles_and_encoder_under_mig(simulate):
    simulate("h100-mig")
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    for call in (
        lambda: pynvml.nvmlDeviceGetBAR1MemoryInfo(mig),
        lambda: pynvml.nvmlDeviceGetNvLinkState(mig, 0),
        lambda: pynvml.nvmlGpmQueryDeviceSupport(mig),
        lambda: pynvml.nvmlDeviceGetEncoderStats(parent),  # MIG enabled
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()
    assert pynvml.nvmlDeviceGetBAR1MemoryInfo(parent).bar1Total == 137438953472


@pytest.mark.parametrize(
    "change, path",
    [
        ({"nvlink": {"links": 4, "down": [9]}}, "devices[0].nvlink"),
        ({"nvlink": {"links": 4, "down": [{"link": 4, "from_cycle": 2}]}}, "devices[0].nvlink"),
        ({"nvlink": {"links": 2, "per_link": {2: {}}}}, "devices[0].nvlink"),
        ({"nvlink": {"links": 2, "data_tx_kib": 5, "per_link": {0: {}}}}, "devices[0].nvlink"),
        (
            {"ecc": {}, "remapped_rows": {"pending": {"pattern": "trace", "values": [0, 2]}}},
            "devices[0].remapped_rows.pending",
        ),
        ({"bar1": {"total_bytes": 10, "used_bytes": 11}}, "devices[0].bar1.used_bytes"),
        ({"fans_percent": [-1]}, "devices[0].fans_percent[0]"),
        (
            {"power": {"min_limit_mw": 9, "max_limit_mw": 8}},
            "devices[0].power.min_limit_mw",
        ),
    ],
)
def test_board_scenario_errors_name_the_field(change, path):
    with pytest.raises(sim.ScenarioError, match=path.replace("[", r"\[").replace("]", r"\]")):
        sim.scenario_from_data(_scenario({"uuid": UUID0, **change}))


def test_retired_pages_with_the_size_probe(simulate):
    """nvml.h: pageCount 0 queries the size (INSUFFICIENT_SIZE with the count); nvidia-ml-py's
    wrapper makes that probe, then reads with 2n+5 entries. The symbol did not exist."""
    from nvmlsim.symbols.board import retired_page_address

    drv = simulate(_scenario(), latency="off")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    sbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    dbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    assert pynvml.nvmlDeviceGetRetiredPages(h, sbe) == [
        retired_page_address(0, k) for k in range(3)
    ]
    assert pynvml.nvmlDeviceGetRetiredPages(h, dbe) == [retired_page_address(1, 0)]
    assert drv.call_count("nvmlDeviceGetRetiredPages", 0) == 4  # a probe and a read each
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == 0
    # the probe itself, and a buffer too small, as the C library answers them
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetRetiredPages")
    count = ctypes.c_uint(0)
    assert fn(h, sbe, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 3
    count.value, pages = 2, (ctypes.c_ulonglong * 2)()
    assert fn(h, sbe, ctypes.byref(count), pages) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 3 and list(pages) == [0, 0]
    assert fn(h, 7, ctypes.byref(count), pages) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    without = {k: v for k, v in BOARD.items() if k != "retired_pages"}
    sim.uninstall()
    simulate(_scenario(without))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPages(h, sbe)


def test_no_retired_pages_answers_the_probe_with_success(simulate):
    device = {**BOARD, "retired_pages": {"single_bit": 0, "double_bit": 0, "pending": True}}
    simulate(_scenario(device))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    sbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    assert pynvml.nvmlDeviceGetRetiredPages(h, sbe) == []
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == 1
