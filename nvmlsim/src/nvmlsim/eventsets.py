"""Event sets and the events NVML delivers through them (``nvmlEventSet*``).

What the simulation reproduces (NVML API reference, "Event Handling Methods",
https://docs.nvidia.com/deploy/nvml-api/group__nvmlEvents.html, and ``nvmlEventSetWait_v2``):

* a set records events only for the devices and types registered on it, from the moment of
  registration: an event that happens before (or on an unregistered device) reaches no set;
* ``nvmlDeviceRegisterEvents`` answers NOT_SUPPORTED when any requested type is not among the
  device's ``supported_events``; registering a device again adds the types;
* every registered set gets its own copy of each event, queued in order; a wait returns the
  oldest one;
* a registration that answers UNKNOWN (a fault) leaves the set undefined (nvml.h,
  ``nvmlDeviceRegisterEvents``: "event set is in undefined state and should be freed"):
  registering on it or waiting on it answers UNKNOWN and records an ``undefined_event_set``
  violation; freeing it is the only correct use;
* a registration belongs to the handle it was made with: after a GPU reset (``restore_gpu``)
  the old registration delivers nothing more, and the device must be registered again with
  its new handle;
* a wait on a set with a registered GPU that is lost answers GPU_IS_LOST once the events
  queued before the loss are delivered (whether queued events survive the loss on hardware is
  not documented; the simulator delivers them);
* MIG (``nvmlEventSetWait_v2``: per-instance reporting through MIG handles is not supported):
  registration takes a GPU handle only; an event of a MIG instance carries its GPU/compute
  instance ids and reaches the set only when the GPU's ``mig.privileged`` is true, as the
  reference says for callers without the privileges. Events of the whole GPU carry
  0xFFFFFFFF (``NVML_GPU_INSTANCE_ID_ANY``) in both ids (unverified on hardware).

Timing: scenario ``nvml_events`` happen at ``at_cycle``/``at_s``, or ``delay_s`` after the
device's N-th successful registration (``after_registration``); due events are applied by every
call, and a waiting call wakes up for them.

This module sits beside :mod:`nvmlsim.events`: it keeps state and never imports the driver.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from nvmlsim import codes
from nvmlsim.eventtypes import event_type_bit
from nvmlsim.handles import HandleTable
from nvmlsim.model.scenario import NvmlEvent
from nvmlsim.world import DeviceState, MigState, Timeline, World

__all__ = ["EventSets", "EventSetState", "QueuedEvent", "INSTANCE_ID_ANY"]

#: ``NVML_GPU_INSTANCE_ID_ANY`` / ``NVML_COMPUTE_INSTANCE_ID_ANY``: the event is the whole GPU's.
INSTANCE_ID_ANY = 0xFFFFFFFF


@dataclass(frozen=True)
class QueuedEvent:
    """One event waiting in a set: the fields of ``nvmlEventData_t``."""

    device_handle: int
    event_type: int
    event_data: int
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(eq=False)
class _Registration:
    device: DeviceState
    handle: int  # the device handle the registration was made with
    mask: int


@dataclass(eq=False)
class EventSetState:
    """One ``nvmlEventSet_t``: its registrations and queued events."""

    handle: int
    registrations: dict[int, _Registration] = field(default_factory=dict)
    queue: deque[QueuedEvent] = field(default_factory=deque)
    undefined: bool = False
    """A registration on it answered UNKNOWN: nvml.h says the set "is in undefined state and
    should be freed"; anything but ``nvmlEventSetFree`` on it is a violation."""

    def live(self) -> list[_Registration]:
        """Registrations still valid: made with the device's current handle (not reset since)."""
        return [r for r in self.registrations.values() if r.handle == r.device.handle]

    def lost(self) -> bool:
        """Whether a GPU registered on this set (with its current handle) is lost."""
        return any(r.device.lost for r in self.live())


