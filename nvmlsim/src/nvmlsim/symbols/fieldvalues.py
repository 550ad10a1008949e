"""``nvmlDeviceGetFieldValues``: per-field values (``NVML_FI_*``) with a return code each.

The call itself succeeds; every requested field answers its own ``nvmlReturn``: SUCCESS with
the scenario's ``field_values`` entry (matching the scope id if the entry names one), or
NOT_SUPPORTED for fields the device does not report (``NVML_FI_DEV_POWER_*`` with scope ids).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from nvmlsim import codes
from nvmlsim.memio import view
from nvmlsim.model.values import evaluate
from nvmlsim.samples import encode_value
from nvmlsim.symbols.base import I32, Call, P, Symbol
from nvmlsim.world import DeviceState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS", "FIELD_VALUE"]

# nvmlFieldValue_t: unsigned fieldId, scopeId; long long timestamp, latencyUsec;
# nvmlValueType_t valueType; nvmlReturn_t nvmlReturn; nvmlValue_t value -- 40 bytes.
FIELD_VALUE = struct.Struct("<IIqqII8s")
_KEY = struct.Struct("<II")


def _field_values(
    drv: SimDriver, call: Call, target: DeviceState, h: int, count: int, values: int
) -> int:
    if count < 0 or (count and not values):
        return codes.INVALID_ARGUMENT
    memory = view(values, count * FIELD_VALUE.size) if count else None
    for i in range(count):
        offset = i * FIELD_VALUE.size
        field_id, scope = _KEY.unpack_from(memory, offset)  # type: ignore[arg-type]
        spec = target.spec.field_values.get(field_id)
        if spec is None or (spec.scope_id is not None and spec.scope_id != scope):
            row = (field_id, scope, 0, 0, 0, codes.NOT_SUPPORTED, bytes(8))
        else:
            value = evaluate(spec.value, call.t, call.cycle)
            raw = encode_value(spec.value_type, value, 0)
            row = (field_id, scope, call.now_us, 0, spec.value_type, codes.SUCCESS, raw)
        FIELD_VALUE.pack_into(memory, offset, *row)  # type: ignore[arg-type]
    return codes.SUCCESS


SYMBOLS = [Symbol("nvmlDeviceGetFieldValues", (P, I32, P), _field_values)]
