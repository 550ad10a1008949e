"""``nvmlDeviceGetFieldValues`` with a per-field capability cache.

One call reads many fields; the call itself succeeds and each field carries its own
``nvmlReturn`` (NVML API reference, ``nvmlDeviceGetFieldValues`` and ``nvmlFieldValue_t``). A
field answering NOT_SUPPORTED, NO_PERMISSION or FUNCTION_NOT_FOUND (a driver that does not know
the id) is left out of this device's later requests until the next NVML init, counted once in
``gpumetrics.nvml.errors{nvml.function="nvmlDeviceGetFieldValues:<field>"}`` and logged in one
INFO line per call that found some, so a device without NVLink costs one call and one line,
not a warning per field per tick. When no requested field is left, no call is made.

Values are decoded through the union member their ``valueType`` names
(:func:`gpumetrics.nvml.samples.decode_value`); an unknown type drops the field's value for
this read (``unknown_value_type``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pynvml

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
"""A field to read: an ``NVML_FI_DEV_*`` id (scope 0), or ``(id, scopeId)``."""


def _field_id(field: Field) -> int:
    return field[0] if isinstance(field, tuple) else field


def read_fields(
    dev: Device, tick: Tick, purpose: str, fields: Sequence[Field]
) -> dict[int, int | float]:
    """Read ``fields`` of ``dev`` in one call; return the values of those that answered.

    Args:
        dev: the device (its call gate and per-field cache).
        tick: the tick (telemetry, log).
        purpose: names the read in the capability key (``nvmlDeviceGetFieldValues:<purpose>``),
            so an unusable call for one concern does not disable the others.
        fields: ``NVML_FI_DEV_*`` ids (scope 0), or ``(id, scopeId)`` pairs (an NVLink
            counter's link, or ``UINT_MAX`` for all links); one scope per id.

    Returns:
        ``{field id: value}`` for fields that answered SUCCESS; empty when none is left or the
        call failed.

    Raises:
        DeviceLost, LibraryDown: as from the gate.

    """
    dropped: set[int] = dev.state.setdefault("fields_disabled", set())
    wanted = [f for f in fields if _field_id(f) not in dropped]
    if not wanted:
        return {}
    values = dev.calls.get(
        f"{FUNCTION}:{purpose}", FUNCTION, pynvml.nvmlDeviceGetFieldValues, dev.handle, wanted
    )
    if values is None:
        return {}
    out: dict[int, int | float] = {}
    unsupported = []
    for fv in values:
        field_id, ret = int(fv.fieldId), int(fv.nvmlReturn)
        if ret == pynvml.NVML_SUCCESS:
            value = decode_value(int(fv.valueType), fv.value)
            if value is None:
                dev.calls.drop(FUNCTION, "unknown_value_type", detail=field_name(field_id))
                continue
            out[field_id] = value
            continue
        tick.ctx.telemetry.add(
            NVML_ERRORS,
            1,
            {
                "nvml.function": f"{FUNCTION}:{field_name(field_id)}",
                "nvml.return_code": code_name(ret),
            },
        )
        if ret in _DISABLING:
            dropped.add(field_id)
            unsupported.append(f"{field_name(field_id)} ({code_name(ret)})")
    if unsupported:
        dev.calls.note(
            FUNCTION, "fields not answered, not asked again on this GPU: " + ", ".join(unsupported)
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
