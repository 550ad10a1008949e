"""Metric specifications loaded from ``catalogue.yaml``, the single source of truth.

A :class:`MetricSpec` fixes everything about a metric that is not a data point: name, OTLP shape
(Gauge, or cumulative Sum with its monotonicity), UCUM unit, value type, attribute keys (with enum
values where closed) and where the value comes from in NVML. Instrument mapping follows the
SDK's default aggregation (https://opentelemetry.io/docs/specs/otel/metrics/sdk/#default-aggregation),
which the semantic conventions' instruments assume: Gauge →
``Metric.gauge``; UpDownCounter → cumulative non-monotonic ``Metric.sum``; Counter → cumulative
monotonic ``Metric.sum``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader when PyYAML was built with it: the catalogue is parsed at every start."""


class Instrument(enum.Enum):
    """Semantic-conventions instrument kinds and their OTLP encoding."""

    GAUGE = "gauge"
    UPDOWNCOUNTER = "updowncounter"
    COUNTER = "counter"

    @property
    def is_sum(self) -> bool:
        """True when encoded as an OTLP cumulative ``Sum`` (counters), False for ``Gauge``."""
        return self is not Instrument.GAUGE

    @property
    def is_monotonic(self) -> bool:
        """True only for Counter (monotonic Sum)."""
        return self is Instrument.COUNTER


class ValueType(enum.Enum):
    """OTLP ``NumberDataPoint`` value: ``as_double`` or ``as_int``."""

    DOUBLE = "double"
    INT = "int"


@dataclass(frozen=True)
class GpmSource:
    """One GPM metric that feeds a catalogue metric.

    Attributes:
        metric: the ``NVML_GPM_METRIC_*`` name without its prefix (``SM_UTIL``).
        attributes: ``(key, value)`` pairs the points of this GPM metric carry.
        dcgm: the DCGM field it corresponds to (``DCGM_FI_PROF_SM_ACTIVE``).

    """

    metric: str
    attributes: tuple[tuple[str, str | int], ...] = ()
    dcgm: str = ""


@dataclass(frozen=True)
class DcgmField:
    """A dcgm-exporter field and the catalogue metric (and attributes) that answers it."""

    field: str
    metric: str
    attributes: tuple[tuple[str, str | int], ...] = ()
    note: str = ""


@dataclass(frozen=True)
class MetricSpec:
    """Everything about one metric except its data points.

    Attributes:
        name: OTLP metric name, e.g. ``hw.gpu.utilization``.
        description: one-line description written into ``Metric.description``.
        unit: UCUM unit written into ``Metric.unit`` (``1`` for ratios, ``By``, ``W``, ``J``,
            ``Hz``, ``Cel``, ``By/s``, ``{error}``).
        instrument: Gauge, UpDownCounter or Counter.
        value_type: double or int.
        attributes: attribute keys beyond the GPU's identity attributes, each mapped to its closed
            set of enum values (empty tuple = any value).
        ratio: values must lie in [0, 1].
        resource: ``host`` (device metrics) or ``process`` (per-process metrics); ``self`` for the
            sidecar's own telemetry.
        enabled: emitted by default.
        nvml: the NVML call(s) behind the value.
        nvidia_smi: the matching ``nvidia-smi --query-gpu`` field, or ``""``.
        constant: the seed's Python constant name, or ``""``.
        component: ``gpu``, or the component of a GPU a point's ``hw.id`` names (``fan``,
            ``nvlink``; ``hw.parent`` is the GPU's UUID).
        cadence: ``tick`` (every ``interval_s``), ``errors`` (every ``errors_interval_s``) or
            ``accounting`` (every ``accounting_interval_s``).
        gpm: the GPM metrics behind the value (empty for other sources).

    """

    name: str
    description: str
    unit: str
    instrument: Instrument
    value_type: ValueType
    attributes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    ratio: bool = False
    resource: str = "host"
    enabled: bool = True
    nvml: str = ""
    nvidia_smi: str = ""
    constant: str = ""
    component: str = "gpu"
    cadence: str = "tick"
    gpm: tuple[GpmSource, ...] = ()


@dataclass(frozen=True)
class Scope:
    """An OTLP instrumentation scope: name and the schema URL its metrics follow (may be empty)."""

    name: str
    schema_url: str = ""


