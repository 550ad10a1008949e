"""Device utilisation: rates, encoder/decoder, and sample buffers.

All of these answer NOT_SUPPORTED on MIG-enabled GPUs and MIG handles [doc] (F08).
``nvmlDeviceGetSamples`` answers NOT_FOUND when no sample is newer than the cursor (F19); the
NULL-buffer call reports the count (or the capacity with ``sizing: capacity``) and the value
type; the data call fills at most the caller's count, newest last.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from nvmlsim import codes
from nvmlsim.faults import pick
from nvmlsim.memio import SAMPLE_TS, get_u32, put_u32, view
from nvmlsim.model.values import evaluate
from nvmlsim.samples import device_samples, encode_value
from nvmlsim.symbols.base import U32, U64, Call, Handler, P, Symbol, null_at
from nvmlsim.world import DeviceState, MigState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS", "UTILIZATION"]

# nvmlUtilization_t: unsigned gpu, memory.
UTILIZATION = struct.Struct("<II")
_SAMPLE_SIZE = 16  # nvmlSample_t: unsigned long long timeStamp; nvmlValue_t sampleValue


def _mig(target: DeviceState | MigState) -> bool:
    return isinstance(target, MigState) or target.mig_enabled


def _rates(drv: SimDriver, call: Call, target: DeviceState | MigState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    if _mig(target):
        return codes.NOT_SUPPORTED
    assert isinstance(target, DeviceState)
    util = target.spec.utilization
    if util is None:
        return codes.NOT_SUPPORTED
    gpu = round(evaluate(util.gpu, call.t, call.cycle))
    memory = round(evaluate(util.memory, call.t, call.cycle))
    ov = call.overrides
    UTILIZATION.pack_into(
        view(out, UTILIZATION.size), 0, int(pick(ov, "gpu", gpu)), int(pick(ov, "memory", memory))
    )
    return codes.SUCCESS


def _codec(attribute: str) -> Handler:
    def handler(
        drv: SimDriver, call: Call, target: DeviceState | MigState, h: int, out: int, period: int
    ) -> int:
        if not out or not period:
            return codes.INVALID_ARGUMENT
        if _mig(target):
            return codes.NOT_SUPPORTED
        assert isinstance(target, DeviceState)
        codec = getattr(target.spec, attribute)
        if codec is None:
            return codes.NOT_SUPPORTED
        ov = call.overrides
        put_u32(out, int(pick(ov, "value", round(evaluate(codec.percent, call.t, call.cycle)))))
        put_u32(period, int(pick(ov, "samplingPeriodUs", codec.sampling_period_us)))
        return codes.SUCCESS

    return handler


def _samples(
    drv: SimDriver,
    call: Call,
    target: DeviceState | MigState,
    h: int,
    stype: int,
    last_seen: int,
    p_type: int,
    p_count: int,
    buf: int,
) -> int:
    if not p_type or not p_count:
        return codes.INVALID_ARGUMENT
    code, spec, samples = device_samples(drv, target, stype, last_seen, call.now_us)
    if code != codes.SUCCESS or spec is None:
        return code
    if not samples:
        return codes.NOT_FOUND
    put_u32(p_type, spec.value_type)
    if not buf:
        put_u32(p_count, len(samples) if spec.sizing == "exact" else spec.capacity)
        return codes.SUCCESS
    chosen = samples[-get_u32(p_count) :] if get_u32(p_count) else []
    ov = call.overrides
    memory = view(buf, len(chosen) * _SAMPLE_SIZE)
    for i, (ts, value) in enumerate(chosen):
        offset = i * _SAMPLE_SIZE
        SAMPLE_TS.pack_into(memory, offset, int(pick(ov, "timeStamp", ts)) if ov else ts)
        if ov:
            value = pick(ov, "value", value)
        raw = encode_value(spec.value_type, value, spec.dirty_high_bytes)
        if ov and any(o.field == "raw" for o in ov):
            raw = struct.pack("<Q", int(pick(ov, "raw", 0)))
        struct.pack_into("8s", memory, offset + 8, raw)
    put_u32(p_count, len(chosen))
    return codes.SUCCESS


SYMBOLS = [
    Symbol("nvmlDeviceGetUtilizationRates", (P, P), _rates, target="any"),
    Symbol(
        "nvmlDeviceGetEncoderUtilization",
        (P, P, P),
        _codec("encoder"),
        target="any",
    ),
    Symbol(
        "nvmlDeviceGetDecoderUtilization",
        (P, P, P),
        _codec("decoder"),
        target="any",
    ),
    Symbol(
        "nvmlDeviceGetSamples",
        (P, U32, U64, P, P, P),
        _samples,
        target="any",
        arg=1,
        sizing=null_at(5),
    ),
]
