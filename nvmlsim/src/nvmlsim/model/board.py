"""Scenario models for the board's health and profiling readings.

GPM (GPU Performance Monitoring, Hopper and newer), NVLink links, fans, BAR1, remapped rows,
retired pages, violation (throttle) time counters and encoder sessions. As everywhere in the
scenario format, an omitted reading answers ``NOT_SUPPORTED`` for the call that reports it, and
units are NVML's: percent, MiB/s, KiB, bytes, ns, µs, frames per second (NVML API reference,
each call's page; ``nvml.h``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, ConfigDict, Field, model_validator

from nvmlsim.model.values import Dyn, Pattern, Ramp, Sine, Square, Strict, Trace, Window, named_keys

__all__ = [
    "GPM_METRIC_MAX",
    "GPM_PERCENT_IDS",
    "Gpm",
    "GpmInstance",
    "GpmTrace",
    "GpmValue",
    "NvLinkErrors",
    "NvLink",
    "LinkDown",
    "LinkTraffic",
    "Flag",
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


class GpmTrace(Trace):
    """A recorded series of GPM values, which, unlike other readings, may be NaN or ±Inf."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=True)


#: A GPM metric value: a number or a pattern, like every reading, except that a number or a
#: trace step may be NaN or ±Inf (YAML ``.nan``, ``.inf``, ``-.inf``): ``nvmlGpmMetricsGet``
#: returns doubles, and a real GPM answer can be non-finite.
GpmValue = (
    int
    | Annotated[float, Field(allow_inf_nan=True)]
    | Annotated[Sine | Square | Ramp | GpmTrace, Field(discriminator="pattern")]
)

GpmMetrics = Annotated[dict[int, GpmValue], BeforeValidator(_gpm_ids)]


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
    answers NOT_SUPPORTED for ids not listed. A value may be NaN or ±Inf (a number, or steps
    of a ``trace``): an interval that touches such a step gives that non-finite mean. On a
    MIG-enabled GPU these are the whole GPU's values (``nvmlGpmSampleGet`` on the parent);
    each instance's own are under ``mig.instances[].gpm``.
    """

    metrics: GpmMetrics = Field(default_factory=dict)


class NvLinkErrors(Strict):
    """``nvmlDeviceGetNvLinkErrorCounter`` counts of one link (``NVML_NVLINK_ERROR_DL_*``)."""

    replay: Dyn = 0
    recovery: Dyn = 0
    crc_flit: Dyn = 0
    crc_data: Dyn = 0
    ecc_data: Dyn = 0


class LinkDown(Window):
    """A link that is down during a window (``[from_cycle, until_cycle)`` and/or seconds)."""

    link: int = Field(ge=0)


class LinkTraffic(Strict):
    """One link's cumulative NVLink data counters in KiB (a ramp), per direction."""

    data_tx_kib: Dyn = 0
    data_rx_kib: Dyn = 0


class NvLink(Strict):
    """NVLink: ``links`` links (0..links-1), all active except those ``down``.

    ``down`` lists links that are down the whole run (a number) or during a window
    (``{link: 3, from_cycle: 5, until_cycle: 9}``: ``nvmlDeviceGetNvLinkState`` answers 0 then).
    Data counters (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`` / ``_RX`` field values, KiB): a
    field's ``scopeId`` is the link, and ``UINT_MAX`` asks for the sum over all links (nvml.h,
    "NVLink throughput counters field values"). ``per_link`` gives each link's counters (links
    not listed count 0; the sum is their total); without it, ``data_tx_kib`` / ``data_rx_kib``
    are the GPU's totals, spread evenly over the links (each link non-decreasing, the links
    summing exactly to the total). ``errors`` gives error counters per link number (others
    are 0); the ``…_TOTAL`` error field values are their sums.
    ``NVML_FI_DEV_NVLINK_LINK_COUNT`` answers ``links``. The per-link error-count fields
    (``…_ERROR_COUNT_L<n>``, ``…_ERROR_DL_REPLAY`` / ``_DL_RECOVERY`` by scope) answer the same
    counts unless ``error_fields`` is false (NOT_SUPPORTED: a driver whose field values lack
    them; ``nvmlDeviceGetNvLinkErrorCounter`` still answers), and
    ``NVML_FI_DEV_NVLINK_GET_STATE`` (scope: the link) answers each link's state (1 active,
    0 down, as ``nvmlDeviceGetNvLinkState`` would at that moment) unless ``state_field`` is
    false (NOT_SUPPORTED; ``nvmlDeviceGetNvLinkState`` still answers).
    """

    links: int = Field(ge=1, le=36)
    down: list[int | LinkDown] = Field(default_factory=list)
    data_tx_kib: Dyn = 0
    data_rx_kib: Dyn = 0
    per_link: dict[int, LinkTraffic] = Field(default_factory=dict)
    errors: dict[int, NvLinkErrors] = Field(default_factory=dict)
    error_fields: bool = True
    state_field: bool = True

    @model_validator(mode="after")
    def _known_links(self) -> NvLink:
        down = [d if isinstance(d, int) else d.link for d in self.down]
        for field, links in (
            ("down", down),
            ("errors", list(self.errors)),
            ("per_link", list(self.per_link)),
        ):
            bad = [n for n in links if not 0 <= n < self.links]
            if bad:
                raise ValueError(f"{field}: links {bad} are outside 0..{self.links - 1}")
        totals = {"data_tx_kib", "data_rx_kib"} & self.model_fields_set
        if self.per_link and totals:
            raise ValueError(
                f"{sorted(totals)[0]}: give the GPU's totals or per_link, not both (with "
                "per_link the totals are the links' sum)"
            )
        return self

    def is_up(self, link: int, t: float, cycle: int) -> bool:
        """Whether ``link`` is active at ``t`` seconds after install, in cycle ``cycle``."""
        for d in self.down:
            if isinstance(d, int):
                if d == link:
                    return False
            elif d.link == link and d.active(t, cycle):
                return False
        return True


class Bar1(Strict):
    """``nvmlDeviceGetBAR1MemoryInfo`` in bytes (free = total - used)."""

    total_bytes: int = Field(ge=0)
    used_bytes: Dyn = 0


#: A flag: a boolean, or a pattern of 0/1 values (a ``trace`` for a flag that changes).
Flag = bool | Pattern


class RemappedRows(Strict):
    """``nvmlDeviceGetRemappedRows`` (Ampere and newer): rows remapped and the two flags.

    Counts and flags may change over time (patterns, e.g. a ``trace`` per cycle). The call
    answers NOT_SUPPORTED while MIG is enabled (nvml.h), and the scenario checks refuse
    remapped rows on a board without ``ecc``: row remapping repairs ECC memory.
    """

    correctable: Dyn = 0
    uncorrectable: Dyn = 0
    pending: Flag = False
    failure: Flag = False


class RetiredPages(Strict):
    """Retired pages (page retirement, before Ampere): counts per cause and the pending flag.

    Answered through the field values ``NVML_FI_DEV_RETIRED_SBE`` / ``_DBE`` / ``_PENDING``,
    ``nvmlDeviceGetRetiredPages`` (one synthetic page address per retired page, with nvml.h's
    size probe) and ``nvmlDeviceGetRetiredPagesPendingStatus``.
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
