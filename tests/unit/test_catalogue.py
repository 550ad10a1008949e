"""The catalogue is the single source of truth: constants, semconv shapes and docs must match it."""

from pathlib import Path

import pytest
from gpumetrics.metrics import names
from gpumetrics.metrics.docs import render_metrics_doc
from gpumetrics.metrics.spec import Instrument, ValueType, catalogue, parse_catalogue

ROOT = Path(__file__).resolve().parents[2]

# Semantic conventions v1.44.0, hardware metrics (https://opentelemetry.io/docs/specs/semconv/hardware/
# gpu/ and .../hardware/common/; model/hardware/*.yaml in open-telemetry/semantic-conventions):
# name -> (instrument, unit, value type)
SEMCONV = {
    "hw.gpu.utilization": (Instrument.GAUGE, "1", ValueType.DOUBLE),
    "hw.gpu.memory.usage": (Instrument.UPDOWNCOUNTER, "By", ValueType.INT),
    "hw.gpu.memory.limit": (Instrument.UPDOWNCOUNTER, "By", ValueType.INT),
    "hw.gpu.memory.utilization": (Instrument.GAUGE, "1", ValueType.DOUBLE),
    "hw.power": (Instrument.GAUGE, "W", ValueType.DOUBLE),
    "hw.energy": (Instrument.COUNTER, "J", ValueType.DOUBLE),
    "hw.temperature": (Instrument.GAUGE, "Cel", ValueType.DOUBLE),
    "hw.status": (Instrument.UPDOWNCOUNTER, "1", ValueType.INT),
    "hw.errors": (Instrument.COUNTER, "{error}", ValueType.INT),
    # .../hardware/fan/ and .../hardware/network/ (model/hardware/fan.yaml, network.yaml)
    "hw.fan.speed_ratio": (Instrument.GAUGE, "1", ValueType.DOUBLE),
    "hw.network.up": (Instrument.UPDOWNCOUNTER, "1", ValueType.INT),
}


def test_every_catalogue_metric_has_its_seed_constant():
    for spec in catalogue().metrics.values():
        assert spec.constant, f"{spec.name} has no constant"
        assert getattr(names, spec.constant) == spec.name


def test_every_metric_constant_is_in_the_catalogue():
    consts = {k: v for k, v in vars(names).items() if k.startswith("Metric")}
    assert set(consts.values()) == set(catalogue().metrics)


@pytest.mark.parametrize("name", sorted(SEMCONV))
def test_hw_metrics_follow_semantic_conventions(name):
    spec = catalogue().metrics[name]
    assert (spec.instrument, spec.unit, spec.value_type) == SEMCONV[name]


def test_only_semconv_names_use_the_hw_namespace():
    for name in catalogue().metrics:
        assert name in SEMCONV or name.startswith("nvidia."), name


def test_hw_type_on_exactly_the_metrics_that_require_it():
    # hw.type is required on hw.power/energy/errors/status and absent from hw.gpu.* (semconv)
    with_type = {n for n, s in catalogue().metrics.items() if "hw.type" in s.attributes}
    assert with_type == {"hw.power", "hw.energy", "hw.errors", "hw.status"}


def test_scope_is_the_seeds():
    assert catalogue().scope.name == names.ScopeName == "parca.nvidia_gpu_metrics"
    assert catalogue().scope.schema_url == names.SchemaURL


def test_ratio_metrics_have_unit_one():
    for spec in catalogue().metrics.values():
        if spec.ratio:
            assert spec.unit == "1" and spec.instrument is Instrument.GAUGE


def test_docs_metrics_md_is_generated_from_the_catalogue():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert doc == render_metrics_doc(catalogue()), (
        "run: python -m gpumetrics.metrics.docs > docs/metrics.md"
    )


def test_duplicate_names_are_rejected_naming_the_entry():
    text = """
scope: {name: s}
self_scope: {name: t}
metrics:
  - {name: a, description: d, unit: "1", instrument: gauge, value_type: double}
  - {name: a, description: d, unit: "1", instrument: gauge, value_type: double}
"""
    with pytest.raises(ValueError, match=r"metrics\[1\]\.name: duplicate"):
        parse_catalogue(text)


def test_bad_instrument_is_rejected_naming_the_entry():
    text = """
scope: {name: s}
self_scope: {name: t}
metrics:
  - {name: a, description: d, unit: "1", instrument: histogram, value_type: double}
"""
    with pytest.raises(ValueError, match=r"metrics\[0\]"):
        parse_catalogue(text)


def test_gpm_sources_name_bindings_metrics_and_catalogued_attribute_values():
    import pynvml

    seen = set()
    for spec in catalogue().metrics.values():
        for src in spec.gpm:
            assert isinstance(getattr(pynvml, f"NVML_GPM_METRIC_{src.metric}", None), int), src
            assert src.metric not in seen, f"{src.metric} feeds two metrics"
            seen.add(src.metric)
            assert src.dcgm.startswith("DCGM_FI_PROF_"), src
            for key, value in src.attributes:
                assert key in spec.attributes, (spec.name, key)
                allowed = spec.attributes[key]
                assert not allowed or value in allowed, (spec.name, key, value)
            assert spec.unit in ("1", "By/s") and spec.instrument is Instrument.GAUGE


def test_dcgm_exporter_rows_name_real_metrics_attributes_and_no_field_twice():
    cat = catalogue()
    fields = [src.dcgm for s in cat.metrics.values() for src in s.gpm]
    fields += [row.field for row in cat.dcgm_exporter]
    assert len(fields) == len(set(fields)), "a DCGM field is mapped twice"
    for row in cat.dcgm_exporter:
        spec = cat.metrics[row.metric]
        for key, value in row.attributes:
            assert key in spec.attributes, (row.field, key)
            allowed = spec.attributes[key]
            assert not allowed or value in allowed, (row.field, key, value)


def test_dcgm_exporter_row_naming_an_unknown_metric_is_rejected():
    text = """
scope: {name: s}
self_scope: {name: t}
metrics:
  - {name: a, description: d, unit: "1", instrument: gauge, value_type: double}
dcgm_exporter:
  - {field: DCGM_FI_DEV_GPU_UTIL, metric: b}
"""
    with pytest.raises(ValueError, match=r"dcgm_exporter\[0\]\.metric: unknown metric 'b'"):
        parse_catalogue(text)


def test_unknown_component_is_rejected_naming_the_entry():
    text = """
scope: {name: s}
self_scope: {name: t}
metrics:
  - {name: a, description: d, unit: "1", instrument: gauge, value_type: double, component: psu}
"""
    with pytest.raises(ValueError, match=r"metrics\[0\]: invalid metric spec"):
        parse_catalogue(text)
