"""NVLink, fans, P-state, BAR1, remapped rows, retired pages, violations, encoder sessions and
power limits: values from the scenario, semconv shapes, unsupported sources, call budget."""

import importlib.util
import logging
import sys
from pathlib import Path

import pynvml
from gpumetrics.metrics import names
from gpumetrics.metrics.spec import catalogue
from gpumetrics.nvml import records

import nvmlsim as sim

STEADY = {"cycle_timeout_s": 60.0}
ROOT = Path(__file__).resolve().parents[2]
GPU3 = "GPU-91f3b6d2-0e8a-4c57-9d1b-7a2c4e6f8b05"
DEVICE = "GPU-cd000000-0000-4000-8000-000000000000"
PROF = {n for n in catalogue().metrics if n.startswith("nvidia.gpu.prof.")}
NEW = PROF | {
    names.MetricGPUPowerLimitConstraint,
    names.MetricGPUPerformanceState,
    names.MetricFanSpeedRatio,
    names.MetricGPUBAR1MemoryUsage,
    names.MetricGPUBAR1MemoryLimit,
    names.MetricGPUViolationTime,
    names.MetricGPUMemoryRemappedRows,
    names.MetricGPUMemoryRowRemapPending,
    names.MetricGPUMemoryRowRemapFailure,
    names.MetricGPUMemoryRetiredPages,
    names.MetricGPUMemoryRetiredPagesPending,
    names.MetricGPUEncoderSessions,
    names.MetricGPUEncoderFPS,
    names.MetricGPUEncoderLatency,
    names.MetricNetworkUp,
    names.MetricGPUNVLinkIO,
}
"""The metrics issue 14 added (hw.errors got NVLink links too)."""


def _device(**fields):
    return {"format": 1, "devices": [{"uuid": DEVICE, **fields}]}


