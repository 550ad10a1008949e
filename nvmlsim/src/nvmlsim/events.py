"""Scenario events (GPU lost/restored, driver upgraded or reloaded, access revoked, MIG...).

Events are applied lazily: every call first applies the events whose time has come, so a
manual clock needs no background thread. ``apply_event`` is also used by
``SimDriver.trigger`` and ``SimDriver.request_reset``.

This module sits below :mod:`nvmlsim.driver`: it changes the driver through the
:class:`EventTarget` protocol and never imports the driver.
"""

from __future__ import annotations

from typing import Protocol

from nvmlsim import codes
from nvmlsim.clock import Clock
from nvmlsim.model.scenario import Event, Scenario
from nvmlsim.model.values import evaluate
from nvmlsim.world import DeviceState, Timeline, World

__all__ = ["EventQueue", "EventTarget", "apply_event"]


class EventSetTable(Protocol):
    """What an event needs of the driver's event sets (``nvmlsim.eventsets.EventSets``)."""

    def forget_all(self) -> None:
        """Drop every set (they died with the driver that made them)."""


class EventTarget(Protocol):
    """The driver state an event reads and changes (``SimDriver`` has it)."""

    clock: Clock
    scenario: Scenario
    timeline: Timeline
    world: World
    #: the code every call answers after ``upgrade_driver`` (None: not upgraded)
    upgraded_code: int | None
    #: True after ``revoke_access``: everything answers UNKNOWN
    revoked: bool
    #: True after ``reload_driver`` until the reference count is back to 0: UNINITIALIZED
    reloaded: bool

    @property
    def event_sets(self) -> EventSetTable:
        """The driver's event sets (a ``reload_driver`` forgets them)."""


class EventQueue:
    """A scenario's events in time order; ``due(now_us)`` pops those whose time has come."""

    def __init__(self, events: list[Event], timeline: Timeline) -> None:
        timed = []
        for seq, e in enumerate(events):
            if e.at_cycle is not None:
                at = timeline.cycle_start_us(e.at_cycle)
            else:
                at = timeline.start_us + round((e.at_s or 0.0) * 1e6)
            timed.append((at, seq, e))
        timed.sort(key=lambda x: (x[0], x[1]))
        self._events = timed
        self._next = 0
        self.next_us = timed[0][0] if timed else None

    def due(self, now_us: int) -> list[tuple[int, Event]]:
        """Return ``(time µs, event)`` for events at or before ``now_us`` not yet returned."""
        out = []
        while self._next < len(self._events) and self._events[self._next][0] <= now_us:
            at, _, event = self._events[self._next]
            out.append((at, event))
            self._next += 1
        self.next_us = self._events[self._next][0] if self._next < len(self._events) else None
        return out


def _reset_energy(drv: EventTarget, dev: DeviceState, at_us: int) -> None:
    if dev.spec.energy_mj is None:
        return
    value = evaluate(dev.spec.energy_mj, drv.timeline.seconds(at_us), drv.timeline.cycle(at_us))
    dev.energy_offset_mj = value


def apply_event(drv: EventTarget, event: Event, at_us: int | None = None) -> None:
    """Change the simulated system as ``event`` says (caller holds the driver lock).

    ``at_us`` is when the event happened (default: now); events are applied lazily by the
    next call, but an energy reset counts from the event's own time.
    """
    if at_us is None:
        at_us = drv.clock.now_us()
    world = drv.world
    action = event.action
    if action == "upgrade_driver":
        drv.upgraded_code = event.code if event.code is not None else codes.UNINITIALIZED
        return
    if action in ("revoke_access", "restore_access"):
        drv.revoked = action == "revoke_access"
        return
    if action == "reload_driver":
        drv.reloaded = True
        drv.event_sets.forget_all()  # the old module's sets are gone with it
        stale = drv.scenario.driver.stale_handle_code
        for gpu in world.devices:
            world.renew_handles(gpu, stale)
            _reset_energy(drv, gpu, at_us)  # "since the driver was last reloaded"
        return
    assert event.device is not None  # the model requires it for the other actions
    target = world.target(event.device)
    dev = target if isinstance(target, DeviceState) else getattr(target, "parent", None)
    if dev is None:
        raise KeyError(f"device: no device {event.device!r}")
    if action == "lose_gpu":
        dev.lost = True
    elif action == "restore_gpu":
        dev.lost = False
        world.renew_handles(dev, drv.scenario.driver.stale_handle_code)
        _reset_energy(drv, dev, at_us)
        if event.new_index is not None and event.new_index != dev.index:
            world.move(dev, event.new_index)
    elif action == "reset_energy":
        _reset_energy(drv, dev, at_us)
    elif action == "destroy_mig_instance":
        assert event.slot is not None
        world.destroy_mig(dev, event.slot, drv.scenario.driver.stale_handle_code)
    elif action == "create_mig_instance":
        assert event.instance is not None
        world.destroy_mig(dev, event.instance.slot, drv.scenario.driver.stale_handle_code)
        world.create_mig(dev, event.instance)
