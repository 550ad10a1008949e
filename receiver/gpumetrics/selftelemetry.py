"""The sidecar's own telemetry: counters and gauges rendered under scope ``gpumetrics.self``.

Every name must be declared in the ``self_metrics`` section of ``metrics/catalogue.yaml``
(instrument, unit, attribute keys), so the set of self-metrics is documented in one place.
Components take a :class:`SelfTelemetry` (default :data:`NO_TELEMETRY`) in their constructors;
nothing here is a module-level singleton.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from gpumetrics.metrics.buffer import Point
from gpumetrics.metrics.encode import encode_metric
from gpumetrics.metrics.spec import Instrument, MetricSpec, catalogue

_Key = tuple[str, tuple[tuple[str, str], ...]]
Attrs = Mapping[str, Any] | None
"""Attributes of one series (``None`` or empty: no attributes)."""


def _attrs(attributes: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    if not attributes:
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in attributes.items()))


class SelfTelemetry(Protocol):
    """What components may record about themselves."""

    def add(self, name: str, value: int | float = 1, attributes: Attrs = None) -> None:
        """Increase counter ``name`` (a catalogue ``counter``) for one attribute set."""

    def set(self, name: str, value: int | float, attributes: Attrs = None) -> None:
        """Set gauge ``name`` for one attribute set."""

    def replace(self, name: str, series: Mapping[tuple[tuple[str, str], ...], int | float]) -> None:
        """Replace every series of gauge ``name`` at once (series no longer present disappear)."""


class NoTelemetry:
    """A :class:`SelfTelemetry` that records nothing."""

    def add(self, name: str, value: int | float = 1, attributes: Attrs = None) -> None:
        """Do nothing."""

    def set(self, name: str, value: int | float, attributes: Attrs = None) -> None:
        """Do nothing."""

    def replace(self, name: str, series: Mapping[tuple[tuple[str, str], ...], int | float]) -> None:
        """Do nothing."""


NO_TELEMETRY = NoTelemetry()
"""The shared no-op instance (stateless, so sharing it is safe)."""


class WithAttributes:
    """A :class:`SelfTelemetry` that adds fixed attributes to every series it records.

    The log store of GPU events is a second ``BatchStore`` reporting under the same names as
    the metric store; wrapped with ``{"signal": "logs"}`` its series stay apart.

    Args:
        inner: where the series go.
        attributes: added to every series (a series' own attributes win on a clash).

    """

    def __init__(self, inner: SelfTelemetry, attributes: Mapping[str, Any]) -> None:
        self._inner = inner
        self._extra = dict(attributes)

    def add(self, name: str, value: int | float = 1, attributes: Attrs = None) -> None:
        """Increase counter ``name`` for the series with the fixed attributes added."""
        self._inner.add(name, value, {**self._extra, **(attributes or {})})

    def set(self, name: str, value: int | float, attributes: Attrs = None) -> None:
        """Set gauge ``name`` for the series with the fixed attributes added."""
        self._inner.set(name, value, {**self._extra, **(attributes or {})})

    def replace(self, name: str, series: Mapping[tuple[tuple[str, str], ...], int | float]) -> None:
        """Set each given series (fixed attributes added); series of ``name`` without them stay.

        Unlike :meth:`Telemetry.replace`, series no longer present are not removed: the wrapped
        sink's other series of ``name`` belong to someone else.
        """
        for attrs, value in series.items():
            self.set(name, value, dict(attrs))


class Telemetry:
    """Thread-safe in-memory self-telemetry.

    Args:
        specs: declared self-metrics (default: the catalogue's ``self_metrics``).
        clock_ns: wall clock in ns since the Unix epoch (injectable for tests).

    Raises (from ``add``/``set``): ``KeyError`` for an undeclared name, ``ValueError`` when a
    counter is decreased or a gauge name is used as a counter (and vice versa).

    """

    def __init__(
        self,
        specs: Mapping[str, MetricSpec] | None = None,
        clock_ns: Any = time.time_ns,
    ) -> None:
        self._specs = dict(specs if specs is not None else catalogue().self_metrics)
        self._clock_ns = clock_ns
        self._start_ns = clock_ns()
        self._lock = threading.Lock()
        self._values: dict[_Key, int | float] = {}

    def _spec(self, name: str, counter: bool) -> MetricSpec:
        spec = self._specs.get(name)
        if spec is None:
            raise KeyError(f"self-metric {name!r} is not declared in catalogue.yaml self_metrics")
        if (spec.instrument is Instrument.COUNTER) != counter:
            raise ValueError(f"self-metric {name!r} is a {spec.instrument.value}")
        return spec

    def add(self, name: str, value: int | float = 1, attributes: Attrs = None) -> None:
        """Increase counter ``name`` by ``value`` (>= 0)."""
        self._spec(name, counter=True)
        if value < 0:
            raise ValueError(f"self-metric {name!r}: counters only increase")
        key = (name, _attrs(attributes))
        with self._lock:
            self._values[key] = self._values.get(key, 0) + value

    def set(self, name: str, value: int | float, attributes: Attrs = None) -> None:
        """Set gauge ``name`` to ``value``."""
        self._spec(name, counter=False)
        with self._lock:
            self._values[(name, _attrs(attributes))] = value

    def replace(self, name: str, series: Mapping[tuple[tuple[str, str], ...], int | float]) -> None:
        """Replace all series of gauge ``name`` with ``series`` (attribute tuple → value)."""
        self._spec(name, counter=False)
        with self._lock:
            for key in [k for k in self._values if k[0] == name]:
                del self._values[key]
            for attrs, value in series.items():
                self._values[(name, tuple(sorted(attrs)))] = value

    def value(self, name: str, attributes: Attrs = None) -> int | float | None:
        """Return one series' current value, or None if never recorded (for tests and logs)."""
        with self._lock:
            return self._values.get((name, _attrs(attributes)))

    def total(self, name: str) -> int | float:
        """Sum of a metric over all its series (0 when none)."""
        with self._lock:
            return sum(v for (n, _), v in self._values.items() if n == name)

    def render(self, metrics: Any) -> int:
        """Append one OTLP ``Metric`` per recorded self-metric to ``metrics``; return the points.

        Counters are cumulative monotonic Sums starting at this object's creation time.
        """
        now = self._clock_ns()
        with self._lock:
            snapshot = list(self._values.items())
        by_name: dict[str, list[Point]] = {}
        for (name, attrs), value in sorted(snapshot, key=lambda kv: kv[0]):
            spec = self._specs[name]
            v = int(value) if spec.value_type.value == "int" else float(value)
            start = self._start_ns if spec.instrument.is_sum else 0
            by_name.setdefault(name, []).append(Point(v, now, attrs, start))
        n = 0
        for name, points in by_name.items():
            n += encode_metric(metrics.add(), self._specs[name], points)
        return n
