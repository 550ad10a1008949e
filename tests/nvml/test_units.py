"""Pure parts of the NVML layer: error kinds, unit conversions, sample decoding, state, settings."""

import ctypes
import logging

import pynvml
import pytest
from gpumetrics.metrics import names
from gpumetrics.nvml import convert
from gpumetrics.nvml.clocks import event_reason_values
from gpumetrics.nvml.counters import CounterTracker
from gpumetrics.nvml.query import ErrorKind, QueryError, classify, query
from gpumetrics.nvml.samples import Cursors, TimeBase, decode_samples, decode_value
from gpumetrics.nvml.settings import CollectionSettings
from gpumetrics.nvml.state import Backoff, DeviceHealth, HealthState
from pydantic import ValidationError

# --- query(): every failure to a closed kind --------------------------------------------------


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (pynvml.NVML_ERROR_NOT_SUPPORTED, ErrorKind.UNSUPPORTED),
        (pynvml.NVML_ERROR_NO_PERMISSION, ErrorKind.NO_PERMISSION),
        (pynvml.NVML_ERROR_GPU_IS_LOST, ErrorKind.GPU_LOST),
        (pynvml.NVML_ERROR_RESET_REQUIRED, ErrorKind.GPU_LOST),
        (pynvml.NVML_ERROR_NOT_FOUND, ErrorKind.NOT_FOUND),
        (pynvml.NVML_ERROR_NO_DATA, ErrorKind.NOT_FOUND),
        (pynvml.NVML_SUCCESS, ErrorKind.NOT_FOUND),  # SUCCESS on a sizing call
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, ErrorKind.FUNCTION_MISSING),
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, ErrorKind.INVALID),
        (pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, ErrorKind.INVALID),
        (pynvml.NVML_ERROR_TIMEOUT, ErrorKind.TIMEOUT),
        (pynvml.NVML_ERROR_UNKNOWN, ErrorKind.UNKNOWN),
        (pynvml.NVML_ERROR_INSUFFICIENT_SIZE, ErrorKind.UNKNOWN),
        (4242, ErrorKind.UNKNOWN),  # a code nobody mapped
    ],
)
def test_every_nvml_error_code_maps_to_one_kind(code, kind):
    err = classify("nvmlDeviceGetX", pynvml.NVMLError(code))
    assert err.kind is kind and err.code == code and err.function == "nvmlDeviceGetX"


def test_lifecycle_codes_are_flagged():
    for code in (
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    ):
        assert classify("f", pynvml.NVMLError(code)).lifecycle
    assert not classify("f", pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)).lifecycle


def test_library_mismatch_error_is_not_an_nvmlerror_but_is_caught():
    exc = pynvml.NVMLLibraryMismatchError("unversioned function called")
    assert not isinstance(exc, pynvml.NVMLError)
    err = classify("nvmlDeviceGetComputeRunningProcesses", exc)
    assert err.kind is ErrorKind.FUNCTION_MISSING and err.code_name == "FUNCTION_NOT_FOUND"


def test_unicode_decode_error_becomes_invalid_and_keeps_the_bytes():
    def bad_name():
        return b"\xf8\x01NVIDIA".decode()

    with pytest.raises(QueryError) as info:
        query("nvmlDeviceGetName", bad_name)
    assert info.value.kind is ErrorKind.INVALID and info.value.code_name == "UNICODE_DECODE_ERROR"
    assert info.value.cause.object == b"\xf8\x01NVIDIA"


def test_other_exceptions_propagate():
    with pytest.raises(ZeroDivisionError):
        query("f", lambda: 1 / 0)
    with pytest.raises(TypeError, match="not an NVML failure"):
        classify("f", ValueError("x"))


def test_unversioned_wrapper_on_driver_440_raises_the_mismatch_error_we_map(nvml_run):
    nvml_run("F04_driver_440_no_v2")
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(QueryError) as info:
            query(
                "nvmlDeviceGetComputeRunningProcesses",
                pynvml.nvmlDeviceGetComputeRunningProcesses,
                handle,
            )
        assert isinstance(info.value.cause, pynvml.NVMLLibraryMismatchError)
        assert info.value.kind is ErrorKind.FUNCTION_MISSING
    finally:
        pynvml.nvmlShutdown()


