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
  ``hw.network.up`` for links 0..count-1, and for active links
  ``hw.errors{hw.type=network, error.type}`` (replay, recovery, flow-control CRC, data CRC),
  with the ``hw.errors`` rule of :func:`gpumetrics.nvml.counters.error_series`.
- **The state of every link comes from one** ``nvmlDeviceGetFieldValues`` **call**:
  ``NVML_FI_DEV_NVLINK_GET_STATE`` with the link as ``scopeId``, whose values are
  ``NVML_NVLINK_STATE_ACTIVE`` (1, up) and ``_INACTIVE`` (0, down) (``nvml.h``; NVML API
  reference, NvLink methods). A link whose field does not answer, or answers another state
  (``_SLEEP``, ``_ACTIVE_TRAFFIC_DISABLED``), is read with ``nvmlDeviceGetNvLinkState(link)``
  (1 = ``NVML_FEATURE_ENABLED``) as before: a GPU with 18 links costs one call per read
  instead of 18, a driver without the field one more call once.
- **The error counters of every active link come from one** ``nvmlDeviceGetFieldValues`` **call**
  (:func:`error_fields`): the per-link fields ``NVML_FI_DEV_NVLINK_{REPLAY,RECOVERY,CRC_FLIT,
  CRC_DATA}_ERROR_COUNT_L<n>`` for links 0-11 (``nvml.h`` defines them up to L11), and for
  links 12 and up ``NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY`` / ``_DL_RECOVERY`` with the link as
  ``scopeId``. A counter no field gives (CRC on links 12+), or whose field the device does not
  answer (NOT_SUPPORTED once: left out of later requests, :mod:`gpumetrics.nvml.fields`), is
  read with ``nvmlDeviceGetNvLinkErrorCounter(link, counter)`` as before; so a GPU with 18 active
  links costs 1 + 12 calls per read instead of 72, and a driver that answers none of the
  fields costs one extra call once. That the fields give the counters the per-link call gives is
  what ``nvml.h`` documents ("NVLink ... Error Counter for Lane/Link <n>"), not verified on
  hardware.

On a MIG-enabled GPU these are read on the parent (board-level).
"""

from __future__ import annotations

from typing import Any

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
STATE_FIELD = pynvml.NVML_FI_DEV_NVLINK_GET_STATE
_FIELD_UP = {pynvml.NVML_NVLINK_STATE_ACTIVE: True, pynvml.NVML_NVLINK_STATE_INACTIVE: False}
"""The ``NVML_FI_DEV_NVLINK_GET_STATE`` values taken as read; others go to the per-link call."""
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
_PER_LINK_FIELDS = 12
"""``nvml.h`` has per-link error-count fields for links 0-11 (``…_ERROR_COUNT_L0`` to ``_L11``)."""
_LINK_FIELD_NAMES = (
    (pynvml.NVML_NVLINK_ERROR_DL_REPLAY, "REPLAY"),
    (pynvml.NVML_NVLINK_ERROR_DL_RECOVERY, "RECOVERY"),
    (pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, "CRC_FLIT"),
    (pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA, "CRC_DATA"),
)


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
        kib = values.get((field_id, ALL_LINKS))
        if kib is None:
            continue
        number, reason = convert.kib_to_bytes(int(kib))
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
    states = read_fields(dev, tick, "nvlink_state", [(STATE_FIELD, n) for n in range(int(links))])
    active: list[tuple[int, Attributes]] = []
    for link in range(int(links)):
        up = _link_up(dev, link, states)
        if up is None:
            continue
        attrs = component_attrs(dev, "nvlink", link)
        if want_up:
            tick.points.add(names.MetricNetworkUp, int(up), tick.now_ns, attrs, dev.start_ns)
        if up and want_errors:
            active.append((link, attrs))
    if not active:
        return
    requested = [f for link, _ in active for f in error_fields(link).values()]
    values = read_fields(dev, tick, "nvlink_errors", requested)
    counters = counter_set(dev.state, "nvlink_errors", f"GPU {dev.uuid} NVLink", tick.ctx.log)
    for link, attrs in active:
        _link_errors(dev, tick, link, attrs, counters, values)


def _link_up(dev: Device, link: int, states: dict[Field, int | float]) -> bool | None:
    """Whether ``link`` is up: its state field, else ``nvmlDeviceGetNvLinkState`` (None: unread)."""
    up = _FIELD_UP.get(int(states.get((STATE_FIELD, link), -1)))
    if up is not None:
        return up
    c = dev.calls
    if not c.enabled(STATE):
        return None
    state = c.get(STATE, STATE, pynvml.nvmlDeviceGetNvLinkState, dev.handle, link)
    return None if state is None else int(state) == pynvml.NVML_FEATURE_ENABLED


def error_fields(link: int) -> dict[int, Field]:
    """Return the fields that give ``link``'s error counters, by ``nvmlNvLinkErrorCounter_t``."""
    if link < _PER_LINK_FIELDS:
        return {
            counter: getattr(pynvml, f"NVML_FI_DEV_NVLINK_{name}_ERROR_COUNT_L{link}")
            for counter, name in _LINK_FIELD_NAMES
        }
    return {
        pynvml.NVML_NVLINK_ERROR_DL_REPLAY: (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, link),
        pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, link),
    }


def _link_errors(
    dev: Device,
    tick: Tick,
    link: int,
    attrs: Attributes,
    counters: CounterSet,
    values: dict[Field, int | float],
) -> None:
    c = dev.calls
    counts: dict[str, int] = {}
    fields = error_fields(link)
    for counter, label in ERROR_COUNTERS:
        field = fields.get(counter)
        if field is not None and field in values:
            value: Any = values[field]
            source = "nvmlDeviceGetFieldValues"
        else:  # no field for it, or not answered: the per-link call
            if not c.enabled(ERRORS):
                continue
            value = c.get(
                ERRORS, ERRORS, pynvml.nvmlDeviceGetNvLinkErrorCounter, dev.handle, link, counter
            )
            source = ERRORS
            if value is None:
                continue
        n, reason = convert.count_value(int(value))
        if n is None:
            c.drop(source, reason or convert.SENTINEL, detail=f"link {link} {label}")
            continue
        counts[label] = int(n)
    network = attrs + ((names.AttrHwType, names.HwTypeNetwork),)
    for label, n in error_series(counts):
        start = counters.observe((link, label), n, tick.now_ns)
        series = network if label == NO_ERROR else network + ((names.AttrErrorType, label),)
        tick.points.add(names.MetricErrors, n, tick.now_ns, series, start)
