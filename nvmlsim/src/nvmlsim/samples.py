"""The sample engine behind ``nvmlDeviceGetSamples`` and per-process utilisation.

These are the driver's ring buffers (NVML API reference, ``nvmlDeviceGetSamples`` and
``nvmlDeviceGetProcessUtilization``).

Timestamps are µs in the sample clock (Unix epoch, or since boot with
``driver.sample_clock: boot``); callers must treat them as an opaque cursor. Only samples
strictly newer than the caller's ``lastSeenTimeStamp`` are returned.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, NamedTuple

from nvmlsim import codes
from nvmlsim.model.devices import SAMPLING_TYPES, ProcessUtilizationSpec, SampleBuffer
from nvmlsim.model.values import Dyn, evaluate
from nvmlsim.world import DeviceState, MigState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["device_samples", "encode_value", "process_samples", "ProcSample"]

_NAMES = {value: key for key, value in SAMPLING_TYPES.items()}
# Utilisation sample types are not supported on MIG-enabled GPUs [doc].
_MIG_UNSUPPORTED = {1, 2, 3, 4, 8, 9}


def _source(dev: DeviceState, stype: int) -> Dyn | None:
    spec = dev.spec
    util, enc, dec = spec.utilization, spec.encoder, spec.decoder
    return {
        0: spec.power.usage_mw,
        1: util.gpu if util else None,
        2: util.memory if util else None,
        3: enc.percent if enc else None,
        4: dec.percent if dec else None,
        5: spec.clocks_mhz.graphics,
        6: spec.clocks_mhz.mem,
        7: spec.power.usage_mw,
    }.get(stype)


def device_samples(
    drv: SimDriver, dev: DeviceState | MigState, stype: int, last_seen: int, now_us: int
) -> tuple[int, SampleBuffer | None, list[tuple[int, float]]]:
    """(code, buffer spec, [(timestamp µs in the sample clock, value)]) newer than the cursor.

    NOT_SUPPORTED for MIG handles, unknown or unconfigured types, and utilisation types on
    MIG-enabled GPUs; INVALID_ARGUMENT for a type outside 0..9.
    """
    if stype not in _NAMES:
        return codes.INVALID_ARGUMENT, None, []
    if isinstance(dev, MigState) or (dev.mig_enabled and stype in _MIG_UNSUPPORTED):
        return codes.NOT_SUPPORTED, None, []
    buf: SampleBuffer | None = getattr(dev.spec.samples, _NAMES[stype])
    source = (
        None if buf is None else (buf.source if buf.source is not None else _source(dev, stype))
    )
    if buf is None or source is None:
        return codes.NOT_SUPPORTED, None, []
    origin = drv.sample_origin_us
    period, phase = buf.period_us, buf.phase_us
    newest = (now_us - origin - phase) // period
    oldest = max(newest - buf.capacity + 1, (last_seen - phase) // period + 1)
    timeline = drv.timeline
    out = []
    for k in range(oldest, newest + 1):
        ts = k * period + phase
        at = ts + origin
        value = evaluate(source, timeline.seconds(at), timeline.cycle(at))
        if buf.skip_zero and value == 0:
            continue
        out.append((ts, value))
    return codes.SUCCESS, buf, out


_U32 = 0xFFFFFFFF


def encode_value(value_type: int, value: float, dirty_high: int) -> bytes:
    """Return the 8 bytes of ``c_nvmlValue_t`` for ``value`` as ``NVML_VALUE_TYPE_*``.

    32- and 16-bit members leave bytes 4–7 holding ``dirty_high`` (F24: reading ``ullVal``
    for an UNSIGNED_INT sample picks these up).
    """
    if value_type == 0:
        return struct.pack("<d", float(value))
    number = round(value)
    if value_type == 1:
        return struct.pack("<II", number & _U32, dirty_high)
    if value_type in (2, 3):
        return struct.pack("<Q", number & 0xFFFFFFFFFFFFFFFF)
    if value_type == 4:
        return struct.pack("<q", number)
    if value_type == 5:
        return struct.pack("<iI", number, dirty_high)
    return struct.pack("<HHI", number & 0xFFFF, 0, dirty_high)


class ProcSample(NamedTuple):
    """One per-process utilisation sample (percentages; timestamp in the sample clock)."""

    pid: int
    ts: int
    sm: int
    mem: int
    enc: int
    dec: int
    jpg: int
    ofa: int


def process_samples(
    drv: SimDriver, target: DeviceState | MigState, last_seen: int, now_us: int
) -> tuple[int, ProcessUtilizationSpec | None, list[ProcSample]]:
    """(code, spec, samples): each process's newest sample newer than ``last_seen``.

    A process contributes when its sample lies after its start, within ``buffer_s`` (exited
    processes too) and has a non-zero value [doc]. NOT_SUPPORTED on MIG (parent or instance)
    and when the device has no ``process_utilization``.
    """
    if isinstance(target, MigState) or target.mig_enabled:
        return codes.NOT_SUPPORTED, None, []
    spec = target.spec.process_utilization
    if spec is None:
        return codes.NOT_SUPPORTED, None, []
    origin = drv.sample_origin_us
    period = spec.period_us
    bucket = (now_us - origin) // period
    key = (id(target), drv.world.version, now_us, last_seen)
    cached = drv.sample_cache.get(key)
    if cached is not None:  # the data call right after its sizing call
        return codes.SUCCESS, spec, cached
    horizon = bucket * period - round(spec.buffer_s * 1e6)
    timeline = drv.timeline
    out = []
    hidden = False
    for p in target.processes:
        util = p.utilization
        if util is None or p.start_us > now_us:
            continue
        if p.trigger is not None and drv.seen(p.trigger[0], target.index) < p.trigger[1]:
            hidden = True
            continue
        last = (min(now_us, p.end_us - 1) - origin) - p.phase_us
        ts = (last // period) * period + p.phase_us
        if ts <= p.start_us - origin or ts <= last_seen or ts < horizon:
            continue
        at = ts + origin
        t, cycle = timeline.seconds(at), timeline.cycle(at)
        values = [
            round(evaluate(v, t, cycle))
            for v in (util.sm, util.mem, util.enc, util.dec, util.jpg, util.ofa)
        ]
        if any(values):
            out.append(ProcSample(p.pid, ts, *values))
    if not hidden:
        drv.sample_cache.clear()  # keep only the latest answer
        drv.sample_cache[key] = out
    return codes.SUCCESS, spec, out
