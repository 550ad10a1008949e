"""GPM (GPU Performance Monitoring): support query, sample buffers, samples, metrics.

The calls and structs follow ``nvml.h`` and nvidia-ml-py's wrappers (NVML API reference, "GPM
Functions"; Hopper or newer):

- ``nvmlGpmQueryDeviceSupport(device, nvmlGpmSupport_t*)``: ``{version, isSupportedDevice}``;
  version must be ``NVML_GPM_SUPPORT_VERSION`` (1). A device without ``gpm`` answers 0.
- ``nvmlGpmSampleAlloc(nvmlGpmSample_t*)`` / ``nvmlGpmSampleFree(nvmlGpmSample_t)``: opaque
  buffers (:mod:`nvmlsim.gpmstore`); freeing an unknown buffer is a misuse (INVALID_ARGUMENT
  and an ``invalid_handle`` violation: the real library would crash).
- ``nvmlGpmSampleGet(device, sample)``: a snapshot of the whole GPU (on a MIG-enabled GPU
  too); NOT_SUPPORTED without GPM. ``nvmlGpmMigSampleGet(device, gpuInstanceId, sample)``: a
  snapshot of one GPU instance; NOT_SUPPORTED unless MIG is enabled, INVALID_ARGUMENT for a GI
  id no instance has (unverified choices).
- ``nvmlGpmMetricsGet(nvmlGpmMetricsGet_t*)``: ``{version, numMetrics, sample1, sample2,
  metrics[]}`` with ``{metricId, nvmlReturn, value, metricInfo{shortName, longName, unit}}``
  per metric; version must be ``NVML_GPM_METRICS_GET_VERSION`` (1). The call succeeds when
  the samples are usable; each metric carries its own return (NOT_SUPPORTED for ids the
  source does not report).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING

import pynvml

from nvmlsim import codes
from nvmlsim.gpmstore import MIN_INTERVAL_US, GpmSample, interval_mean
from nvmlsim.memio import get_pointer, get_u32, put_pointer, view
from nvmlsim.model.board import GPM_PERCENT_IDS
from nvmlsim.model.values import Dyn
from nvmlsim.symbols.base import U32, Call, P, Symbol
from nvmlsim.world import DeviceState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS", "GPM_METRIC", "SUPPORT_VERSION", "METRICS_GET_VERSION"]

SUPPORT_VERSION = 1  # NVML_GPM_SUPPORT_VERSION
METRICS_GET_VERSION = 1  # NVML_GPM_METRICS_GET_VERSION
# nvmlGpmMetric_t: unsigned metricId; nvmlReturn_t nvmlReturn; double value;
# nvmlGpmMetricInfo_t {char *shortName, *longName, *unit} -- 40 bytes.
GPM_METRIC = struct.Struct("<IId")
_METRIC_SIZE = 40
_HEADER = 24  # version u32, numMetrics u32, sample1 ptr, sample2 ptr
_NAMES = {
    int(getattr(pynvml, n)): n[len("NVML_GPM_METRIC_") :]
    for n in dir(pynvml)
    if n.startswith("NVML_GPM_METRIC_") and n != "NVML_GPM_METRIC_MAX"
}


def _support(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    if get_u32(out) != SUPPORT_VERSION:
        return drv.bad_struct_version_code
    ctypes.c_uint32.from_address(out + 4).value = int(target.spec.gpm is not None)
    return codes.SUCCESS


def _alloc(drv: SimDriver, call: Call, target: None, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    put_pointer(out, drv.gpm.alloc())
    return codes.SUCCESS


def _free(drv: SimDriver, call: Call, target: None, sample: int | None) -> int:
    if not drv.gpm.free(sample):
        drv.violation("invalid_handle", call.name, "unknown or already freed GPM sample buffer")
        return codes.INVALID_ARGUMENT
    return codes.SUCCESS


def _buffer(drv: SimDriver, name: str, sample: int | None) -> GpmSample | None:
    buf = drv.gpm.samples.get(sample) if sample else None
    if buf is None:
        drv.violation("invalid_handle", name, "unknown or freed GPM sample buffer")
    return buf


def _sample(drv: SimDriver, call: Call, target: DeviceState, h: int, sample: int | None) -> int:
    if target.spec.gpm is None:
        return codes.NOT_SUPPORTED
    buf = _buffer(drv, call.name, sample)
    if buf is None:
        return codes.INVALID_ARGUMENT
    buf.device, buf.gpu_instance, buf.time_us = target.index, None, call.now_us
    return codes.SUCCESS


def _mig_sample(
    drv: SimDriver, call: Call, target: DeviceState, h: int, gi: int, sample: int | None
) -> int:
    if target.spec.gpm is None or not target.mig_enabled:
        return codes.NOT_SUPPORTED
    if all(m.spec.gpu_instance_id != gi for m in target.mig.values()):
        return codes.INVALID_ARGUMENT
    buf = _buffer(drv, call.name, sample)
    if buf is None:
        return codes.INVALID_ARGUMENT
    buf.device, buf.gpu_instance, buf.time_us = target.index, gi, call.now_us
    return codes.SUCCESS


def _source_metrics(drv: SimDriver, buf: GpmSample) -> Mapping[int, Dyn] | None:
    devices = drv.world.devices
    if buf.device is None or not 0 <= buf.device < len(devices):
        return None
    dev = devices[buf.device]
    if dev.spec.gpm is None:
        return None
    if buf.gpu_instance is None:
        return dev.spec.gpm.metrics
    for mig in sorted(dev.mig.values(), key=lambda m: m.spec.slot):
        if mig.spec.gpu_instance_id == buf.gpu_instance and mig.spec.gpm is not None:
            return mig.spec.gpm.metrics
    return {}


def _info(drv: SimDriver, metric_id: int) -> tuple[int, int, int]:
    """Addresses of static ``shortName``, ``longName`` and ``unit`` strings for ``metric_id``."""
    cached = drv.gpm_strings.get(metric_id)
    if cached is None:
        name = _NAMES.get(metric_id, f"METRIC_{metric_id}")
        unit = "%" if metric_id in GPM_PERCENT_IDS else "MiB/s"
        bufs = tuple(
            ctypes.create_string_buffer(text.encode())
            for text in (name.lower(), name.replace("_", " ").title(), unit)
        )
        drv.gpm_strings[metric_id] = cached = bufs
    return tuple(ctypes.addressof(b) for b in cached)  # type: ignore[return-value]


def _metrics(drv: SimDriver, call: Call, target: None, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    if get_u32(out) != METRICS_GET_VERSION:
        return drv.bad_struct_version_code
    count = get_u32(out + 4)
    if count > int(pynvml.NVML_GPM_METRIC_MAX):
        return codes.INVALID_ARGUMENT
    first = _buffer(drv, call.name, get_pointer(out + 8))
    second = _buffer(drv, call.name, get_pointer(out + 16))
    if first is None or second is None:
        return codes.INVALID_ARGUMENT
    if (
        first.time_us is None
        or second.time_us is None
        or (first.device, first.gpu_instance) != (second.device, second.gpu_instance)
        or second.time_us < first.time_us
    ):
        return codes.INVALID_ARGUMENT
    source = _source_metrics(drv, second)
    if source is None:
        return codes.NOT_SUPPORTED
    too_close = second.time_us - first.time_us < MIN_INTERVAL_US
    rows = view(out + _HEADER, count * _METRIC_SIZE) if count else None
    for i in range(count):
        offset = i * _METRIC_SIZE
        metric_id = struct.unpack_from("<I", rows, offset)[0]  # type: ignore[arg-type]
        spec = source.get(metric_id)
        if spec is None:
            GPM_METRIC.pack_into(rows, offset, metric_id, codes.NOT_SUPPORTED, 0.0)  # type: ignore[arg-type]
            continue
        value = (
            0.0 if too_close else interval_mean(spec, first.time_us, second.time_us, drv.timeline)
        )
        GPM_METRIC.pack_into(rows, offset, metric_id, codes.SUCCESS, value)  # type: ignore[arg-type]
        struct.pack_into("<QQQ", rows, offset + 16, *_info(drv, metric_id))  # type: ignore[arg-type]
    return codes.SUCCESS


SYMBOLS = [
    Symbol("nvmlGpmQueryDeviceSupport", (P, P), _support),
    Symbol("nvmlGpmSampleAlloc", (P,), _alloc, target="none"),
    Symbol("nvmlGpmSampleFree", (P,), _free, target="none"),
    Symbol("nvmlGpmSampleGet", (P, P), _sample),
    Symbol("nvmlGpmMigSampleGet", (P, U32, P), _mig_sample, arg=1),
    Symbol("nvmlGpmMetricsGet", (P,), _metrics, target="none"),
]
