"""Matching calls against a scenario's ``faults`` and ``overrides``.

A fault or override applies to a call when the function (or ``*``), device, enum argument,
call kind (sizing/data) and time window match; each keeps its own count of matching calls so
``after_calls`` and ``calls`` work per entry. Used under the driver's lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvmlsim.model.scenario import Fault, Override
from nvmlsim.world import DeviceState, MigState, Timeline

__all__ = ["FaultAction", "FaultEngine", "OverrideEngine", "Active"]


@dataclass(frozen=True)
class FaultAction:
    """What to do to one call: wait ``latency_s``, maybe ``hang``, then return ``code``."""

    code: int | None
    latency_s: float
    hang: bool


def _device_matches(ref: int | str | None, target: DeviceState | MigState | None) -> bool:
    if ref is None:
        return True
    if target is None:
        return False
    parent = target.parent if isinstance(target, MigState) else target
    if isinstance(ref, int):
        return parent.index == ref
    return ref in (target.uuid, parent.uuid)


class _Entry:
    __slots__ = ("spec", "start_us", "end_us", "matched", "applied")

    def __init__(self, spec: Fault | Override, timeline: Timeline) -> None:
        self.spec = spec
        self.start_us, self.end_us = timeline.span(spec)
        self.matched = 0
        self.applied = 0

    def matches(self, target: DeviceState | MigState | None, arg: int | None, now_us: int) -> bool:
        spec = self.spec
        if not self.start_us <= now_us < self.end_us:
            return False
        if spec.arg is not None and spec.arg != arg:
            return False
        return _device_matches(spec.device, target)


def _index(entries: list[_Entry]) -> dict[str, list[_Entry]]:
    by_function: dict[str, list[_Entry]] = {}
    for e in entries:
        by_function.setdefault(e.spec.function, []).append(e)
    return by_function


class FaultEngine:
    """The compiled ``faults`` of a scenario."""

    def __init__(self, faults: list[Fault], timeline: Timeline) -> None:
        self._by_function = _index([_Entry(f, timeline) for f in faults])
        self._star = self._by_function.pop("*", [])

    def match(
        self,
        function: str,
        target: DeviceState | MigState | None,
        arg: int | None,
        sizing: bool | None,
        now_us: int,
    ) -> FaultAction | None:
        """Return the combined action of every fault matching this call, or None."""
        entries = self._by_function.get(function)
        if entries is None and not self._star:
            return None
        code: int | None = None
        latency = 0.0
        hang = False
        hit = False
        for e in (entries or []) + self._star:
            spec = e.spec
            assert isinstance(spec, Fault)
            if spec.call != "any" and (sizing is None or sizing != (spec.call == "sizing")):
                continue
            if not e.matches(target, arg, now_us):
                continue
            e.matched += 1
            if e.matched <= spec.after_calls:
                continue
            if spec.calls is not None and e.applied >= spec.calls:
                continue
            e.applied += 1
            hit = True
            latency += spec.latency_s or 0.0
            hang = hang or spec.hang
            if code is None:
                code = spec.code
        return FaultAction(code, latency, hang) if hit else None


@dataclass(frozen=True)
class Active:
    """An override in force for one call: write ``value`` to ``field`` (of ``pid``'s entry)."""

    field: str
    pid: int | None
    value: int | float


class OverrideEngine:
    """The compiled ``overrides`` of a scenario."""

    def __init__(self, overrides: list[Override], timeline: Timeline) -> None:
        self._by_function = _index([_Entry(o, timeline) for o in overrides])

    def active(
        self,
        function: str,
        target: DeviceState | MigState | None,
        arg: int | None,
        now_us: int,
    ) -> tuple[Active, ...]:
        """Return the overrides in force for this call (empty tuple if none)."""
        entries = self._by_function.get(function)
        if entries is None:
            return ()
        result = []
        for e in entries:
            spec = e.spec
            assert isinstance(spec, Override)
            if not e.matches(target, arg, now_us):
                continue
            if spec.calls is not None and e.applied >= spec.calls:
                continue
            e.applied += 1
            result.append(Active(spec.field, spec.pid, spec.value))
        return tuple(result)


def pick(
    overrides: tuple[Active, ...], field: str, value: int | float, pid: int | None = None
) -> int | float:
    """Return ``value``, unless an override targets ``field`` (and ``pid``, if it names one)."""
    for o in overrides:
        if o.field == field and (o.pid is None or o.pid == pid):
            return o.value
    return value