def test_h100_node_reports_the_board_metrics_with_the_scenarios_values(nvml_run, helpers):
    run = nvml_run("h100-8x-training", helpers.settings(**STEADY))
    run.cycle(2)
    out = run.output()
    uuids = {d.uuid for d in run.col.devices()}
    t0 = run.drv.scenario.clock.start_unix
    for label, watts in (("default", 700.0), ("min", 200.0), ("max", 700.0)):
        points = out.find(
            names.MetricGPUPowerLimitConstraint, nvidia__gpu__power__limit__type=label
        )
        assert {p.attrs["hw.id"] for p in points} == uuids and {p.value for p in points} == {watts}
    assert set(out.values(names.MetricGPUPerformanceState)) == {0}
    assert set(out.values(names.MetricGPUBAR1MemoryLimit)) == {137438953472}
    assert set(out.values(names.MetricGPUBAR1MemoryUsage)) == {71303168}
    assert len(out.find(names.MetricGPUEncoderSessions)) == 16 and set(
        out.values(names.MetricGPUEncoderSessions)
    ) == {0}
    # no session: the driver's averages describe nothing and are not exported
    assert out.find(names.MetricGPUEncoderFPS) == out.find(names.MetricGPUEncoderLatency) == []
    # NVLink data counters: cumulative KiB -> By, a ramp in the scenario
    tx = out.find(names.MetricGPUNVLinkIO, hw__id=GPU3, network__io__direction="transmit")
    assert [p.value for p in tx] == [(15200000000000 + 59000000 * k) * 1024 for k in (0, 1)]
    assert tx[0].start == tx[1].start == tx[0].time
    # every link of every GPU is up (errors_interval_s cadence: read in cycle 1)
    up = out.find(names.MetricNetworkUp)
    assert len(up) == 8 * 18 and {p.value for p in up} == {1}
    assert {p.attrs["hw.id"] for p in up if p.attrs["hw.parent"] == GPU3} == {
        f"{GPU3}:nvlink:{n}" for n in range(18)
    }
    assert {p.attrs["hw.name"] for p in up if p.attrs["hw.parent"] == GPU3} == {
        f"gpu3/nvlink{n}" for n in range(18)
    }
    # hw.errors on links: error.type only where an error occurred (GPU 3, link 7)
    link_errors = out.find(names.MetricErrors, hw__type="network")
    marginal = {
        p.attrs.get("error.type"): p.value
        for p in link_errors
        if p.attrs["hw.id"] == f"{GPU3}:nvlink:7"
    }
    assert marginal == {"replay": 14, "recovery": 1}
    clean = [p for p in link_errors if p.attrs["hw.id"] != f"{GPU3}:nvlink:7"]
    assert len(clean) == 8 * 18 - 1 and all(
        "error.type" not in p.attrs and p.value == 0 for p in clean
    )
    # violation time: cumulative ns -> s; the power cap
    power = out.find(
        names.MetricGPUViolationTime, hw__id=GPU3, nvidia__gpu__violation__policy="power"
    )
    assert [p.value for p in power] == [207360.0]
    assert power[0].start == power[0].time == round(t0 * 1e9)
    assert len(out.find(names.MetricGPUViolationTime, hw__id=GPU3)) == 8
    assert set(out.values(names.MetricGPUMemoryRemappedRows)) == {0}
    assert {p.attrs["error.type"] for p in out.find(names.MetricGPUMemoryRemappedRows)} == {
        "corrected",
        "uncorrected",
    }
    # passively cooled, and Hopper remaps rows instead of retiring pages: NOT_SUPPORTED
    assert out.find(names.MetricFanSpeedRatio) == []
    assert out.find(names.MetricGPUMemoryRetiredPages) == []
    assert run.calls("nvmlDeviceGetNumFans", 0) == 1
    present = {p.metric for p in out.points}
    missing = NEW - present
    assert missing == {
        names.MetricGPUProfEngineActivity,  # off by default (collection.enabled_metrics)
        names.MetricFanSpeedRatio,
        names.MetricGPUMemoryRetiredPages,
        names.MetricGPUMemoryRetiredPagesPending,
        names.MetricGPUEncoderFPS,
        names.MetricGPUEncoderLatency,
    }, missing
    assert run.failures() == 0


def test_old_driver_v100_gets_no_new_source_but_its_pstate_and_no_warning(
    nvml_run, helpers, caplog
):
    run = nvml_run("old-driver-v100", helpers.settings(**STEADY))
    with caplog.at_level(logging.INFO, logger="gpumetrics.nvml"):
        run.cycle(12)  # past errors_interval_s: the slow sources were tried twice
    out = run.output()
    # the profile (predating these sources) gives a P-state and nothing else new
    assert {p.metric for p in out.points} & NEW == {names.MetricGPUPerformanceState}
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    for fn in (
        "nvmlDeviceGetNumFans",
        "nvmlDeviceGetBAR1MemoryInfo",
        "nvmlDeviceGetEncoderStats",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetPowerManagementLimitConstraints",
    ):
        for index in range(4):
            assert run.calls(fn, index) == 1, (fn, index)
    for index in range(4):
        assert run.calls("nvmlDeviceGetFieldValues", index) == 2  # NVLink fields, retired pages
        assert run.calls("nvmlDeviceGetViolationStatus", index) == 8  # each policy once
        assert run.calls("nvmlDeviceGetNvLinkState", index) == 0  # no link count, no link
    # one line per capability (the violation policies together), none per tick
    per_gpu = [r.getMessage() for r in caplog.records if "GPU-1a2b3c4d" in r.getMessage()]
    assert len(per_gpu) == len(set(per_gpu)) and len(per_gpu) <= 12, per_gpu
    assert run.failures() == 0


