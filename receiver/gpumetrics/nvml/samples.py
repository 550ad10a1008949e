"""Driver sample buffers: ``nvmlDeviceGetSamples`` with cursors, typed decoding and time conversion.

**Cursors.** Each (device, sampling type) keeps the newest driver timestamp it has seen, in the
driver's own clock domain, and passes it as ``lastSeenTimeStamp`` on the next call, so each
buffered sample is read exactly once and becomes its own point. NOT_FOUND (nothing newer) leaves
the cursor unchanged and is not an error (F19). The first call passes 0, which returns what the
driver still buffers; of that, only the last tick's worth (``interval_s``) is kept.

**Decoding.** Each sample's ``nvmlValue_t`` union is read through the member its declared value
type names (``uiVal`` for UNSIGNED_INT, ...), never as a 64-bit integer: utilisation, power and
clock samples are ``unsigned int`` and the upper bytes of the union may be garbage (F24). An
unknown value type drops the sample (``unknown_value_type``).

**Clock domain.** NVML documents sample timestamps as "CPU timestamp in µs"; most hosts give
Unix-epoch µs, but at least one platform counts from boot (found by polarsignals, whose
gpu-metrics-agent shifts sample times for it: https://github.com/polarsignals/gpu-metrics-agent).
:class:`TimeBase` decides per timestamp: values at or above :data:`EPOCH_THRESHOLD_US`
(2001-09-09, about 31 years of uptime) are epoch µs; smaller values are µs since boot and are
shifted by the host's boot time (Unix ns). Only the converted time goes into points; cursors
stay in the driver's domain.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pynvml

from gpumetrics.nvml import records
from gpumetrics.nvml.query import ErrorKind, QueryError
from gpumetrics.nvml.records import Buffers

_THOUSAND = 1000
EPOCH_THRESHOLD_US = 1_000_000_000_000_000
"""Timestamps (µs) at or above this are Unix-epoch; below, µs since boot (≈31.7 years)."""

FUTURE_SLACK_NS = 5_000_000_000
"""A converted sample time more than this (5 s) after the collector's clock is dropped."""

_MEMBER_BY_TYPE: dict[int, str] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}

FUNCTION = "nvmlDeviceGetSamples"

# Sampling types (NVML_*_SAMPLES) the collector reads.
TOTAL_POWER = pynvml.NVML_TOTAL_POWER_SAMPLES
GPU_UTILIZATION = pynvml.NVML_GPU_UTILIZATION_SAMPLES
MEMORY_UTILIZATION = pynvml.NVML_MEMORY_UTILIZATION_SAMPLES


def decode_value(value_type: int, value: Any) -> int | float | None:
    """Read an ``nvmlValue_t`` union through the member of its declared ``value_type``.

    Returns:
        The number (int for integer types, float for DOUBLE), or None for an unknown type.

    """
    member = _MEMBER_BY_TYPE.get(int(value_type))
    if member is None:
        return None
    return getattr(value, member)  # type: ignore[no-any-return]


def boot_time_ns() -> int:
    """Return the host's boot time in Unix-epoch ns (wall clock minus ``CLOCK_BOOTTIME``).

    ``CLOCK_BOOTTIME`` includes suspend, so it matches a driver counting µs since boot on hosts
    that suspend; on servers it equals ``CLOCK_MONOTONIC``. (Which of the two a boot-domain
    driver uses is unverified on hardware.)
    """
    clock = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
    return time.time_ns() - time.clock_gettime_ns(clock)


class TimeBase:
    """Converts driver timestamps (µs, epoch or since boot) to Unix-epoch ns.

    Args:
        boot_time_ns: returns the host's boot time in Unix-epoch ns; called once, on the first
            boot-domain timestamp.

    """

    def __init__(self, boot_time_ns: Callable[[], int] = boot_time_ns) -> None:
        self._boot_time = boot_time_ns
        self._boot_ns: int | None = None

    def to_unix_ns(self, driver_us: int) -> int:
        """Convert one driver timestamp (µs) to Unix-epoch ns."""
        if driver_us >= EPOCH_THRESHOLD_US:
            return driver_us * 1000
        if self._boot_ns is None:
            self._boot_ns = self._boot_time()
        return self._boot_ns + driver_us * 1000

    def to_unix_ns_all(self, driver_us: Sequence[int]) -> list[int]:
        """Convert many driver timestamps (µs) to Unix-epoch ns, as :meth:`to_unix_ns` does."""
        if driver_us and min(driver_us) >= EPOCH_THRESHOLD_US:
            return list(map(_THOUSAND.__mul__, driver_us))  # all epoch µs: no Python per value
        return [self.to_unix_ns(t) for t in driver_us]


@dataclass(frozen=True, slots=True)
class Sample:
    """One decoded driver sample.

    Attributes:
        driver_us: the timestamp as the driver gave it (µs, its clock domain).
        time_unix_nano: the same instant in Unix-epoch ns.
        value: the decoded value in the sampling type's unit (%, mW, MHz).

    """

    driver_us: int
    time_unix_nano: int
    value: int | float


