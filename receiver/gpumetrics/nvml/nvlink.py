"""NVLink: data counters of the GPU, and each link's state and error counters.

- ``nvidia.gpu.nvlink.io{network.io.direction}``: ``nvmlDeviceGetFieldValues`` with
  ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`` / ``_RX`` and scope id ``UINT_MAX`` (the sum over
  all links; a scope id below it is one link's counter, nvml.h), the GPU's data KiB since
  the driver was loaded (NVML API reference, field values; nvitop reads the same fields), as
  cumulative monotonic Sums with reset detection, every tick (one call). The first read also
  asks ``NVML_FI_DEV_NVLINK_LINK_COUNT``, the number of links (a board constant; 0 on a board
  without NVLink, which is a fact, not an error). A GPU without NVLink answers the fields
  NOT_SUPPORTED once and is not asked again (:mod:`gpumetrics.nvml.fields`).
- Each link is a component of its GPU (semantic conventions, hardware network metrics:
  ``hw.type`` network): ``hw.id`` = ``<GPU UUID>:nvlink:<n>``, ``hw.name`` = ``gpu<i>/nvlink<n>``,
  ``hw.parent`` = the GPU's UUID. Every ``errors_interval_s``:
  ``hw.network.up`` from ``nvmlDeviceGetNvLinkState(link)`` (1 = ``NVML_FEATURE_ENABLED``) for
  links 0..count-1, and for active links ``hw.errors{hw.type=network, error.type}`` from
  ``nvmlDeviceGetNvLinkErrorCounter`` (replay, recovery, flow-control CRC, data CRC), with the
  ``hw.errors`` rule of :func:`gpumetrics.nvml.counters.error_series`.

On a MIG-enabled GPU these are read on the parent (board-level).
"""

from __future__ import annotations

import pynvml

from gpumetrics.metrics import names
from gpumetrics.metrics.buffer import Attributes
from gpumetrics.nvml import convert
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.counters import NO_ERROR, CounterSet, counter_set, error_series
from gpumetrics.nvml.device import Device, component_attrs
from gpumetrics.nvml.fields import Field, read_fields

LINK_COUNT = pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT
ALL_LINKS = 0xFFFFFFFF
"""``scopeId`` of an NVLink throughput field asking for the sum over all links (nvml.h: "A
scopeId of UINT_MAX returns aggregate value summed up across all links"; any other scope is
one link's counter)."""
DATA = (
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, names.DirectionTransmit),
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, names.DirectionReceive),
)
STATE = "nvmlDeviceGetNvLinkState"
ERRORS = "nvmlDeviceGetNvLinkErrorCounter"
ERROR_COUNTERS: tuple[tuple[int, str], ...] = (
    (pynvml.NVML_NVLINK_ERROR_DL_REPLAY, "replay"),
    (pynvml.NVML_NVLINK_ERROR_DL_RECOVERY, "recovery"),
    (pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, "crc_flit"),
    (pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA, "crc_data"),
)
"""``nvmlNvLinkErrorCounter_t`` values read and their ``error.type``."""
MAX_LINKS = 64
"""A link count above this is garbage (NVML_NVLINK_MAX_LINKS is 18 or 36)."""


def collect_nvlink_io(dev: Device, tick: Tick) -> None:
    """Add the ``nvidia.gpu.nvlink.io`` points (and learn the link count on the first read)."""
    want_io = tick.wants(names.MetricGPUNVLinkIO)
    need_links = "nvlink_links" not in dev.state and tick.wants(
        names.MetricNetworkUp, names.MetricErrors
    )
    data: list[Field] = [(f, ALL_LINKS) for f, _ in DATA] if want_io else []
    fields = ([LINK_COUNT] if need_links else []) + data
    if not fields:
        return
    values = read_fields(dev, tick, "nvlink", fields)
    if LINK_COUNT in values:
        count = int(values[LINK_COUNT])
        if 0 <= count <= MAX_LINKS:  # 0: a board without NVLink (a PCIe card), not an error
            dev.state["nvlink_links"] = count
        else:
            dev.calls.drop(
                "nvmlDeviceGetFieldValues", convert.OUT_OF_RANGE, detail=f"links={count}"
            )
    counters = counter_set(dev.state, "nvlink_io", f"GPU {dev.uuid} NVLink", tick.ctx.log)
    for field_id, direction in DATA:
        if field_id not in values:
            continue
        number, reason = convert.kib_to_bytes(int(values[field_id]))
        if number is None:
            dev.calls.drop("nvmlDeviceGetFieldValues", reason or convert.SENTINEL, detail=direction)
            continue
        start = counters.observe(direction, number, tick.now_ns)
        attrs = dev.attrs + ((names.AttrNetworkIODirection, direction),)
        tick.points.add(names.MetricGPUNVLinkIO, int(number), tick.now_ns, attrs, start)


def collect_nvlink_links(dev: Device, tick: Tick) -> None:
    """Add each link's ``hw.network.up`` and ``hw.errors`` points when due."""
    links = dev.state.get("nvlink_links")
    if not links or not tick.due(dev.state, "nvlink_ns", tick.ctx.settings.errors_interval_s):
        return
    want_up = tick.wants(names.MetricNetworkUp)
    want_errors = tick.wants(names.MetricErrors)
    c = dev.calls
    counters = counter_set(dev.state, "nvlink_errors", f"GPU {dev.uuid} NVLink", tick.ctx.log)
    for link in range(int(links)):
        active = c.get(STATE, STATE, pynvml.nvmlDeviceGetNvLinkState, dev.handle, link)
        if active is None:
            if not c.enabled(STATE):
                return
            continue
        up = int(active) == pynvml.NVML_FEATURE_ENABLED
        attrs = component_attrs(dev, "nvlink", link)
        if want_up:
            tick.points.add(names.MetricNetworkUp, int(up), tick.now_ns, attrs, dev.start_ns)
        if up and want_errors and c.enabled(ERRORS):
            _link_errors(dev, tick, link, attrs, counters)


def _link_errors(
    dev: Device, tick: Tick, link: int, attrs: Attributes, counters: CounterSet
) -> None:
    c = dev.calls
    counts: dict[str, int] = {}
    for counter, label in ERROR_COUNTERS:
        value = c.get(
            ERRORS, ERRORS, pynvml.nvmlDeviceGetNvLinkErrorCounter, dev.handle, link, counter
        )
        if value is None:
            if not c.enabled(ERRORS):
                return
            continue
        n, reason = convert.count_value(int(value))
        if n is None:
            c.drop(ERRORS, reason or convert.SENTINEL, detail=f"link {link} {label}")
            continue
        counts[label] = int(n)
    network = attrs + ((names.AttrHwType, names.HwTypeNetwork),)
    for label, n in error_series(counts):
        start = counters.observe((link, label), n, tick.now_ns)
        series = network if label == NO_ERROR else network + ((names.AttrErrorType, label),)
        tick.points.add(names.MetricErrors, n, tick.now_ns, series, start)
