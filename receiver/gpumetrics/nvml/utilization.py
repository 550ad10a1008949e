"""Device utilisation: ``hw.gpu.utilization`` (general/encoder/decoder) and memory-copy utilisation.

- General and memory-copy utilisation come from the driver's sample buffers
  (``nvmlDeviceGetSamples`` GPU_UTILIZATION / MEMORY_UTILIZATION): each sample is its own point
  at its own (converted) time. When a buffer has nothing new (NOT_FOUND while idle, F19) or the
  type is unsupported, one ``nvmlDeviceGetUtilizationRates`` call at the tick's time feeds both
  metrics that need it (one read per tick). The cursor stays where it was.
- Encoder and decoder utilisation: ``nvmlDeviceGetEncoderUtilization`` /
  ``nvmlDeviceGetDecoderUtilization`` (percent over the driver's sampling period).
- Percentages become ratios 0–1; a value outside 0–100 % (808334905 seen on H100, F24) is dropped
  and counted, never clamped.

On a MIG-enabled GPU all of these answer NOT_SUPPORTED (field case F08): each is called once
and then disabled for the device (F08).
"""

from __future__ import annotations

from collections.abc import Sequence

import pynvml

from gpumetrics.metrics import names
from gpumetrics.metrics.buffer import Attributes
from gpumetrics.nvml import convert
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.samples import GPU_UTILIZATION, MEMORY_UTILIZATION, Sample

_GENERAL = ((names.AttrHwGPUTask, names.GPUTaskGeneral),)
_ENCODER = ((names.AttrHwGPUTask, names.GPUTaskEncoder),)
_DECODER = ((names.AttrHwGPUTask, names.GPUTaskDecoder),)


def _add_percent(
    dev: Device,
    tick: Tick,
    function: str,
    metric: str,
    percent: int | float,
    time_ns: int,
    attrs: Attributes,
) -> None:
    ratio, reason = convert.percent_to_ratio(percent)
    if ratio is None:
        dev.calls.drop(function, reason or convert.OUT_OF_RANGE, detail=f"{metric}={percent}")
        return
    tick.points.add(metric, ratio, time_ns, attrs)


def _add_samples(
    dev: Device, tick: Tick, metric: str, samples: Sequence[Sample], attrs: Attributes
) -> None:
    for s in samples:
        _add_percent(dev, tick, "nvmlDeviceGetSamples", metric, s.value, s.time_unix_nano, attrs)


def collect_utilization(dev: Device, tick: Tick) -> None:
    """Add general and memory-copy utilisation points (samples, or the snapshot fallback)."""
    want_gpu = tick.wants(names.MetricGPUUtilization)
    want_mem = tick.wants(names.MetricGPUMemoryCopyUtilization)
    now = tick.now_ns
    gpu = tick.samples(dev, GPU_UTILIZATION) if want_gpu else None
    mem = tick.samples(dev, MEMORY_UTILIZATION) if want_mem else None
    gpu_attrs = dev.attrs + _GENERAL
    if gpu:
        _add_samples(dev, tick, names.MetricGPUUtilization, gpu, gpu_attrs)
    if mem:
        _add_samples(dev, tick, names.MetricGPUMemoryCopyUtilization, mem, dev.attrs)
    snap_gpu, snap_mem = want_gpu and not gpu, want_mem and not mem
    if not (snap_gpu or snap_mem):
        return
    rates = dev.calls.get(
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetUtilizationRates",
        pynvml.nvmlDeviceGetUtilizationRates,
        dev.handle,
    )
    if rates is None:
        return
    fn = "nvmlDeviceGetUtilizationRates"
    if snap_gpu:
        _add_percent(dev, tick, fn, names.MetricGPUUtilization, int(rates.gpu), now, gpu_attrs)
    if snap_mem:
        _add_percent(
            dev, tick, fn, names.MetricGPUMemoryCopyUtilization, int(rates.memory), now, dev.attrs
        )


def collect_codec(dev: Device, tick: Tick) -> None:
    """Add encoder and decoder utilisation points (``hw.gpu.task`` = encoder / decoder)."""
    if not tick.wants(names.MetricGPUUtilization):
        return
    for function, fn, task in (
        ("nvmlDeviceGetEncoderUtilization", pynvml.nvmlDeviceGetEncoderUtilization, _ENCODER),
        ("nvmlDeviceGetDecoderUtilization", pynvml.nvmlDeviceGetDecoderUtilization, _DECODER),
    ):
        value = dev.calls.get(function, function, fn, dev.handle)
        if value is not None:
            _add_percent(
                dev,
                tick,
                function,
                names.MetricGPUUtilization,
                int(value[0]),
                tick.now_ns,
                dev.attrs + task,
            )