# --- conversions (table-driven) -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "reading", "expected"),
    [
        (convert.percent_to_ratio, 57, (0.57, None)),
        (convert.percent_to_ratio, 0, (0.0, None)),
        (convert.percent_to_ratio, 100, (1.0, None)),
        (convert.percent_to_ratio, 101, (None, "out_of_range")),
        (convert.percent_to_ratio, 808334905, (None, "out_of_range")),
        (convert.percent_to_ratio, -1, (None, "out_of_range")),
        (convert.mw_to_w, 60000, (60.0, None)),
        (convert.mw_to_w, 0xFFFFFFFF, (None, "sentinel")),
        (convert.mj_to_j, 1_250_000, (1250.0, None)),
        (convert.mj_to_j, 2**64 - 1, (None, "sentinel")),
        (convert.mhz_to_hz, 1980, (1.98e9, None)),
        (convert.mhz_to_hz, 0xFFFFFFFF, (None, "sentinel")),
        (convert.mhz_to_hz, 200_000, (None, "out_of_range")),
        (convert.pcie_kbps_to_bytes_per_s, 1200, (1200 * 1024.0, None)),
        (convert.pcie_kbps_to_bytes_per_s, 0xFFFFFFFF, (None, "sentinel")),
        (convert.bytes_value, 8589934592, (8589934592, None)),
        (convert.bytes_value, 2**64 - 1, (None, "sentinel")),
        (convert.bytes_value, None, (None, "sentinel")),
        (convert.celsius, 36, (36.0, None)),
        (convert.celsius, -5, (-5.0, None)),
        (convert.celsius, 4294967295, (None, "out_of_range")),
        (convert.count_value, 3, (3, None)),
        (convert.count_value, 2**64 - 1, (None, "sentinel")),
    ],
)
def test_conversions(fn, reading, expected):
    assert fn(reading) == expected


def test_pcie_kb_is_1024_bytes():
    assert convert.PCIE_KB == 1024


# --- sample decoding -------------------------------------------------------------------------


def _sample(ts, value_type, **member):
    s = pynvml.c_nvmlSample_t()
    s.timeStamp = ts
    for name, value in member.items():
        setattr(s.sampleValue, name, value)
    return s


def test_union_is_read_through_the_declared_member_not_as_64_bits():
    s = _sample(1, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, ullVal=(0x5A5A5A5A << 32) | 57)
    assert s.sampleValue.sllVal != 57  # what a 64-bit read would give
    assert decode_value(pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, s.sampleValue) == 57


@pytest.mark.parametrize(
    ("value_type", "member", "raw", "expected"),
    [
        (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 12.5, 12.5),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**40, 2**40),
        (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -7, -7),
        (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -3, -3),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 65535, 65535),
    ],
)
def test_every_value_type_decodes(value_type, member, raw, expected):
    assert decode_value(value_type, _sample(1, value_type, **{member: raw}).sampleValue) == expected


def test_unknown_value_type_is_dropped_and_counted():
    decoded = decode_samples(99, [_sample(5, 99, uiVal=1)], TimeBase(lambda: 0), 10**19)
    assert decoded.samples == [] and decoded.unknown_type == 1 and decoded.newest_us == 5


def test_timebase_epoch_and_boot_domains():
    boot_ns = 1_767_000_000 * 10**9
    tb = TimeBase(lambda: boot_ns)
    epoch_us = 1_767_225_600_000_000
    assert tb.to_unix_ns(epoch_us) == epoch_us * 1000
    assert tb.to_unix_ns(5_000_000) == boot_ns + 5_000_000_000  # 5 s after boot


def test_samples_each_keep_their_time_and_future_ones_are_dropped():
    uint = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    now_ns = 1_767_225_600_000_000 * 1000
    raw = [
        _sample(1_767_225_599_500_000, uint, uiVal=40),
        _sample(1_767_225_599_000_000, uint, uiVal=30),
        _sample(1_767_225_700_000_000, uint, uiVal=50),  # 100 s in the future
    ]
    decoded = decode_samples(uint, raw, TimeBase(lambda: 0), now_ns)
    assert [(s.time_unix_nano, s.value) for s in decoded.samples] == [
        (1_767_225_599_000_000_000, 30),
        (1_767_225_599_500_000_000, 40),
    ]
    assert decoded.future == 1 and decoded.newest_us == 1_767_225_700_000_000