def test_fans_are_components_of_their_gpu(nvml_run, helpers):
    run = nvml_run("geforce-rtx-4090", helpers.settings(**STEADY))
    run.cycle(2)
    fans = run.output().find(names.MetricFanSpeedRatio)
    uuid = run.col.devices()[0].uuid
    assert {(p.attrs["hw.id"], p.attrs["hw.name"], p.attrs["hw.parent"]) for p in fans} == {
        (f"{uuid}:fan:0", "gpu0/fan0", uuid),
        (f"{uuid}:fan:1", "gpu0/fan1", uuid),
    }
    assert all(0.30 <= p.value <= 0.66 for p in fans)
    assert run.calls("nvmlDeviceGetNumFans", 0) == 1
    assert run.calls("nvmlDeviceGetFanSpeed_v2", 0) == 4


def test_fan_speed_above_100_percent_is_kept_garbage_dropped(nvml_run, helpers):
    run = nvml_run(_device(fans_percent=[115, 4000]), helpers.settings(**STEADY))
    run.cycle()
    assert run.output().values(names.MetricFanSpeedRatio) == [1.15]
    assert run.dropped("out_of_range") == 1


def test_encoder_sessions_with_their_averages(nvml_run, helpers):
    stats = {"sessions": 3, "average_fps": 59, "average_latency_us": 2500}
    run = nvml_run(_device(encoder_stats=stats), helpers.settings(**STEADY))
    run.cycle(2)
    out = run.output()
    sessions = out.find(names.MetricGPUEncoderSessions)
    assert [p.value for p in sessions] == [3, 3] and sessions[0].start == sessions[1].start
    assert out.values(names.MetricGPUEncoderFPS) == [59.0, 59.0]
    assert out.values(names.MetricGPUEncoderLatency) == [0.0025, 0.0025]


def test_retired_pages_and_their_pending_flag_before_ampere(nvml_run, helpers):
    retired = {"single_bit": 4, "double_bit": 1, "pending": True}
    run = nvml_run(_device(retired_pages=retired), helpers.settings(**STEADY))
    run.cycle()
    out = run.output()
    pages = {p.attrs["error.type"]: p.value for p in out.find(names.MetricGPUMemoryRetiredPages)}
    assert pages == {"corrected": 4, "uncorrected": 1}
    assert out.values(names.MetricGPUMemoryRetiredPagesPending) == [1]
    assert out.find(names.MetricGPUMemoryRemappedRows) == []  # NOT_SUPPORTED without a model


def test_remapped_rows_flags_and_counter_reset(nvml_run, helpers):
    rows = {
        "correctable": {"pattern": "trace", "values": [2, 2, 0]},
        "uncorrectable": 1,
        "pending": True,
        "failure": True,
    }
    run = nvml_run(
        _device(ecc={}, remapped_rows=rows), helpers.settings(errors_interval_s=1.0, **STEADY)
    )
    run.cycle(3)
    out = run.output()
    corrected = out.find(names.MetricGPUMemoryRemappedRows, error__type="corrected")
    assert [p.value for p in corrected] == [2, 2, 0]
    assert corrected[0].start == corrected[1].start == corrected[0].time
    assert corrected[2].start == corrected[1].time  # a decrease: new series from the last read
    assert out.values(names.MetricGPUMemoryRowRemapPending) == [1, 1, 1]
    assert out.values(names.MetricGPUMemoryRowRemapFailure) == [1, 1, 1]


def test_violation_counters_per_policy_on_the_slow_cadence(nvml_run, helpers):
    violations = {"thermal": {"pattern": "ramp", "start": 5_000_000_000, "per_s": 250_000_000}}
    run = nvml_run(_device(violations_ns=violations), helpers.settings(**STEADY))
    run.cycle(11)
    thermal = run.output().find(names.MetricGPUViolationTime)
    assert [(p.attrs["nvidia.gpu.violation.policy"], p.value) for p in thermal] == [
        ("thermal", 5.0),
        ("thermal", 7.5),  # 10 s later: errors_interval_s
    ]
    assert thermal[0].start == thermal[1].start
    # the other seven policies answered NOT_SUPPORTED once each
    assert run.calls("nvmlDeviceGetViolationStatus", 0) == 7 + 2


