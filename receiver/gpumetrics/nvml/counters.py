"""Cumulative counters with reset detection (energy, ECC errors).

NVML's cumulative readings count since the driver was last loaded (energy in mJ, ECC errors), so
they restart from a small value after a driver reload or GPU reset, and they update coarsely
(energy about every 10 ms, so two reads can be equal) (NVML API reference,
``nvmlDeviceGetTotalEnergyConsumption``; field case F23).

A :class:`CounterTracker` turns those readings into an OTLP cumulative monotonic Sum (metrics
data model, "Sums" and "Cumulative streams: handling unknown start time",
https://opentelemetry.io/docs/specs/otel/metrics/data-model/):

- the first reading starts a series with ``start_time_unix_nano`` = its own time (a reset at an
  unknown time: the first point contributes no rate);
- equal or larger readings continue the series with the same start time;
- a smaller reading is a reset: a new series starts at the time of the previous reading (the
  reset happened after it; start < time marks a known reset with an implicit zero), and the
  value restarts from the new reading. No negative delta is ever exported, and a reset is not
  an error.
"""

from __future__ import annotations

import logging


class CounterTracker:
    """Start times of one cumulative counter series.

    Args:
        label: names the series in the reset log (``GPU-… energy``).
        log: resets are logged at INFO.

    """

    def __init__(self, label: str, log: logging.Logger) -> None:
        self._label = label
        self._log = log
        self._start_ns: int | None = None
        self._last_value: int | float | None = None
        self._last_ns = 0

    def observe(self, value: int | float, time_ns: int) -> int:
        """Record a reading taken at ``time_ns`` (Unix ns); return its series start time (ns)."""
        if self._start_ns is None or self._last_value is None:
            self._start_ns = time_ns
        elif value < self._last_value:
            self._log.info(
                "%s: counter went from %s to %s; starting a new series (driver reload or reset)",
                self._label,
                self._last_value,
                value,
            )
            self._start_ns = self._last_ns if self._last_ns < time_ns else time_ns
        self._last_value = value
        self._last_ns = time_ns
        return self._start_ns

    @property
    def start_ns(self) -> int | None:
        """The current series start (Unix ns), or None before the first reading."""
        return self._start_ns


class CounterSet:
    """Start times of a device's related counter series, one :class:`CounterTracker` each.

    Args:
        label: names the counters in reset logs (``GPU-… violation time``).
        log: resets are logged at INFO.

    """

    def __init__(self, label: str, log: logging.Logger) -> None:
        self._label = label
        self._log = log
        self._trackers: dict[object, CounterTracker] = {}

    def observe(self, key: object, value: int | float, time_ns: int) -> int:
        """Record series ``key``'s reading at ``time_ns``; return its series start time (ns)."""
        tracker = self._trackers.get(key)
        if tracker is None:
            tracker = self._trackers[key] = CounterTracker(f"{self._label} {key}", self._log)
        return tracker.observe(value, time_ns)


NO_ERROR = ""
"""The ``error.type`` key of the series that carries 0 while no error of any type occurred."""


def error_series(counts: dict[str, int]) -> list[tuple[str, int]]:
    """Return the ``hw.errors`` series to emit for ``counts`` (``error.type`` → count).

    ``error.type`` is conditionally required "if and only if an error has occurred" (semantic
    conventions, ``metric.hw.errors``): each type with a count above 0 is its own series; while
    no type has occurred, one series without ``error.type`` (key :data:`NO_ERROR`) carries 0.
    Nothing when ``counts`` is empty (nothing was read).
    """
    series = [(label, n) for label, n in counts.items() if n > 0]
    if counts and not series:
        series = [(NO_ERROR, 0)]
    return series


def counter_set(state: dict[str, object], name: str, label: str, log: logging.Logger) -> CounterSet:
    """Return the :class:`CounterSet` ``name`` of a device's ``state["counters"]``.

    Created on first use.

    Keeping every counter set under one key lets a device record carry them all across a
    re-initialisation or a recovery, so series keep their start times.
    """
    sets = state.setdefault("counters", {})
    assert isinstance(sets, dict)
    found = sets.get(name)
    if found is None:
        found = sets[name] = CounterSet(label, log)
    return found  # type: ignore[no-any-return]
