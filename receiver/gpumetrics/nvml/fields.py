"""``nvmlDeviceGetFieldValues`` with a per-field capability cache.

One call reads many fields; the call itself succeeds and each field carries its own
``nvmlReturn`` (NVML API reference, ``nvmlDeviceGetFieldValues`` and ``nvmlFieldValue_t``). A
field answering NOT_SUPPORTED, NO_PERMISSION or FUNCTION_NOT_FOUND (a driver that does not know
the id) is left out of this device's later requests until the next NVML init, counted once in
``gpumetrics.nvml.errors{nvml.function="nvmlDeviceGetFieldValues:<field>"}`` and logged in one
INFO line per call that found some, so a device without NVLink costs one call and one line,
not a warning per field per tick. When no requested field is left, no call is made.

Values are decoded through the union member their ``valueType`` names; an unknown type drops
the field's value for this read (``unknown_value_type``). The call goes to the C symbol with
the device's kept ``nvmlFieldValue_t`` array, decoded with ``struct``
(:func:`gpumetrics.nvml.records.field_values`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pynvml

from gpumetrics.nvml import records
from gpumetrics.nvml.calls import NVML_ERRORS, DeviceCalls, DeviceLost, LibraryDown
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.query import ErrorKind, QueryError, code_name
from gpumetrics.nvml.samples import decode_value
from gpumetrics.selftelemetry import SelfTelemetry

FUNCTION = "nvmlDeviceGetFieldValues"
_DISABLING = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    }
)
_DISABLED_CODE = {
    ErrorKind.UNSUPPORTED: "NOT_SUPPORTED",
    ErrorKind.NO_PERMISSION: "NO_PERMISSION",
    ErrorKind.FUNCTION_MISSING: "FUNCTION_NOT_FOUND",
}
"""The code a capability the gate disabled had answered (the gate raises without a call)."""
_NAMES = {
    int(getattr(pynvml, n)): n
    for n in dir(pynvml)
    if n.startswith("NVML_FI_DEV_") and isinstance(getattr(pynvml, n), int)
}


def field_name(field_id: int) -> str:
    """``NVML_FI_DEV_…`` name of ``field_id`` (``field_<n>`` when the binding lacks it)."""
    return _NAMES.get(field_id, f"field_{field_id}")


Field = int | tuple[int, int]
"""A field to read: an ``NVML_FI_DEV_*`` id (scope 0), or ``(id, scopeId)`` (an NVLink
counter's link, or ``UINT_MAX`` for all links)."""


def field_label(field: Field) -> str:
    """``NVML_FI_DEV_…`` name of ``field``, with ``[scope]`` for a scoped one."""
    if isinstance(field, tuple):
        return f"{field_name(field[0])}[{field[1]}]"
    return field_name(field)


def read_fields(
    dev: Device, tick: Tick, purpose: str, fields: Sequence[Field]
) -> dict[Field, int | float]:
    """Read ``fields`` of ``dev`` in one call; return the values of those that answered.

    Args:
        dev: the device (its call gate and per-field cache).
        tick: the tick (telemetry, log).
        purpose: names the read in the capability key (``nvmlDeviceGetFieldValues:<purpose>``),
            so an unusable call for one concern does not disable the others.
        fields: ``NVML_FI_DEV_*`` ids (scope 0), or ``(id, scopeId)`` pairs
            (``nvmlFieldValue_t``'s ``scopeId``: an NVLink counter's link, or ``UINT_MAX`` for
            all links). A field that answered NOT_SUPPORTED, NO_PERMISSION or
            FUNCTION_NOT_FOUND is left out by what was requested (id and scope).

    Returns:
        ``{field: value}`` (keyed as requested) for fields that answered SUCCESS; empty when
        none is left or the call failed.

    Raises:
        DeviceLost, LibraryDown: as from the gate.

    """
    dropped: set[Field] = dev.state.setdefault("fields_disabled", set())
    wanted = [f for f in fields if f not in dropped]
    if not wanted:
        return {}
    values = dev.calls.get(
        f"{FUNCTION}:{purpose}", FUNCTION, records.field_values, dev.handle, wanted, dev.records
    )
    if values is None:
        return {}
    out: dict[Field, int | float] = {}
    unsupported = []
    for field, (ret, value) in zip(wanted, values, strict=True):  # NVML answers in order
        if ret == pynvml.NVML_SUCCESS:
            if value is None:
                dev.calls.drop(FUNCTION, "unknown_value_type", detail=field_label(field))
                continue
            out[field] = value
            continue
        name = field_name(field[0] if isinstance(field, tuple) else field)
        tick.ctx.telemetry.add(  # by field id: one series per field, whatever its scopes
            NVML_ERRORS,
            1,
            {"nvml.function": f"{FUNCTION}:{name}", "nvml.return_code": code_name(ret)},
        )
        if ret in _DISABLING:
            dropped.add(field)
            unsupported.append(f"{name} ({code_name(ret)})")
    if unsupported:
        dev.calls.note(
            FUNCTION,
            "fields not answered, not asked again on this GPU: "
            + ", ".join(dict.fromkeys(unsupported)),  # a scoped field once, not once per link
        )
    return out


def read_one_field(
    calls: DeviceCalls, telemetry: SelfTelemetry, handle: Any, purpose: str, field_id: int
) -> tuple[int | float | None, str]:
    """Read one field now, outside a tick (the event listener): ``(value, "")`` or ``(None, why)``.

    ``why`` is the NVML return code name of the call or of the field (``NOT_SUPPORTED``,
    ``GPU_IS_LOST``...). A failing call is counted and logged by the gate ``calls``; a failing
    field is counted in ``gpumetrics.nvml.errors`` with ``nvml.function`` =
    ``nvmlDeviceGetFieldValues:<field>``. Nothing is cached: such a field is read rarely.
    """
    try:
        values = calls.query(
            f"{FUNCTION}:{purpose}", FUNCTION, pynvml.nvmlDeviceGetFieldValues, handle, [field_id]
        )
    except (DeviceLost, LibraryDown) as fatal:
        return None, fatal.error.code_name
    except QueryError as err:
        disabled = err.code is None and err.kind in _DISABLED_CODE
        return None, _DISABLED_CODE[err.kind] if disabled else err.code_name
    fv = values[0]
    ret = int(fv.nvmlReturn)
    if ret != pynvml.NVML_SUCCESS:
        attrs = {
            "nvml.function": f"{FUNCTION}:{field_name(field_id)}",
            "nvml.return_code": code_name(ret),
        }
        telemetry.add(NVML_ERRORS, 1, attrs)
        return None, code_name(ret)
    value = decode_value(int(fv.valueType), fv.value)
    if value is None:
        return None, f"VALUE_TYPE_{int(fv.valueType)}"
    return value, ""