@dataclass
class Decoded:
    """The result of decoding one ``nvmlDeviceGetSamples`` answer.

    Attributes:
        samples: decoded samples, oldest first.
        newest_us: the largest driver timestamp seen (for the cursor), or None when empty.
        unknown_type: samples dropped because their value type is unknown.
        future: samples dropped because their converted time lies in the future.

    """

    samples: list[Sample]
    newest_us: int | None
    unknown_type: int = 0
    future: int = 0


def decode_samples(value_type: int, raw: list[Any], timebase: TimeBase, now_ns: int) -> Decoded:
    """Decode the ``(value_type, [c_nvmlSample_t])`` pair nvidia-ml-py returns.

    Samples are sorted by driver timestamp; each keeps its own (converted) timestamp.
    """
    pairs = [(int(s.timeStamp), decode_value(value_type, s.sampleValue)) for s in raw]
    return decode_pairs(pairs, timebase, now_ns)


def decode_pairs(
    pairs: list[tuple[int, int | float | None]], timebase: TimeBase, now_ns: int
) -> Decoded:
    """Decode ``(driver timestamp µs, value)`` pairs (value None: an unknown value type).

    Samples are sorted by driver timestamp; each keeps its own (converted) timestamp.
    """
    out = Decoded([], None)
    limit = now_ns + FUTURE_SLACK_NS
    for ts, value in sorted(pairs, key=_first):
        if out.newest_us is None or ts > out.newest_us:
            out.newest_us = ts
        if value is None:
            out.unknown_type += 1
            continue
        unix_ns = timebase.to_unix_ns(ts)
        if unix_ns > limit:
            out.future += 1
            continue
        out.samples.append(Sample(ts, unix_ns, value))
    return out


def _first(pair: tuple[int, Any]) -> int:
    return pair[0]


class Cursors:
    """``lastSeenTimeStamp`` per sampling type (or per API) for one device, in driver µs."""

    def __init__(self) -> None:
        self._last: dict[Any, int] = {}

    def get(self, key: Any) -> int:
        """Return the cursor for ``key``: the newest driver timestamp seen, or 0 at first."""
        return self._last.get(key, 0)

    def advance(self, key: Any, newest_us: int | None) -> None:
        """Move the cursor for ``key`` forward to ``newest_us`` (never backwards; None: no-op)."""
        if newest_us is not None and newest_us > self._last.get(key, 0):
            self._last[key] = newest_us

    def snapshot(self) -> dict[Any, int]:
        """Return a copy of every cursor (for tests and debugging)."""
        return dict(self._last)


def read_samples(
    calls: Any,
    handle: Any,
    cursors: Cursors,
    sampling_type: int,
    timebase: TimeBase,
    now_ns: int,
    first_window_ns: int,
    buffers: Buffers,
) -> list[Sample] | None:
    """Read the samples of one type newer than its cursor and advance the cursor.

    Args:
        calls: the device's :class:`~gpumetrics.nvml.calls.DeviceCalls`.
        handle: the device handle.
        cursors: the device's cursors (keyed by sampling type).
        sampling_type: an ``NVML_*_SAMPLES`` value.
        timebase: driver timestamps → Unix-epoch ns.
        now_ns: the collector's wall clock (drops samples from the future).
        first_window_ns: on the first read (cursor 0, which returns the whole driver buffer),
            only samples from the last ``first_window_ns`` are kept: older ones predate the
            collector and would arrive as one burst of history.
        buffers: the device's kept buffers (one C call per read once the size is known,
            :mod:`gpumetrics.nvml.records`).

    Returns:
        The decoded samples (oldest first; possibly empty after drops), an empty list when the
        buffer has nothing new (NOT_FOUND: no error, cursor unchanged, F19), or None when the
        sampling type is unavailable (NOT_SUPPORTED, missing symbol, other failure), so the
        caller falls back to the snapshot call.

    Raises:
        DeviceLost, LibraryDown: as from the gate.

    """
    cap = f"nvmlDeviceGetSamples:{sampling_type}"
    if not calls.enabled(cap) or not calls.enabled(FUNCTION):
        return None
    cursor = cursors.get(sampling_type)
    try:
        _, pairs = calls.query(
            cap, FUNCTION, records.samples, handle, sampling_type, cursor, buffers
        )
    except QueryError as err:
        return [] if err.kind is ErrorKind.NOT_FOUND else None
    first = cursor == 0
    decoded = decode_pairs(pairs, timebase, now_ns)
    cursors.advance(sampling_type, decoded.newest_us)
    if decoded.unknown_type:
        calls.drop(FUNCTION, "unknown_value_type", decoded.unknown_type)
    if decoded.future:
        calls.drop(FUNCTION, "timestamp_out_of_range", decoded.future)
    if first:
        return [s for s in decoded.samples if s.time_unix_nano > now_ns - first_window_ns]
    return decoded.samples
