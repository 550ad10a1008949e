"""``nvmlDeviceGetFieldValues``: per-field values (``NVML_FI_*``) with a return code each.

The call itself succeeds; every requested field answers its own ``nvmlReturn``: SUCCESS with
the scenario's ``field_values`` entry (matching the scope id if the entry names one), or
NOT_SUPPORTED for fields the device does not report (``NVML_FI_DEV_POWER_*`` with scope ids).

Fields derived from the device's models, unless ``field_values`` names them:
``NVML_FI_DEV_NVLINK_LINK_COUNT`` (91), ``…_THROUGHPUT_DATA_TX`` / ``_RX`` (138/139, cumulative
KiB of the link named by the scope id, or of all links with scope id ``UINT_MAX``, as nvml.h's
"NVLink throughput counters field values" says; a link the GPU does not have answers
INVALID_ARGUMENT, an unverified choice), the error totals ``…_CRC_FLIT_ERROR_COUNT_TOTAL``
(38), ``…_CRC_DATA_…`` (45), ``…_REPLAY_…`` (52), ``…_RECOVERY_…`` (59), the per-link counts
``…_<counter>_ERROR_COUNT_L0`` to ``_L11`` (32-59 and 96-119, as ``nvml.h`` numbers them) and
``NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY`` / ``_DL_RECOVERY`` (161/162, the link as scope id) from
``nvlink`` (the counts ``nvmlDeviceGetNvLinkErrorCounter`` gives; a link the GPU does not have
answers NOT_SUPPORTED), ``NVML_FI_DEV_NVLINK_GET_STATE`` (165, the link as scope id:
``NVML_NVLINK_STATE_ACTIVE`` 1, or ``_INACTIVE`` 0 while the link is ``down``);
``NVML_FI_DEV_RETIRED_SBE`` / ``_DBE`` / ``_PENDING`` (29/30/31) from ``retired_pages``.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from nvmlsim import codes
from nvmlsim.memio import view
from nvmlsim.model.board import NvLink
from nvmlsim.model.devices import FieldValue
from nvmlsim.model.values import Dyn, evaluate
from nvmlsim.samples import encode_value
from nvmlsim.symbols.base import I32, Call, P, Symbol
from nvmlsim.world import DeviceState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS", "FIELD_VALUE", "ALL_LINKS"]

# nvmlFieldValue_t: unsigned fieldId, scopeId; long long timestamp, latencyUsec;
# nvmlValueType_t valueType; nvmlReturn_t nvmlReturn; nvmlValue_t value -- 40 bytes.
FIELD_VALUE = struct.Struct("<IIqqII8s")
_KEY = struct.Struct("<II")


ALL_LINKS = 0xFFFFFFFF
"""The ``scopeId`` that asks an NVLink throughput field for the sum over all links (nvml.h)."""
_ULL = 3  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_UINT = 1  # NVML_VALUE_TYPE_UNSIGNED_INT
_NVLINK_ERROR_TOTALS = {38: "crc_flit", 45: "crc_data", 52: "replay", 59: "recovery"}
_NVLINK_ERROR_PER_LINK: dict[int, tuple[str, int]] = {
    (low + n if n < 6 else high + n - 6): (name, n)
    for name, low, high in (
        ("crc_flit", 32, 96),
        ("crc_data", 39, 102),
        ("replay", 46, 108),
        ("recovery", 53, 114),
    )
    for n in range(12)
}
"""``NVML_FI_DEV_NVLINK_<counter>_ERROR_COUNT_L<n>`` (``nvml.h``: links 0-5 then 6-11) ->
``(counter, link)``."""
_NVLINK_GET_STATE = 165
_NVLINK_ERROR_SCOPED = {161: "replay", 162: "recovery"}
"""``NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY`` / ``_DL_RECOVERY``: one link's count (scope: the link)."""


def _link_errors(nvlink: NvLink, counter: str, link: int, call: Call) -> FieldValue | None:
    if not nvlink.error_fields or not 0 <= link < nvlink.links:
        return None
    errors = nvlink.errors.get(link)
    value = round(evaluate(getattr(errors, counter), call.t, call.cycle)) if errors else 0
    return FieldValue(value=value)