def test_power_limit_falls_back_to_the_management_limit_once(nvml_run, helpers, caplog):
    power = {"usage_mw": 90000, "management_limit_mw": 250000}
    run = nvml_run(_device(power=power), helpers.settings(**STEADY))
    with caplog.at_level(logging.INFO, logger="gpumetrics.nvml"):
        run.cycle(3)
    assert run.output().values(names.MetricGPUPowerLimit) == [250.0] * 3
    assert run.calls("nvmlDeviceGetEnforcedPowerLimit", 0) == 1
    notes = [r for r in caplog.records if "reporting the management limit" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.INFO


def test_power_limit_constants_are_read_once(nvml_run, helpers):
    run = nvml_run("h100-sxm", helpers.settings(**STEADY))
    run.cycle(4)
    assert len(run.output().find(names.MetricGPUPowerLimitConstraint)) == 3 * 4
    assert run.calls("nvmlDeviceGetPowerManagementDefaultLimit", 0) == 1
    assert run.calls("nvmlDeviceGetPowerManagementLimitConstraints", 0) == 1


def test_a_link_that_is_down_has_no_error_reads(nvml_run, helpers):
    nvlink = {"links": 3, "down": [1], "errors": {2: {"crc_data": 6}}}
    run = nvml_run(_device(nvlink=nvlink), helpers.settings(**STEADY))
    asked: list[list] = []
    real = records.field_values

    def spy(handle, fields, buffers):  # records what is asked; the real call (and driver) answers
        asked.append(list(fields))
        return real(handle, fields, buffers)

    records.field_values = spy
    try:
        run.cycle()
    finally:
        records.field_values = real
    out = run.output()
    assert [(p.attrs["hw.id"][-1], p.value) for p in out.find(names.MetricNetworkUp)] == [
        ("0", 1),
        ("1", 0),
        ("2", 1),
    ]
    errors = {
        (p.attrs["hw.id"][-1], p.attrs.get("error.type"), p.value)
        for p in out.find(names.MetricErrors, hw__type="network")
    }
    assert errors == {("0", None, 0), ("2", "crc_data", 6)}
    # the counters of links 0 and 2 come from one field-values read that names no field of
    # link 1 (down); no per-link call is needed below link 12
    (errors_read,) = [f for f in asked if pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0 in f]
    link1 = {getattr(pynvml, f"NVML_FI_DEV_NVLINK_{c}_ERROR_COUNT_L1") for c in COUNTERS}
    assert len(errors_read) == 2 * 4 and not link1 & set(errors_read)
    assert run.calls("nvmlDeviceGetNvLinkErrorCounter", 0) == 0
    # every link's state from one field-values read, no per-link state call
    assert [(pynvml.NVML_FI_DEV_NVLINK_GET_STATE, n) for n in range(3)] in asked
    assert run.calls("nvmlDeviceGetNvLinkState", 0) == 0


COUNTERS = ("REPLAY", "RECOVERY", "CRC_FLIT", "CRC_DATA")


def test_links_without_a_per_link_field_fall_back_to_the_per_link_call(nvml_run, helpers):
    """Links 12 and up: replay and recovery scoped by link, CRC by nvmlDeviceGetNvLinkErrorCounter;
    a driver that answers none of the fields: one field read, then the per-link calls."""
    nvlink = {"links": 14, "errors": {13: {"replay": 3, "crc_flit": 2}, 4: {"recovery": 5}}}
    run = nvml_run(_device(nvlink=nvlink), helpers.settings(**STEADY))
    run.cycle()
    got = {
        (p.attrs["hw.id"].rsplit(":", 1)[1], p.attrs.get("error.type"), p.value)
        for p in run.output().find(names.MetricErrors, hw__type="network")
        if p.attrs.get("error.type")
    }
    assert got == {("13", "replay", 3), ("13", "crc_flit", 2), ("4", "recovery", 5)}
    assert run.calls("nvmlDeviceGetNvLinkErrorCounter", 0) == 2 * 2  # CRC of links 12, 13
    # one each: the data counters, every link's state, every link's error counters, the
    # retired pages (first read)
    assert run.calls("nvmlDeviceGetFieldValues", 0) == 4


def test_a_driver_without_the_error_fields_reads_every_counter_per_link(nvml_run, helpers):
    nvlink = {"links": 2, "errors": {1: {"crc_data": 4}}, "error_fields": False}
    run = nvml_run(_device(nvlink=nvlink), helpers.settings(**STEADY, errors_interval_s=1.0))
    run.cycle(2)
    errors = {
        (p.attrs["hw.id"].rsplit(":", 1)[1], p.attrs.get("error.type"), p.value)
        for p in run.output().find(names.MetricErrors, hw__type="network")
    }
    assert ("1", "crc_data", 4) in errors and ("0", None, 0) in errors
    assert run.calls("nvmlDeviceGetNvLinkErrorCounter", 0) == 2 * 2 * 4  # both reads, per link
    # the error fields answered NOT_SUPPORTED once and are not asked again: 2 data-counter
    # reads, 2 link-state reads, 1 error-field read, 1 retired-page read (none either)
    assert run.calls("nvmlDeviceGetFieldValues", 0) == 6


def test_a_driver_without_the_state_field_reads_each_links_state(nvml_run, helpers):
    nvlink = {"links": 3, "down": [2], "state_field": False}
    run = nvml_run(_device(nvlink=nvlink), helpers.settings(**STEADY, errors_interval_s=1.0))
    run.cycle(2)
    up = [(p.attrs["hw.id"][-1], p.value) for p in run.output().find(names.MetricNetworkUp)]
    assert up == [("0", 1), ("1", 1), ("2", 0)] * 2
    assert run.calls("nvmlDeviceGetNvLinkState", 0) == 2 * 3  # both reads, per link
    # the state fields answered NOT_SUPPORTED once and are not asked again: 2 data-counter
    # reads, 1 link-state read, 2 error-field reads, 1 retired-page read
    assert run.calls("nvmlDeviceGetFieldValues", 0) == 6


def test_a_link_state_other_than_active_or_inactive_is_read_per_link(nvml_run, helpers):
    """NVML_NVLINK_STATE_SLEEP (2) from the field: what nvmlDeviceGetNvLinkState says counts."""
    sleeping = {pynvml.NVML_FI_DEV_NVLINK_GET_STATE: {"value": 2, "scope_id": 1, "value_type": 1}}
    run = nvml_run(_device(nvlink={"links": 2}, field_values=sleeping), helpers.settings(**STEADY))
    run.cycle()
    up = [(p.attrs["hw.id"][-1], p.value) for p in run.output().find(names.MetricNetworkUp)]
    assert up == [("0", 1), ("1", 1)]
    # link 0's field is not answered (the scenario names only link 1's), link 1's is SLEEP:
    # both read per link
    assert run.calls("nvmlDeviceGetNvLinkState", 0) == 2


def _minimum():
    spec = importlib.util.spec_from_file_location(
        "nvml_minimum", ROOT / "benchmarks" / "nvml_minimum.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it is executed
    spec.loader.exec_module(module)
    return module


def test_calls_per_cycle_are_the_catalogue_minimum(nvml_run, helpers):
    minimum = _minimum()
    assert minimum.check_catalogue() == []
    data = sim.load_scenario("h100-sxm").model_dump(mode="json", exclude_unset=True)
    device = data["devices"][0]
    data["devices"] = [
        {**device, "uuid": f"GPU-ee000000-0000-4000-8000-00000000000{i}", "index": i}
        for i in range(2)
    ]
    data["driver"]["pcie_window_ms"] = 0
    settings = helpers.settings(**STEADY)
    run = nvml_run(data, settings)
    run.cycle(3)  # discovery, capability answers, static reads, the first GPM sample
    run.drv.reset_calls()
    run.cycle(20)  # two errors_interval_s and pcie_interval_s reads among them
    facts = minimum.device_facts(device)
    assert facts.links == 18 and facts.fans == 0
    expected = 20 * minimum.minimum_calls(2, 1, settings, facts)
    assert sum(run.drv.calls.values()) == expected


def test_a_board_with_zero_nvlink_links_is_a_fact_not_a_warning(nvml_run, helpers, caplog):
    """Issue 28 item 6: a PCIe card answering NVML_FI_DEV_NVLINK_LINK_COUNT = 0 logged
    "dropped 1 value(s) (out_of_range) links=0" and counted a dropped value."""
    count = {"NVLINK_LINK_COUNT": {"value": 0, "value_type": "UNSIGNED_INT"}}
    run = nvml_run(_device(temperature_c=40, field_values=count), helpers.settings(**STEADY))
    with caplog.at_level(logging.INFO, logger="gpumetrics"):
        run.cycle(3)
    out = run.output()
    assert out.find(names.MetricNetworkUp) == [] and out.find(names.MetricGPUNVLinkIO) == []
    assert run.dropped("out_of_range") == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert run.calls("nvmlDeviceGetNvLinkState") == 0


def test_nvlink_io_is_the_sum_over_every_link(nvml_run, helpers):
    """nvml.h: the throughput fields' scopeId is the link (UINT_MAX: all links). The collector
    asked scope 0, which on a driver that answers per link is link 0 alone."""
    nvlink = {
        "links": 4,
        "per_link": {
            0: {"data_tx_kib": 100, "data_rx_kib": 1},
            1: {"data_tx_kib": 200, "data_rx_kib": 2},
            3: {"data_tx_kib": {"pattern": "ramp", "start": 400, "per_s": 10}, "data_rx_kib": 4},
        },
    }
    run = nvml_run(_device(nvlink=nvlink), helpers.settings(**STEADY))
    run.cycle(2)
    out = run.output()
    tx = out.values(names.MetricGPUNVLinkIO, network__io__direction="transmit")
    rx = out.values(names.MetricGPUNVLinkIO, network__io__direction="receive")
    assert tx == [700 * 1024, 710 * 1024] and rx == [7 * 1024, 7 * 1024]


def test_link_state_changes_over_time(nvml_run, helpers):
    nvlink = {"links": 2, "down": [{"link": 1, "from_cycle": 2, "until_cycle": 3}]}
    run = nvml_run(_device(nvlink=nvlink), helpers.settings(errors_interval_s=1.0, **STEADY))
    run.cycle(3)
    link1 = run.output().values(names.MetricNetworkUp, hw__id=f"{DEVICE}:nvlink:1")
    assert link1 == [1, 0, 1]


def test_remapped_rows_are_absent_on_a_mig_enabled_gpu(nvml_run, helpers):
    """nvml.h: nvmlDeviceGetRemappedRows answers NOT_SUPPORTED "If MIG is enabled"; the
    simulator used to answer the scenario's rows, so h100-mig reported them."""
    run = nvml_run("h100-mig", helpers.settings(**STEADY))
    run.cycle(2)
    out = run.output()
    for metric in (
        names.MetricGPUMemoryRemappedRows,
        names.MetricGPUMemoryRowRemapPending,
        names.MetricGPUMemoryRowRemapFailure,
    ):
        assert out.find(metric) == []
    assert run.calls("nvmlDeviceGetRemappedRows") == 1  # a capability answer: asked once
    assert run.errors("nvmlDeviceGetRemappedRows", "NOT_SUPPORTED") == 1
