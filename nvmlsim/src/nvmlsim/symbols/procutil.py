"""Per-process utilisation calls.

``nvmlDeviceGetProcessUtilization`` and ``nvmlDeviceGetProcessesUtilizationInfo``.

Sizing call (NULL buffer): INSUFFICIENT_SIZE with the number of samples newer than the
cursor (or the buffer capacity with ``sizing: capacity``), NOT_FOUND when there is none.
Data call: NOT_FOUND if none, INSUFFICIENT_SIZE with the new count if more samples exist
than the caller allocated (F20), else the samples. NOT_SUPPORTED on MIG.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from nvmlsim import codes
from nvmlsim.faults import Active, pick
from nvmlsim.memio import (
    PROC_UTIL_INFO,
    PROC_UTIL_SAMPLE,
    get_pointer,
    get_u32,
    put_u32,
    view,
)
from nvmlsim.model.devices import ProcessUtilizationSpec
from nvmlsim.samples import ProcSample, process_samples
from nvmlsim.symbols.base import U64, Call, P, Symbol, null_at
from nvmlsim.world import DeviceState, MigState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS", "UTIL_INFO", "UTIL_INFO_VERSION"]

# nvmlProcessesUtilizationInfo_v1_t: unsigned version, processSamplesCount;
# unsigned long long lastSeenTimeStamp; pointer procUtilArray.
UTIL_INFO = struct.Struct("<IIQQ")
UTIL_INFO_VERSION = UTIL_INFO.size | (1 << 24)  # ProcessesUtilizationInfo_v1 = 0x01000018
_NAMES = ("pid", "timeStamp", "smUtil", "memUtil", "encUtil", "decUtil", "jpgUtil", "ofaUtil")


def _apply(s: ProcSample, ov: tuple[Active, ...]) -> ProcSample:
    if not ov:
        return s
    return ProcSample(*(int(pick(ov, n, v, s.pid)) for n, v in zip(_NAMES, s, strict=True)))


def _sizing_count(spec: ProcessUtilizationSpec, samples: list[ProcSample]) -> int:
    return spec.capacity if spec.sizing == "capacity" else len(samples)


def _utilization(
    drv: SimDriver,
    call: Call,
    target: DeviceState | MigState,
    h: int,
    buf: int,
    p_count: int,
    last_seen: int,
) -> int:
    if not p_count:
        return codes.INVALID_ARGUMENT
    code, spec, samples = process_samples(drv, target, last_seen, call.now_us)
    if code != codes.SUCCESS or spec is None:
        return code
    if not buf:
        count = _sizing_count(spec, samples)
        if count == 0:
            return codes.NOT_FOUND
        put_u32(p_count, count)
        return codes.INSUFFICIENT_SIZE
    if not samples:
        return codes.NOT_FOUND
    if len(samples) > get_u32(p_count):
        put_u32(p_count, len(samples))
        return codes.INSUFFICIENT_SIZE
    memory = view(buf, len(samples) * PROC_UTIL_SAMPLE.size)
    for i, sample in enumerate(samples):
        s = _apply(sample, call.overrides)
        PROC_UTIL_SAMPLE.pack_into(
            memory, i * PROC_UTIL_SAMPLE.size, s.pid, s.ts, s.sm, s.mem, s.enc, s.dec
        )
    put_u32(p_count, len(samples))
    return codes.SUCCESS


def _info_sizing(args: tuple[object, ...]) -> bool:
    out = args[1]
    return not (isinstance(out, int) and out and get_pointer(out + 16))


def _info(drv: SimDriver, call: Call, target: DeviceState | MigState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    version, capacity, last_seen, array = UTIL_INFO.unpack_from(view(out, UTIL_INFO.size))
    if version != UTIL_INFO_VERSION:
        return drv.bad_struct_version_code
    code, spec, samples = process_samples(drv, target, last_seen, call.now_us)
    if code != codes.SUCCESS or spec is None:
        return code
    if not array:
        count = _sizing_count(spec, samples)
        if count == 0:
            return codes.NOT_FOUND
        put_u32(out + 4, count)
        return codes.INSUFFICIENT_SIZE
    if not samples:
        return codes.NOT_FOUND
    if len(samples) > capacity:
        put_u32(out + 4, len(samples))
        return codes.INSUFFICIENT_SIZE
    memory = view(array, len(samples) * PROC_UTIL_INFO.size)
    for i, sample in enumerate(samples):
        s = _apply(sample, call.overrides)
        PROC_UTIL_INFO.pack_into(
            memory, i * PROC_UTIL_INFO.size, s.ts, s.pid, s.sm, s.mem, s.enc, s.dec, s.jpg, s.ofa
        )
    put_u32(out + 4, len(samples))
    return codes.SUCCESS


SYMBOLS = [
    Symbol(
        "nvmlDeviceGetProcessUtilization",
        (P, P, P, U64),
        _utilization,
        target="any",
        sizing=null_at(1),
    ),
    Symbol(
        "nvmlDeviceGetProcessesUtilizationInfo", (P, P), _info, target="any", sizing=_info_sizing
    ),
]
