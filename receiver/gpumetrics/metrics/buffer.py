"""Per-resource buffers of data points: :class:`Point` and :class:`MetricBuffer`.

A buffer holds the points recorded for one resource (the host, or one process) since the last
``Producer.produce``. Metrics are created from their catalogue spec on first use, so a buffer never
holds a metric the catalogue does not describe.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from gpumetrics.metrics.spec import MetricSpec, ValueType

Attributes = tuple[tuple[str, Any], ...]
"""Point attributes as ordered ``(key, value)`` pairs (hashable; keys must be unique)."""


class UnknownMetricError(KeyError):
    """A metric name that is not in the catalogue."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown metric {self.name!r}: not in catalogue.yaml"


class Point(NamedTuple):
    """One OTLP ``NumberDataPoint``.

    Attributes:
        value: the reading in the metric's unit (int for ``value_type: int`` metrics).
        time_unix_nano: observation time, ns since the Unix epoch.
        attributes: point attributes (GPU attributes first, then the metric's own).
        start_time_unix_nano: start of a cumulative series, ns since the Unix epoch; required
            (non-zero) for Sum metrics, 0 (unset) for gauges.

    """

    value: int | float
    time_unix_nano: int
    attributes: Attributes = ()
    start_time_unix_nano: int = 0


Rules = tuple[bool, bool, bool]
"""What a metric's points must satisfy: ``(int only, ratio in [0, 1], cumulative sum)``."""


def spec_rules(spec: MetricSpec) -> Rules:
    """Return the :data:`Rules` of one metric's points, from its spec."""
    return (spec.value_type is ValueType.INT, spec.ratio, spec.instrument.is_sum)


def point_rules(specs: Mapping[str, MetricSpec]) -> dict[str, Rules]:
    """Return the :data:`Rules` of every spec in ``specs`` (shared by a producer's buffers)."""
    return {name: spec_rules(spec) for name, spec in specs.items()}


class MetricBuffer:
    """Data points per metric name for one resource.

    Args:
        specs: the metric specs this buffer may hold (name → spec), normally the catalogue's.
        rules: :func:`point_rules` of ``specs``, when the caller keeps them for many buffers
            (a producer makes one buffer per process and batch); otherwise each metric's are
            computed on its first use.

    """

    __slots__ = ("_specs", "_points", "_rules")

    def __init__(
        self, specs: Mapping[str, MetricSpec], rules: dict[str, Rules] | None = None
    ) -> None:
        self._specs = specs
        self._points: dict[str, list[Point]] = {}
        self._rules = rules if rules is not None else {}

    def points(self, name: str) -> list[Point]:
        """Return the mutable point list of metric ``name``, created on first use.

        Raises:
            UnknownMetricError: ``name`` is not in the catalogue.

        """
        pts = self._points.get(name)
        if pts is None:
            if name not in self._specs:
                raise UnknownMetricError(name)
            pts = self._points[name] = []
        return pts

    def add(
        self,
        name: str,
        value: int | float,
        time_unix_nano: int,
        attributes: Attributes = (),
        start_time_unix_nano: int = 0,
    ) -> Point:
        """Validate and append one point to metric ``name``; return it.

        Checks, from the spec: the value type (int metrics take ``int``, double metrics take
        ``int | float``), finiteness, ratio metrics within [0, 1], a non-zero start time for Sum
        metrics and a positive time. (The rules come from the specs once per producer:
        :func:`point_rules`.)

        Raises:
            UnknownMetricError: ``name`` is not in the catalogue.
            ValueError: naming the metric and the rule the point breaks. Callers drop and count
                readings they know to be garbage before they get here; this is the last guard.

        """
        int_only, ratio, is_sum = self._rules_of(name)
        kind = type(value)
        if kind is float:
            if int_only:
                raise ValueError(f"{name}: int metric given float {value!r}")
            if value - value != 0.0:  # NaN or ±inf
                raise ValueError(f"{name}: value {value!r} is not finite")
        elif kind is not int and (kind is bool or not isinstance(value, (int, float))):
            raise ValueError(f"{name}: value {value!r} is not a number")
        elif not isinstance(value, int) and int_only:  # float subclasses
            raise ValueError(f"{name}: int metric given {kind.__name__} {value!r}")
        if ratio and not 0.0 <= value <= 1.0:
            raise ValueError(f"{name}: ratio {value!r} outside [0, 1]")
        if time_unix_nano <= 0:
            raise ValueError(f"{name}: time_unix_nano must be > 0")
        if is_sum and start_time_unix_nano <= 0:
            raise ValueError(f"{name}: cumulative sum point needs start_time_unix_nano")
        point = Point(value, time_unix_nano, attributes, start_time_unix_nano)
        self.points(name).append(point)
        return point

    def extend(self, name: str, points: Iterable[Point]) -> int:
        """Validate and append ``points`` to metric ``name``; return how many were refused.

        The rules of :meth:`add`, checked in one loop (a cycle commits whole point lists): a
        point that breaks one is left out and counted, the others are kept in order.

        Raises:
            UnknownMetricError: ``name`` is not in the catalogue.

        """
        int_only, ratio, is_sum = self._rules_of(name)
        pts = self.points(name)
        refused = 0
        for p in points:
            value = p[0]
            kind = type(value)
            if (
                (kind is int or (kind is float and not int_only and value - value == 0.0))
                and (not ratio or 0.0 <= value <= 1.0)
                and p[1] > 0
                and (not is_sum or p[3] > 0)
            ):
                pts.append(p)
                continue
            try:  # not the common case: let add() decide (other number types) or refuse it
                self.add(name, *p)
            except ValueError:
                refused += 1
        return refused

    def _rules_of(self, name: str) -> Rules:
        rules = self._rules.get(name)
        if rules is None:
            spec = self._specs.get(name)
            if spec is None:
                raise UnknownMetricError(name)
            rules = self._rules[name] = spec_rules(spec)
        return rules

    def items(self) -> Iterator[tuple[MetricSpec, list[Point]]]:
        """Yield ``(spec, points)`` for every metric with at least one point, in first-use order."""
        for name, pts in self._points.items():
            if pts:
                yield self._specs[name], pts

    def __len__(self) -> int:
        """Total number of points held."""
        return sum(len(p) for p in self._points.values())

    def __bool__(self) -> bool:
        return any(self._points.values())