def _link_kib(nvlink: NvLink, key: str, scope: int, call: Call) -> int | None:
    """KiB of ``key`` (``data_tx_kib``/``data_rx_kib``) on link ``scope``, or all (UINT_MAX)."""
    if scope != ALL_LINKS and not 0 <= scope < nvlink.links:
        return None
    if nvlink.per_link:
        links = range(nvlink.links) if scope == ALL_LINKS else (scope,)
        per = [nvlink.per_link.get(k) for k in links]
        return sum(round(evaluate(getattr(p, key), call.t, call.cycle)) for p in per if p)
    total = max(0, round(evaluate(getattr(nvlink, key), call.t, call.cycle)))
    if scope == ALL_LINKS:
        return total
    share, rest = divmod(total, nvlink.links)  # each link non-decreasing; the links sum to total
    return share + int(scope < rest)


def _derived(dev: DeviceState, field_id: int, scope: int, call: Call) -> FieldValue | int | None:
    """Return the value of a field the device's models answer, or None (NOT_SUPPORTED).

    An int is a per-field return code (INVALID_ARGUMENT for a link the GPU does not have).
    """
    nvlink, retired = dev.spec.nvlink, dev.spec.retired_pages
    if nvlink is not None:
        if field_id in _NVLINK_ERROR_PER_LINK:
            return _link_errors(nvlink, *_NVLINK_ERROR_PER_LINK[field_id], call)
        if field_id in _NVLINK_ERROR_SCOPED:
            return _link_errors(nvlink, _NVLINK_ERROR_SCOPED[field_id], scope, call)
        if field_id == _NVLINK_GET_STATE:
            if not nvlink.state_field or not 0 <= scope < nvlink.links:
                return None
            up = nvlink.is_up(scope, call.t, call.cycle)
            return FieldValue(value=int(up), value_type=_UINT)
        if field_id == 91:
            return FieldValue(value=nvlink.links, value_type=_UINT)
        if field_id in (138, 139):
            key = "data_tx_kib" if field_id == 138 else "data_rx_kib"
            kib = _link_kib(nvlink, key, scope, call)
            return codes.INVALID_ARGUMENT if kib is None else FieldValue(value=kib)
        if field_id in _NVLINK_ERROR_TOTALS:
            key = _NVLINK_ERROR_TOTALS[field_id]
            total: Dyn = sum(
                round(evaluate(getattr(e, key), call.t, call.cycle)) for e in nvlink.errors.values()
            )
            return FieldValue(value=total)
    if retired is not None and field_id in (29, 30, 31):
        value = {29: retired.single_bit, 30: retired.double_bit, 31: int(retired.pending)}
        return FieldValue(value=value[field_id])
    return None


def _field_values(
    drv: SimDriver, call: Call, target: DeviceState, h: int, count: int, values: int
) -> int:
    if count < 0 or (count and not values):
        return codes.INVALID_ARGUMENT
    memory = view(values, count * FIELD_VALUE.size) if count else None
    for i in range(count):
        offset = i * FIELD_VALUE.size
        field_id, scope = _KEY.unpack_from(memory, offset)  # type: ignore[arg-type]
        spec: FieldValue | int | None = target.spec.field_values.get(field_id)
        if spec is None:
            spec = _derived(target, field_id, scope, call)
        if isinstance(spec, int):
            row = (field_id, scope, 0, 0, 0, spec, bytes(8))
        elif spec is None or (spec.scope_id is not None and spec.scope_id != scope):
            row = (field_id, scope, 0, 0, 0, codes.NOT_SUPPORTED, bytes(8))
        else:
            value = evaluate(spec.value, call.t, call.cycle)
            raw = encode_value(spec.value_type, value, 0)
            row = (field_id, scope, call.now_us, 0, spec.value_type, codes.SUCCESS, raw)
        FIELD_VALUE.pack_into(memory, offset, *row)  # type: ignore[arg-type]
    return codes.SUCCESS


SYMBOLS = [Symbol("nvmlDeviceGetFieldValues", (P, I32, P), _field_values)]