class EventSets:
    """Every event set of one driver, and the schedule of the scenario's ``nvml_events``.

    Args:
        events: the scenario's ``nvml_events``.
        timeline: converts cycles and seconds to µs since the epoch.
        world: resolves the events' devices.

    All methods run under the driver's lock.

    """

    def __init__(self, events: list[NvmlEvent], timeline: Timeline, world: World) -> None:
        self._timeline = timeline
        self._world = world
        self._table: HandleTable[EventSetState] = HandleTable()
        self._sets: dict[int, EventSetState] = {}
        self._timed: list[tuple[int, int, NvmlEvent]] = []
        self._anchored: dict[str, list[NvmlEvent]] = {}
        self._registrations: dict[str, int] = {}
        self._seq = 0
        self.delivered = 0
        """Events queued into sets so far (each set's copy counts)."""
        for e in events:
            if e.after_registration is not None:
                self._anchored.setdefault(self._gpu_uuid(e.device), []).append(e)
            else:
                at = (
                    timeline.cycle_start_us(e.at_cycle)
                    if e.at_cycle is not None
                    else timeline.start_us + round((e.at_s or 0.0) * 1e6)
                )
                self._schedule(at, e)

    # -- sets ------------------------------------------------------------------------------
    def create(self) -> int:
        """Create a set; return its handle (an opaque pointer value)."""
        state = EventSetState(0)
        state.handle = self._table.issue(state)
        self._sets[state.handle] = state
        return state.handle

    def lookup(self, handle: int | None) -> EventSetState | None:
        """Return the live set of ``handle``, or None (NULL, unknown or freed)."""
        if not handle:
            return None
        return self._sets.get(handle)

    def free(self, handle: int) -> bool:
        """Free the set of ``handle``; False when it is not a live set."""
        return self._sets.pop(handle, None) is not None

    def open_sets(self) -> int:
        """How many sets are allocated and not freed."""
        return len(self._sets)

    def forget_all(self) -> None:
        """Drop every set (the library's reference count reached 0: nothing survives it)."""
        self._sets.clear()

    def register(self, es: EventSetState, dev: DeviceState, mask: int, now_us: int) -> int:
        """Register ``dev`` for the types of ``mask`` on ``es``; return the NVML code.

        NOT_SUPPORTED when a type is not supported by the device (or the device supports none).
        A success counts towards the device's ``after_registration`` events.
        """
        supported = self.supported_mask(dev)
        if supported is None or mask & ~supported or mask == 0:
            return codes.NOT_SUPPORTED
        reg = es.registrations.get(id(dev))
        if reg is not None and reg.handle == dev.handle:
            reg.mask |= mask
        else:
            es.registrations[id(dev)] = _Registration(dev, dev.handle, mask)
        n = self._registrations[dev.uuid] = self._registrations.get(dev.uuid, 0) + 1
        for e in self._anchored.get(dev.uuid, ()):
            if e.after_registration == n:
                self._schedule(now_us + round(e.delay_s * 1e6), e)
        return codes.SUCCESS

    @staticmethod
    def supported_mask(dev: DeviceState) -> int | None:
        """Return the device's supported event types as an NVML mask (None: not supported)."""
        names = dev.spec.supported_events
        if names is None:
            return None
        mask = 0
        for name in names:
            mask |= event_type_bit(name)
        return mask

    # -- the schedule ----------------------------------------------------------------------
    @property
    def next_us(self) -> int | None:
        """When the next scheduled event is due (µs since the epoch), or None."""
        return self._timed[0][0] if self._timed else None

    def apply_due(self, now_us: int) -> None:
        """Deliver every scheduled event due at or before ``now_us``, oldest first."""
        while self._timed and self._timed[0][0] <= now_us:
            _, _, event = heapq.heappop(self._timed)
            self.deliver(event)

    def _schedule(self, at_us: int, event: NvmlEvent) -> None:
        self._seq += 1  # unique: ties in time keep scenario order, events are never compared
        heapq.heappush(self._timed, (at_us, self._seq, event))

    def _gpu_uuid(self, ref: int | str) -> str:
        target = self._world.target(ref)
        dev = target.parent if isinstance(target, MigState) else target
        if dev is None:
            raise KeyError(f"device: no device {ref!r}")
        return dev.uuid

    def deliver(self, event: NvmlEvent) -> int:
        """Queue ``event`` (``count`` copies) into every set registered for it; return the sets.

        Raises:
            KeyError: the event's device does not exist (the scenario checks prevent it).

        """
        target = self._world.target(event.device)
        if target is None:
            raise KeyError(f"device: no device {event.device!r}")
        if isinstance(target, MigState):
            dev = target.parent
            mig = dev.spec.mig
            if mig is None or not mig.privileged:
                return 0  # per-instance events need privileges (module docstring)
            ids = (target.spec.gpu_instance_id, target.spec.compute_instance_id)
        else:
            dev, ids = target, (INSTANCE_ID_ANY, INSTANCE_ID_ANY)
        if dev.lost:
            return 0
        bit = event_type_bit(event.type)
        item = QueuedEvent(dev.handle, bit, event.data, ids[0], ids[1])
        reached = 0
        for es in self._sets.values():
            reg = es.registrations.get(id(dev))
            if reg is None or reg.handle != dev.handle or not reg.mask & bit:
                continue
            es.queue.extend([item] * event.count)
            reached += 1
            self.delivered += event.count
        return reached
