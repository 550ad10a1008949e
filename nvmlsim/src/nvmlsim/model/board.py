"""Scenario models for the board's health and profiling readings.

GPM (GPU Performance Monitoring, Hopper and newer), NVLink links, fans, BAR1, remapped rows,
retired pages, violation (throttle) time counters and encoder sessions. As everywhere in the
scenario format, an omitted reading answers ``NOT_SUPPORTED`` for the call that reports it, and
units are NVML's: percent, MiB/s, KiB, bytes, ns, µs, frames per second (NVML API reference,
each call's page; ``nvml.h``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field, model_validator

from nvmlsim.model.values import Dyn, Strict, named_keys

__all__ = [
    "GPM_METRIC_MAX",
    "GPM_PERCENT_IDS",
    "Gpm",
    "GpmInstance",
    "NvLinkErrors",
    "NvLink",
    "Bar1",
    "RemappedRows",
    "RetiredPages",
    "Violations",
    "VIOLATION_POLICIES",
    "EncoderStats",
]

GPM_METRIC_MAX = 98
"""Metric ids below this exist in every supported nvidia-ml-py (``NVML_GPM_METRIC_MAX`` is 98
in 12.570 and larger later); the simulator accepts ids up to it."""


GPM_PERCENT_IDS = frozenset(range(1, 20)) | frozenset(range(30, 60))
"""GPM metrics in percent (utilisation, NVDEC/NVJPG/NVOFA); the others are MiB/s rates."""


def _gpm_ids(value: object) -> object:
    """Map ``SM_UTIL`` / ``NVML_GPM_METRIC_SM_UTIL`` / ``2`` keys to metric ids 1..97."""
    out = named_keys(value, "NVML_GPM_METRIC_", "NVML_GPM_METRIC_", "GPM metric")
    if isinstance(out, dict):
        bad = [k for k in out if not isinstance(k, int) or not 1 <= k < GPM_METRIC_MAX]
        if bad:
            raise ValueError(f"GPM metric ids {bad} must be 1..{GPM_METRIC_MAX - 1}")
    return out


GpmMetrics = Annotated[dict[int, Dyn], BeforeValidator(_gpm_ids)]


class GpmInstance(Strict):
    """GPM values of one MIG GPU instance (``nvmlGpmMigSampleGet``), keyed like :class:`Gpm`."""

    metrics: GpmMetrics = Field(default_factory=dict)


class Gpm(Strict):
    """GPM support and values (``nvmlGpmQueryDeviceSupport``, ``nvmlGpmMetricsGet``).

    Its presence makes ``isSupportedDevice`` 1 (Hopper or newer); a device without ``gpm``
    answers the support query with 0, as every pre-Hopper GPU does, and the sample calls with
    NOT_SUPPORTED. ``metrics`` maps an ``NVML_GPM_METRIC_*`` id (number, or name without the
    prefix: ``SM_UTIL``) to its value in the metric's own unit (percent 0-100, or MiB/s);
    ``nvmlGpmMetricsGet`` returns the mean of that value over the two samples' interval, and
    answers NOT_SUPPORTED for ids not listed. On a MIG-enabled GPU these are the whole GPU's
    values (``nvmlGpmSampleGet`` on the parent); each instance's own are under
    ``mig.instances[].gpm``.
    """

    metrics: GpmMetrics = Field(default_factory=dict)


class NvLinkErrors(Strict):
    """``nvmlDeviceGetNvLinkErrorCounter`` counts of one link (``NVML_NVLINK_ERROR_DL_*``)."""

    replay: Dyn = 0
    recovery: Dyn = 0
    crc_flit: Dyn = 0
    crc_data: Dyn = 0
    ecc_data: Dyn = 0


class NvLink(Strict):
    """NVLink: ``links`` links (0..links-1), all active except those in ``down``.

    ``data_tx_kib`` / ``data_rx_kib`` are the GPU's cumulative data counters in KiB, all links
    together (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`` / ``_RX`` field values; a ramp).
    ``errors`` gives error counters per link number (others are 0); the ``…_TOTAL`` error field
    values are their sums. ``NVML_FI_DEV_NVLINK_LINK_COUNT`` answers ``links``. The per-link
    error-count fields (``…_ERROR_COUNT_L<n>``, ``…_ERROR_DL_REPLAY`` / ``_DL_RECOVERY`` by
    scope) answer the same counts unless ``error_fields`` is false (NOT_SUPPORTED: a driver
    whose field values lack them; ``nvmlDeviceGetNvLinkErrorCounter`` still answers), and
    ``NVML_FI_DEV_NVLINK_GET_STATE`` (scope: the link) answers each link's state (1 active,
    0 down) unless ``state_field`` is false (NOT_SUPPORTED; ``nvmlDeviceGetNvLinkState`` still
    answers).
    """

    links: int = Field(ge=1, le=36)
    down: list[int] = Field(default_factory=list)
    data_tx_kib: Dyn = 0
    data_rx_kib: Dyn = 0
    errors: dict[int, NvLinkErrors] = Field(default_factory=dict)
    error_fields: bool = True
    state_field: bool = True

    @model_validator(mode="after")
    def _known_links(self) -> NvLink:
        for field, links in (("down", self.down), ("errors", list(self.errors))):
            bad = [n for n in links if not 0 <= n < self.links]
            if bad:
                raise ValueError(f"{field}: links {bad} are outside 0..{self.links - 1}")
        return self


class Bar1(Strict):
    """``nvmlDeviceGetBAR1MemoryInfo`` in bytes (free = total - used)."""

    total_bytes: int = Field(ge=0)
    used_bytes: Dyn = 0


class RemappedRows(Strict):
    """``nvmlDeviceGetRemappedRows`` (Ampere and newer): rows remapped and the two flags."""

    correctable: Dyn = 0
    uncorrectable: Dyn = 0
    pending: bool = False
    failure: bool = False


class RetiredPages(Strict):
    """Retired pages (page retirement, before Ampere).

    Answered through the field values ``NVML_FI_DEV_RETIRED_SBE`` / ``_DBE`` / ``_PENDING``.
    """

    single_bit: Dyn = 0
    double_bit: Dyn = 0
    pending: bool = False


#: ``nvmlPerfPolicyType_t`` -> :class:`Violations` field (``NVML_PERF_POLICY_*``).
VIOLATION_POLICIES: dict[int, str] = {
    0: "power",
    1: "thermal",
    2: "sync_boost",
    3: "board_limit",
    4: "low_utilization",
    5: "reliability",
    10: "total_app_clocks",
    11: "total_base_clocks",
}


class Violations(Strict):
    """``nvmlDeviceGetViolationStatus`` per policy: cumulative violation time in ns (a ramp).

    An omitted policy answers NOT_SUPPORTED.
    """

    power: Dyn | None = None
    thermal: Dyn | None = None
    sync_boost: Dyn | None = None
    board_limit: Dyn | None = None
    low_utilization: Dyn | None = None
    reliability: Dyn | None = None
    total_app_clocks: Dyn | None = None
    total_base_clocks: Dyn | None = None


class EncoderStats(Strict):
    """``nvmlDeviceGetEncoderStats``: sessions, average FPS and latency (µs) over them."""

    sessions: Dyn = 0
    average_fps: Dyn = 0
    average_latency_us: Dyn = 0