def test_cursors_only_move_forward():
    c = Cursors()
    assert c.get(1) == 0
    c.advance(1, 100)
    c.advance(1, 50)
    c.advance(1, None)
    assert c.get(1) == 100


def test_clock_event_reasons_pass_unknown_bits_through():
    values = dict(event_reason_values(0x44 | 0x400))
    assert values["sw_power_cap"] == 1 and values["hw_thermal_slowdown"] == 1
    assert values["gpu_idle"] == 0 and values["bit_10"] == 1


# --- counters, back-off and state ---------------------------------------------------------------


def test_counter_reset_starts_a_new_series_at_the_previous_reading():
    t = CounterTracker("energy", logging.getLogger("test"))
    assert t.observe(1000, 10) == 10
    assert t.observe(1000, 20) == 10
    assert t.observe(1250, 30) == 10
    assert t.observe(3, 40) == 30
    assert t.observe(9, 50) == 30


def test_backoff_doubles_to_its_maximum_and_resets():
    b = Backoff(1.0, 4.0)
    assert b.due(0)
    assert b.failed(0) == 1_000_000_000 and not b.due(999_999_999) and b.due(1_000_000_000)
    assert b.failed(1_000_000_000) == 2_000_000_000
    assert b.failed(3_000_000_000) == 4_000_000_000
    assert b.failed(7_000_000_000) == 4_000_000_000
    b.reset()
    assert b.due(7_000_000_001)
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(2.0, 1.0)


def test_device_state_machine(caplog):
    h = DeviceHealth("GPU-x", Backoff(1.0, 1.0), logging.getLogger("test.state"))
    assert h.state is HealthState.OK
    h.tick_done(degraded=True, reason="UNKNOWN")
    assert h.state is HealthState.DEGRADED
    h.fail(0, "GPU_IS_LOST")
    assert h.failed and not h.probe_due(500_000_000) and h.probe_due(1_000_000_000)
    assert dict(h.status_values()) == {"ok": 0, "degraded": 0, "failed": 1, "predicted_failure": 0}
    h.tick_done(degraded=False)
    assert h.state is HealthState.OK


# --- settings -------------------------------------------------------------------------------------


def test_settings_defaults_and_validation_name_the_field():
    s = CollectionSettings()
    assert (s.interval_s, s.pcie_interval_s, s.call_timeout_s, s.cycle_deadline_s) == (
        1.0,
        10.0,
        2.0,
        1.0,
    )
    with pytest.raises(ValidationError, match="pcie_interval_s"):
        CollectionSettings(interval_s=5.0, pcie_interval_s=2.0)
    with pytest.raises(ValidationError, match="disabled_metrics"):
        CollectionSettings(disabled_metrics={"hw.nope"})
    with pytest.raises(ValidationError, match="unknown_key"):
        CollectionSettings(unknown_key=1)


def test_disabled_metrics_skip_their_nvml_calls(nvml_run, helpers):
    run = nvml_run(
        "F25_pcie_directions", helpers.settings(disabled_metrics={"nvidia.gpu.pcie.throughput"})
    )
    run.cycle()
    assert run.calls("nvmlDeviceGetPcieThroughput") == 0
    assert run.output().find("nvidia.gpu.pcie.throughput") == []


def test_struct_sizes_match_the_c_layouts():
    from gpumetrics.nvml.processes import _ProcessInfoV1

    assert ctypes.sizeof(_ProcessInfoV1) == 16
    assert ctypes.sizeof(pynvml.c_nvmlProcessInfo_v2_t) == 24


def test_default_off_metrics_are_collected_only_when_enabled():
    engine = names.MetricGPUProfEngineActivity
    assert not CollectionSettings().wants(engine)
    assert CollectionSettings(enabled_metrics={engine}).wants(engine)
    assert CollectionSettings().wants(names.MetricPower)
    with pytest.raises(ValidationError, match="also in disabled_metrics"):
        CollectionSettings(enabled_metrics={engine}, disabled_metrics={engine})
    with pytest.raises(ValidationError, match="enabled_metrics"):
        CollectionSettings(enabled_metrics={"nvidia.gpu.nope"})


def test_gpm_metric_layout_matches_the_binding():
    from gpumetrics.nvml import gpm

    assert gpm._METRIC.size == ctypes.sizeof(pynvml.c_nvmlGpmMetric_t)
    assert pynvml.c_nvmlGpmMetric_t.value.offset == 8
