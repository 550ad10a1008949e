"""Board health and activity calls: NVLink, fans, BAR1, remapped rows, violations, encoders.

Signatures and units as ``nvml.h`` and the NVML API reference give them:

- ``nvmlDeviceGetNvLinkState(device, link, unsigned *isActive)``: ``NVML_FEATURE_ENABLED`` (1)
  for an active link; INVALID_ARGUMENT for a link the GPU does not have; NOT_SUPPORTED without
  NVLink. ``nvmlDeviceGetNvLinkErrorCounter(device, link, counter, unsigned long long *)`` with
  ``NVML_NVLINK_ERROR_DL_REPLAY`` (0), ``_RECOVERY`` (1), ``_CRC_FLIT`` (2), ``_CRC_DATA``
  (3), ``_ECC_DATA`` (4).
- ``nvmlDeviceGetNumFans(device, unsigned *)`` and ``nvmlDeviceGetFanSpeed_v2(device, fan,
  unsigned *)`` (percent; may exceed 100); ``nvmlDeviceGetFanSpeed`` reads fan 0.
- ``nvmlDeviceGetBAR1MemoryInfo(device, nvmlBAR1Memory_t *)``: total, free, used (bytes).
- ``nvmlDeviceGetRemappedRows(device, unsigned *corr, unsigned *unc, unsigned *pending,
  unsigned *failure)``: NOT_SUPPORTED "If MIG is enabled or if the device doesn't support this
  feature" (nvml.h): answered from the MIG mode at the time of the call.
- ``nvmlDeviceGetRetiredPages(device, cause, unsigned *pageCount, unsigned long long *addresses)``:
  the pages retired for ``cause`` (``retired_pages.single_bit`` / ``double_bit``; synthetic
  addresses). The two-call pattern of nvml.h: ``*pageCount`` 0 is a size probe answering
  INSUFFICIENT_SIZE with the count (SUCCESS when there is none); a count too small answers
  INSUFFICIENT_SIZE with the needed size. ``nvmlDeviceGetRetiredPagesPendingStatus``:
  ``retired_pages.pending``.
- ``nvmlDeviceGetViolationStatus(device, policy, nvmlViolationTime_t *)``: ``referenceTime``
  (µs) and ``violationTime`` (ns, cumulative).
- ``nvmlDeviceGetEncoderStats(device, unsigned *sessions, unsigned *fps, unsigned *latency)``:
  the C outputs are 32-bit (nvidia-ml-py passes 64-bit zeros; only the low half is written).

The encoder call answers NOT_SUPPORTED on a MIG-enabled GPU, like the encoder utilisation; MIG
handles get NOT_SUPPORTED from every call here (board-level readings).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from nvmlsim import codes
from nvmlsim.faults import pick
from nvmlsim.memio import get_u32, put_u32, put_u64, view
from nvmlsim.model.board import VIOLATION_POLICIES
from nvmlsim.model.values import evaluate
from nvmlsim.symbols.base import U32, Call, P, Symbol
from nvmlsim.world import DeviceState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS", "BAR1", "VIOLATION_TIME", "NVLINK_ERRORS", "retired_page_address"]

BAR1 = struct.Struct("<QQQ")  # nvmlBAR1Memory_t: bar1Total, bar1Free, bar1Used
VIOLATION_TIME = struct.Struct("<QQ")  # nvmlViolationTime_t: referenceTime, violationTime
NVLINK_ERRORS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")
"""``nvmlNvLinkErrorCounter_t`` 0..4 -> :class:`~nvmlsim.model.board.NvLinkErrors` field."""


def _at(value: object, call: Call) -> int:
    return round(evaluate(value, call.t, call.cycle))  # type: ignore[arg-type]


def _nvlink_state(
    drv: SimDriver, call: Call, target: DeviceState, h: int, link: int, out: int
) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    nvlink = target.spec.nvlink
    if nvlink is None:
        return codes.NOT_SUPPORTED
    if not 0 <= link < nvlink.links:
        return codes.INVALID_ARGUMENT
    up = nvlink.is_up(link, call.t, call.cycle)
    put_u32(out, int(pick(call.overrides, "value", int(up))))
    return codes.SUCCESS


def _nvlink_errors(
    drv: SimDriver, call: Call, target: DeviceState, h: int, link: int, counter: int, out: int
) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    nvlink = target.spec.nvlink
    if nvlink is None:
        return codes.NOT_SUPPORTED
    if not 0 <= link < nvlink.links or not 0 <= counter < len(NVLINK_ERRORS):
        return codes.INVALID_ARGUMENT
    errors = nvlink.errors.get(link)
    value = _at(getattr(errors, NVLINK_ERRORS[counter]), call) if errors is not None else 0
    put_u64(out, int(pick(call.overrides, "value", value)))
    return codes.SUCCESS


def _fans(dev: DeviceState) -> list[object] | None:
    spec = dev.spec
    if spec.fans_percent is not None:
        return list(spec.fans_percent)
    return None if spec.fan_percent is None else [spec.fan_percent]


def _num_fans(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    fans = _fans(target)
    if fans is None:
        return codes.NOT_SUPPORTED
    put_u32(out, int(pick(call.overrides, "value", len(fans))))
    return codes.SUCCESS


def _fan_speed(drv: SimDriver, call: Call, target: DeviceState, h: int, fan: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    fans = _fans(target)
    if fans is None:
        return codes.NOT_SUPPORTED
    if not 0 <= fan < len(fans):
        return codes.INVALID_ARGUMENT
    put_u32(out, int(pick(call.overrides, "value", _at(fans[fan], call))))
    return codes.SUCCESS


def _fan_speed_v1(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    return _fan_speed(drv, call, target, h, 0, out)


def _bar1(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    bar1 = target.spec.bar1
    if bar1 is None:
        return codes.NOT_SUPPORTED
    ov = call.overrides
    total = int(pick(ov, "bar1Total", bar1.total_bytes))
    used = int(pick(ov, "bar1Used", min(_at(bar1.used_bytes, call), bar1.total_bytes)))
    free = int(pick(ov, "bar1Free", max(total - used, 0)))
    BAR1.pack_into(view(out, BAR1.size), 0, total, free, used)
    return codes.SUCCESS


def _remapped(
    drv: SimDriver,
    call: Call,
    target: DeviceState,
    h: int,
    corr: int,
    unc: int,
    pend: int,
    fail: int,
) -> int:
    if not (corr and unc and pend and fail):
        return codes.INVALID_ARGUMENT
    rows = target.spec.remapped_rows
    if rows is None or target.mig_enabled:  # nvml.h: NOT_SUPPORTED "If MIG is enabled"
        return codes.NOT_SUPPORTED
    ov = call.overrides
    put_u32(corr, int(pick(ov, "corrRows", _at(rows.correctable, call))))
    put_u32(unc, int(pick(ov, "uncRows", _at(rows.uncorrectable, call))))
    put_u32(pend, int(pick(ov, "isPending", int(bool(_at(rows.pending, call))))))
    put_u32(fail, int(pick(ov, "failureOccurred", int(bool(_at(rows.failure, call))))))
    return codes.SUCCESS


_RETIREMENT_CAUSES = {0: "single_bit", 1: "double_bit"}
"""``nvmlPageRetirementCause_t``: MULTIPLE_SINGLE_BIT_ECC_ERRORS (0), DOUBLE_BIT_ECC_ERROR (1)."""


def retired_page_address(cause: int, k: int) -> int:
    """Return the address (synthetic, page-aligned, distinct) of the k-th page of ``cause``."""
    return ((cause + 1) << 36) | ((k + 1) << 12)


def _retired_pages(
    drv: SimDriver, call: Call, target: DeviceState, h: int, cause: int, count: int, out: int
) -> int:
    if not count or cause not in _RETIREMENT_CAUSES:
        return codes.INVALID_ARGUMENT
    retired = target.spec.retired_pages
    if retired is None:
        return codes.NOT_SUPPORTED
    n = max(0, _at(getattr(retired, _RETIREMENT_CAUSES[cause]), call))
    room = get_u32(count)
    put_u32(count, n)
    if room == 0:  # the size probe: "Set to 0 to query the size" (nvml.h)
        return codes.INSUFFICIENT_SIZE if n else codes.SUCCESS
    if room < n:
        return codes.INSUFFICIENT_SIZE  # pageCount "is set to the needed size"
    if not out:
        return codes.INVALID_ARGUMENT
    for k in range(n):
        put_u64(out + 8 * k, retired_page_address(cause, k))
    return codes.SUCCESS


def _retired_pending(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    retired = target.spec.retired_pages
    if retired is None:
        return codes.NOT_SUPPORTED
    put_u32(out, int(pick(call.overrides, "value", int(retired.pending))))
    return codes.SUCCESS


def _violation(
    drv: SimDriver, call: Call, target: DeviceState, h: int, policy: int, out: int
) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    if policy not in VIOLATION_POLICIES:
        return codes.INVALID_ARGUMENT
    spec = target.spec.violations_ns
    value = None if spec is None else getattr(spec, VIOLATION_POLICIES[policy])
    if value is None:
        return codes.NOT_SUPPORTED
    ns = int(pick(call.overrides, "violationTime", max(_at(value, call), 0)))
    VIOLATION_TIME.pack_into(view(out, VIOLATION_TIME.size), 0, call.now_us, ns)
    return codes.SUCCESS


def _encoder_stats(
    drv: SimDriver, call: Call, target: DeviceState, h: int, count: int, fps: int, latency: int
) -> int:
    if not (count and fps and latency):
        return codes.INVALID_ARGUMENT
    stats = target.spec.encoder_stats
    if stats is None or target.mig_enabled:
        return codes.NOT_SUPPORTED
    ov = call.overrides
    put_u32(count, int(pick(ov, "sessionCount", _at(stats.sessions, call))))
    put_u32(fps, int(pick(ov, "averageFps", _at(stats.average_fps, call))))
    put_u32(latency, int(pick(ov, "averageLatency", _at(stats.average_latency_us, call))))
    return codes.SUCCESS


SYMBOLS = [
    Symbol("nvmlDeviceGetNvLinkState", (P, U32, P), _nvlink_state, arg=1),
    Symbol("nvmlDeviceGetNvLinkErrorCounter", (P, U32, U32, P), _nvlink_errors, arg=2),
    Symbol("nvmlDeviceGetNumFans", (P, P), _num_fans),
    Symbol("nvmlDeviceGetFanSpeed", (P, P), _fan_speed_v1),
    Symbol("nvmlDeviceGetFanSpeed_v2", (P, U32, P), _fan_speed, arg=1),
    Symbol("nvmlDeviceGetBAR1MemoryInfo", (P, P), _bar1),
    Symbol("nvmlDeviceGetRemappedRows", (P, P, P, P, P), _remapped),
    Symbol("nvmlDeviceGetRetiredPages", (P, U32, P, P), _retired_pages, arg=1),
    Symbol("nvmlDeviceGetRetiredPagesPendingStatus", (P, P), _retired_pending),
    Symbol("nvmlDeviceGetViolationStatus", (P, U32, P), _violation, arg=1),
    Symbol("nvmlDeviceGetEncoderStats", (P, P, P, P), _encoder_stats),
]
