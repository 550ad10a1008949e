"""The collector's OTLP output: shapes per the catalogue, static reads once, exact goldens."""

import pytest
from gpumetrics.metrics import names
from gpumetrics.metrics.spec import Instrument, ValueType, catalogue
from opentelemetry.proto.metrics.v1 import metrics_pb2

CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
STEADY = {"cycle_timeout_s": 60.0, "call_timeout_s": 60.0, "accounting_interval_s": 1.0}
"""Deadlines no loaded machine reaches: these outputs must not depend on wall time (a simulated
call past the default 2 s per-call deadline on a busy machine put a timeout in the output)."""
PROFILES = ["h100-sxm", "h100-8x-training", "a100-mig", "h100-mig", "gb10"]


def _scope_metrics(request):
    for rm in request.resource_metrics:
        yield from rm.scope_metrics


@pytest.mark.parametrize("profile", PROFILES)
def test_output_follows_the_catalogue(nvml_run, helpers, profile):
    run = nvml_run(profile, helpers.settings(**STEADY))
    run.cycle(3)
    request = run.prod.collect()
    specs = catalogue().metrics
    self_specs = catalogue().self_metrics
    seen = set()
    for sm in _scope_metrics(request):
        names_in_scope = [m.name for m in sm.metrics]
        assert len(names_in_scope) == len(set(names_in_scope)), "one Metric per name per scope"
        for m in sm.metrics:
            spec = specs.get(m.name) if sm.scope.name == names.ScopeName else self_specs.get(m.name)
            assert spec is not None, m.name
            seen.add(m.name)
            assert m.unit == spec.unit, m.name
            if spec.instrument is Instrument.GAUGE:
                assert m.WhichOneof("data") == "gauge", m.name
                points = m.gauge.data_points
            else:
                assert m.WhichOneof("data") == "sum", m.name
                assert m.sum.aggregation_temporality == CUMULATIVE, m.name
                assert m.sum.is_monotonic == (spec.instrument is Instrument.COUNTER), m.name
                points = m.sum.data_points
                for dp in points:
                    assert 0 < dp.start_time_unix_nano <= dp.time_unix_nano, m.name
            for dp in points:
                assert dp.time_unix_nano > 1_700_000_000 * 10**9, m.name  # Unix-epoch ns
                kind = dp.WhichOneof("value")
                assert kind == ("as_int" if spec.value_type is ValueType.INT else "as_double"), (
                    m.name
                )
                if spec.ratio:
                    assert 0.0 <= dp.as_double <= 1.0, m.name
                keys = [kv.key for kv in dp.attributes]
                assert len(keys) == len(set(keys)), m.name
                if sm.scope.name == names.ScopeName:
                    assert "hw.id" in keys, m.name
                    for key, allowed in spec.attributes.items():
                        value = next(
                            (kv.value.string_value for kv in dp.attributes if kv.key == key), None
                        )
                        if allowed and value is not None and not value.startswith("bit_"):
                            assert value in allowed, (m.name, key, value)
    assert names.MetricStatus in seen and names.MetricPower in seen


def test_hw_status_emits_every_state_each_cycle(nvml_run):
    run = nvml_run("h100-sxm")
    run.cycle(2)
    status = run.output().find(names.MetricStatus)
    assert len(status) == 2 * len(names.HwStates)
    assert sorted(p.value for p in status) == [0] * 6 + [1] * 2
    assert {p.attrs["hw.type"] for p in status} == {"gpu"}


def test_static_properties_are_read_once(nvml_run):
    run = nvml_run("h100-8x-training")
    run.cycle(10)
    for fn in (
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetVbiosVersion",
        "nvmlDeviceGetMigMode",
    ):
        for index in range(8):
            assert run.calls(fn, index) == 1, (fn, index)
    assert run.calls("nvmlSystemGetDriverVersion") == 1
    assert run.calls("nvmlDeviceGetCount_v2") == 1
    assert run.calls("nvmlDeviceGetHandleByIndex_v2") == 8
    # one read per tick: memory info feeds usage, limit and utilisation
    assert run.calls("nvmlDeviceGetMemoryInfo_v2", 0) == 10


def test_every_point_time_is_unix_epoch_ns_even_with_a_boot_clock_driver(nvml_run, helpers):
    data = helpers.variant("F18_discrete_gpu_memory", sample_clock="boot").model_dump(
        mode="json", exclude_unset=True
    )
    data["devices"][0]["samples"] = {"gpu_utilization": {}, "total_power": {}}
    run = nvml_run(data)
    run.cycle(2)
    dev = run.col.devices()[0]
    cursor = dev.cursors.get(1)
    uptime_us = round(run.drv.scenario.clock.uptime_s * 1e6)
    assert uptime_us <= cursor < uptime_us + 3_000_000  # the cursor stays in the boot domain
    out = run.output()
    now_ns = run.drv.now_us * 1000
    samples = out.find(names.MetricGPUUtilization, hw__gpu__task="general")
    assert len(samples) > 2  # each sample its own point
    for p in samples + out.find(names.MetricPower):
        assert now_ns - 3 * 10**9 < p.time <= now_ns  # converted to Unix-epoch ns
    assert len({p.time for p in samples}) == len(samples)


@pytest.mark.parametrize("profile", PROFILES)
def test_golden_output(nvml_run, helpers, update_golden, profile):
    run = nvml_run(profile, helpers.settings(**STEADY))
    run.cycle(2)
    text = helpers.golden_json(run.prod.collect())
    path = helpers.GOLDEN_DIR / f"{profile}.json"
    if update_golden:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        pytest.fail(f"wrote {path}; review the diff and rerun without --update-golden")
    assert path.exists(), f"no golden {path}: run pytest {__file__} --update-golden"
    assert text == path.read_text(), (
        f"{profile}: output differs from {path.name} (see --update-golden)"
    )


def test_hw_errors_carries_error_type_only_once_an_error_occurred(nvml_run, helpers):
    data = helpers.variant("F25_pcie_directions").model_dump(mode="json", exclude_unset=True)
    data["devices"][0]["ecc"] = {
        "volatile_corrected": {"pattern": "trace", "per": "cycle", "values": [0, 0, 3, 3]}
    }
    run = nvml_run(data, helpers.settings(errors_interval_s=1.0))
    run.cycle(4)
    errors = run.output().find(names.MetricErrors)
    assert [(p.value, p.attrs.get("error.type")) for p in errors] == [
        (0, None),
        (0, None),
        (3, "corrected"),
        (3, "corrected"),
    ]
    assert all(p.attrs["hw.type"] == "gpu" for p in errors)
    assert errors[2].start == errors[3].start
