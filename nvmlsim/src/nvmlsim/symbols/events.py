"""Event sets: create/free, supported types, registration and ``nvmlEventSetWait_v2``.

The symbols are ``nvmlEventSetCreate``, ``nvmlEventSetFree``,
``nvmlDeviceGetSupportedEventTypes``, ``nvmlDeviceRegisterEvents`` and ``nvmlEventSetWait_v2``;
the semantics are in :mod:`nvmlsim.eventsets`.

``nvmlEventSetWait_v2`` is the one call that blocks: it returns the oldest queued event at once,
GPU_IS_LOST when a registered GPU is lost and nothing is queued, else waits for an event but
no longer than ``timeoutms`` of real time (whatever the clock: a manual clock's ``advance``
wakes it so that scenario events due by then are delivered) and answers TIMEOUT. While it
waits it releases the driver lock, so other calls proceed. A set used after ``nvmlEventSetFree``
(or an unknown one) answers INVALID_ARGUMENT and records an ``invalid_event_set`` violation,
since the real library would read freed memory. A set left undefined by a registration that
answered UNKNOWN answers UNKNOWN to anything but ``nvmlEventSetFree`` and records an
``undefined_event_set`` violation.
"""

from __future__ import annotations

import struct
import time
from typing import TYPE_CHECKING, Any

from nvmlsim import codes
from nvmlsim.eventsets import EventSets, EventSetState
from nvmlsim.memio import put_pointer, put_u64, view
from nvmlsim.symbols.base import U32, U64, Call, P, Symbol
from nvmlsim.world import DeviceState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS", "EVENT_DATA"]

# nvmlEventData_t: device (pointer), eventType u64, eventData u64, gpuInstanceId u32,
# computeInstanceId u32 (32 bytes; nvidia-ml-py's c_nvmlEventData_t).
EVENT_DATA = struct.Struct("<QQQII")


def _bad_set(drv: SimDriver, call: Call, handle: int | None) -> int:
    drv.violation("invalid_event_set", call.name, f"NULL, unknown or freed event set {handle!r}")
    return codes.INVALID_ARGUMENT


def _create(drv: SimDriver, call: Call, target: None, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    put_pointer(out, drv.event_sets.create())
    return codes.SUCCESS


def _free(drv: SimDriver, call: Call, target: None, handle: int | None) -> int:
    if handle is None or not drv.event_sets.free(handle):
        return _bad_set(drv, call, handle)
    return codes.SUCCESS


def _supported(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    mask = EventSets.supported_mask(target)
    if mask is None:
        return codes.NOT_SUPPORTED
    put_u64(out, mask)
    return codes.SUCCESS


def _undefined(drv: SimDriver, call: Call, es: EventSetState) -> int:
    drv.violation(
        "undefined_event_set",
        call.name,
        f"event set {es.handle:#x} is undefined after a registration answered UNKNOWN; free it",
    )
    return codes.UNKNOWN


def _register(
    drv: SimDriver, call: Call, target: DeviceState, h: int, mask: int, handle: int | None
) -> int:
    es = drv.event_sets.lookup(handle)
    if es is None:
        return _bad_set(drv, call, handle)
    if es.undefined:
        return _undefined(drv, call, es)
    return drv.event_sets.register(es, target, mask, call.now_us)


def _register_failed(drv: SimDriver, args: tuple[Any, ...], code: int) -> None:
    """Mark the set of a registration that answered UNKNOWN undefined (nvml.h)."""
    es = drv.event_sets.lookup(args[2])
    if es is not None and code == codes.UNKNOWN:
        es.undefined = True


def _wait(
    drv: SimDriver, call: Call, target: None, handle: int | None, out: int, timeout_ms: int
) -> int:
    es = drv.event_sets.lookup(handle)
    if es is None:
        return _bad_set(drv, call, handle)
    if es.undefined:
        return _undefined(drv, call, es)
    if not out:
        return codes.INVALID_ARGUMENT
    end = time.monotonic() + timeout_ms / 1000.0
    while True:
        if es.queue:
            e = es.queue.popleft()
            EVENT_DATA.pack_into(
                view(out, EVENT_DATA.size),
                0,
                e.device_handle,
                e.event_type,
                e.event_data,
                e.gpu_instance_id,
                e.compute_instance_id,
            )
            return codes.SUCCESS
        if es.lost():
            return codes.GPU_IS_LOST
        left = end - time.monotonic()
        if left <= 0:
            return codes.TIMEOUT
        due = drv.next_due_us()
        if due is not None and not drv.clock.manual:
            left = min(left, max(0.0, (due - drv.clock.now_us()) / 1e6))
        drv.event_wakeup.wait(left)  # releases the driver lock while it waits
        if drv.closed or drv.init_count == 0 or drv.reloaded:
            return codes.UNINITIALIZED
        if drv.event_sets.lookup(handle) is not es:
            return _bad_set(drv, call, handle)  # freed by another thread while waiting
        drv.apply_due(drv.clock.now_us())


SYMBOLS = [
    Symbol("nvmlEventSetCreate", (P,), _create, target="none"),
    Symbol("nvmlEventSetFree", (P,), _free, target="none"),
    Symbol("nvmlDeviceGetSupportedEventTypes", (P, P), _supported),
    Symbol("nvmlDeviceRegisterEvents", (P, U64, P), _register, on_fault=_register_failed),
    Symbol("nvmlEventSetWait_v2", (P, P, U32), _wait, target="none"),
]