@dataclass(frozen=True)
class Catalogue:
    """The parsed ``catalogue.yaml``: GPU metrics (``scope``), self-telemetry (``self_scope``)."""

    scope: Scope
    metrics: Mapping[str, MetricSpec]
    self_scope: Scope
    self_metrics: Mapping[str, MetricSpec]
    dcgm_exporter: tuple[DcgmField, ...] = ()


def _pairs(raw: Any) -> tuple[tuple[str, str | int], ...]:
    return tuple((str(k), v if isinstance(v, int) else str(v)) for k, v in (raw or {}).items())


def _gpm(raw: Any) -> tuple[GpmSource, ...]:
    return tuple(
        GpmSource(str(g["metric"]), _pairs(g.get("attributes")), str(g.get("dcgm", "")))
        for g in raw or ()
    )


_COMPONENTS = ("gpu", "fan", "nvlink")
_CADENCES = ("tick", "errors", "accounting")


def _spec(raw: Mapping[str, Any], where: str, default_resource: str) -> MetricSpec:
    try:
        attrs_raw = raw.get("attributes") or {}
        if isinstance(attrs_raw, list):
            attrs: dict[str, tuple[str, ...]] = {str(k): () for k in attrs_raw}
        else:
            attrs = {str(k): tuple(str(v) for v in (vals or ())) for k, vals in attrs_raw.items()}
        spec = MetricSpec(
            name=str(raw["name"]),
            description=str(raw["description"]),
            unit=str(raw["unit"]),
            instrument=Instrument(raw["instrument"]),
            value_type=ValueType(raw["value_type"]),
            attributes=attrs,
            ratio=bool(raw.get("ratio", False)),
            resource=str(raw.get("resource", default_resource)),
            enabled=bool(raw.get("enabled", True)),
            nvml=str(raw.get("nvml", "")),
            nvidia_smi=str(raw.get("nvidia_smi", "")),
            constant=str(raw.get("constant", "")),
            component=str(raw.get("component", "gpu")),
            cadence=str(raw.get("cadence", "tick")),
            gpm=_gpm(raw.get("gpm")),
        )
        if spec.component not in _COMPONENTS:
            raise ValueError(f"component must be one of {_COMPONENTS}")
        if spec.cadence not in _CADENCES:
            raise ValueError(f"cadence must be one of {_CADENCES}")
        return spec
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{where}: invalid metric spec: {exc!r}") from None


def parse_catalogue(text: str) -> Catalogue:
    """Parse catalogue YAML text.

    Raises:
        ValueError: naming the entry (``metrics[3]: ...``) when an entry is malformed or a name
            appears twice.

    """
    doc = yaml.load(text, Loader=_LOADER)  # noqa: S506 (a safe loader: libyaml's when present)
    metrics: dict[str, MetricSpec] = {}
    for i, raw in enumerate(doc["metrics"]):
        spec = _spec(raw, f"metrics[{i}]", "host")
        if spec.name in metrics:
            raise ValueError(f"metrics[{i}].name: duplicate metric {spec.name!r}")
        metrics[spec.name] = spec
    self_metrics: dict[str, MetricSpec] = {}
    for i, raw in enumerate(doc.get("self_metrics") or ()):
        spec = _spec(raw, f"self_metrics[{i}]", "self")
        if spec.name in self_metrics or spec.name in metrics:
            raise ValueError(f"self_metrics[{i}].name: duplicate metric {spec.name!r}")
        self_metrics[spec.name] = spec
    dcgm: list[DcgmField] = []
    for i, raw in enumerate(doc.get("dcgm_exporter") or ()):
        try:
            row = DcgmField(
                str(raw["field"]),
                str(raw["metric"]),
                _pairs(raw.get("attributes")),
                str(raw.get("note", "")),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"dcgm_exporter[{i}]: invalid row: {exc!r}") from None
        if row.metric not in metrics:
            raise ValueError(f"dcgm_exporter[{i}].metric: unknown metric {row.metric!r}")
        dcgm.append(row)
    return Catalogue(
        scope=Scope(**doc["scope"]),
        metrics=metrics,
        self_scope=Scope(**doc["self_scope"]),
        self_metrics=self_metrics,
        dcgm_exporter=tuple(dcgm),
    )


@cache
def catalogue() -> Catalogue:
    """Return the catalogue shipped with the package (parsed once)."""
    text = resources.files("gpumetrics.metrics").joinpath("catalogue.yaml").read_text("utf-8")
    return parse_catalogue(text)
