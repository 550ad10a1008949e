"""Unit conversions and plausibility checks, in one place (NVML units → OTLP units).

Every reading passes through one of these functions on its way to a data point. Each returns
``(value, None)`` for a usable reading or ``(None, reason)`` for one that must be dropped and
counted under ``gpumetrics.values.dropped{reason}``; none of them ever substitutes 0.

| NVML unit | OTLP unit | rule | source |
|---|---|---|---|
| % (u32) | ratio ``1`` | ÷ 100; outside 0–100 dropped (``out_of_range``) | semconv hw; F24 |
| mW (u32) | ``W`` | ÷ 1000; 0xFFFFFFFF dropped (``sentinel``) | power calls |
| mJ (u64) | ``J`` | ÷ 1000; 2⁶⁴−1 dropped (``sentinel``) | total energy |
| MHz (u32) | ``Hz`` | × 10⁶; 0xFFFFFFFF or above 100 GHz dropped | clock info |
| KB/s (u32) | ``By/s`` | × :data:`PCIE_KB` (1024); 0xFFFFFFFF dropped | PCIe throughput |
| bytes (u64) | ``By`` | as is; 2⁶⁴−1 dropped (``sentinel``) | memory, process lists |
| °C | ``Cel`` | as is; outside −100…200 dropped | temperature calls |
| count (u64) | ``{error}`` | as is; 2⁶⁴−1 dropped | ECC error counts |
| MiB/s (double) | ``By/s`` | × 2²⁰; negative dropped | GPM rates |
| KiB (u64) | ``By`` | × 1024; 2⁶⁴−1 dropped | NVLink data counters |
| ns / µs | ``s`` | ÷ 10⁹ / ÷ 10⁶ | violation time, encoder latency |
| % of fan maximum | ratio ``1`` | ÷ 100; above 200 % dropped (may exceed 100 %) | fan speed |

**PCIe "KB" is 1024 bytes.** NVML does not say whether KB means 1000 or 1024 bytes (NVML API
reference, ``nvmlDeviceGetPcieThroughput``) and it is unverified on hardware. We follow nvitop,
NVTOP and the OLIT exporter (KiB/s; polarsignals uses 1000), so our figures match the tools
people compare us with; field case F25 expects 1024. See ``docs/collection.md``.
"""

from __future__ import annotations

U32_NA = 0xFFFFFFFF
"""``NVML_VALUE_NOT_AVAILABLE_uint``."""
U64_NA = 0xFFFFFFFFFFFFFFFF
"""``NVML_VALUE_NOT_AVAILABLE_ulonglong``."""

PCIE_KB = 1024
"""Bytes per NVML PCIe "KB" (see the module docstring for the justification)."""

MAX_CLOCK_MHZ = 100_000
"""No GPU clock domain reaches 100 GHz; larger readings are garbage."""
TEMPERATURE_RANGE_C = (-100, 200)
"""Plausible GPU temperatures (°C); NVML's signed/unsigned mix makes garbage easy to spot."""

MAX_FAN_PERCENT = 200
"""NVML's fan speed "may exceed 100%"; a reading above twice the maximum is garbage."""
MIB = 1 << 20
KIB = 1 << 10

OUT_OF_RANGE = "out_of_range"
SENTINEL = "sentinel"
NON_FINITE = "non_finite"
"""A double reading (GPM) that is NaN or ±Inf."""

Result = tuple[float | int | None, str | None]


def percent_to_ratio(percent: int | float) -> Result:
    """NVML percent (0–100) → ratio 0–1; anything outside 0–100 is dropped, never clamped (F24)."""
    if not 0 <= percent <= 100:
        return None, OUT_OF_RANGE
    return percent / 100.0, None


def mw_to_w(milliwatts: int | float) -> Result:
    """Milliwatts → watts; the u32 not-available value and negatives are dropped."""
    if milliwatts == U32_NA:
        return None, SENTINEL
    if milliwatts < 0:
        return None, OUT_OF_RANGE
    return milliwatts / 1000.0, None


def mj_to_j(millijoules: int) -> Result:
    """Millijoules → joules; the u64 not-available value is dropped."""
    if millijoules == U64_NA:
        return None, SENTINEL
    if millijoules < 0:
        return None, OUT_OF_RANGE
    return millijoules / 1000.0, None


def mhz_to_hz(mhz: int | float) -> Result:
    """Megahertz → hertz; the u32 not-available value and > 100 GHz are dropped."""
    if mhz == U32_NA:
        return None, SENTINEL
    if not 0 <= mhz <= MAX_CLOCK_MHZ:
        return None, OUT_OF_RANGE
    return float(mhz) * 1e6, None


def pcie_kbps_to_bytes_per_s(kbps: int) -> Result:
    """PCIe KB/s → bytes/s with :data:`PCIE_KB` = 1024; the u32 not-available value is dropped."""
    if kbps == U32_NA:
        return None, SENTINEL
    if kbps < 0:
        return None, OUT_OF_RANGE
    return float(kbps * PCIE_KB), None


def bytes_value(value: int | None) -> Result:
    """Bytes as reported; None or the u64 not-available value is dropped as a sentinel."""
    if value is None or value == U64_NA:
        return None, SENTINEL
    if value < 0:
        return None, OUT_OF_RANGE
    return int(value), None


def celsius(value: int | float) -> Result:
    """Degrees Celsius as reported; outside :data:`TEMPERATURE_RANGE_C` is dropped."""
    low, high = TEMPERATURE_RANGE_C
    if not low <= value <= high:
        return None, OUT_OF_RANGE
    return float(value), None


def count_value(value: int) -> Result:
    """Return an event count (ECC errors) as is; the u64 not-available value is dropped."""
    if value == U64_NA:
        return None, SENTINEL
    if value < 0:
        return None, OUT_OF_RANGE
    return int(value), None


def mib_per_s_to_bytes_per_s(value: float) -> Result:
    """MiB/s (GPM rates) → bytes/s; negative or non-finite readings are dropped."""
    if not 0 <= value < float("inf"):
        return None, OUT_OF_RANGE
    return float(value) * MIB, None


def kib_to_bytes(value: int) -> Result:
    """KiB (NVLink data counters) → bytes; the u64 not-available value is dropped."""
    if value == U64_NA:
        return None, SENTINEL
    if value < 0:
        return None, OUT_OF_RANGE
    return int(value) * KIB, None


def ns_to_s(value: int) -> Result:
    """Nanoseconds (violation time) → seconds; the u64 not-available value is dropped."""
    if value == U64_NA:
        return None, SENTINEL
    if value < 0:
        return None, OUT_OF_RANGE
    return value / 1e9, None


def us_to_s(value: int) -> Result:
    """Microseconds (encoder latency) → seconds; the u32 not-available value is dropped."""
    if value == U32_NA:
        return None, SENTINEL
    if value < 0:
        return None, OUT_OF_RANGE
    return value / 1e6, None


def fan_percent_to_ratio(percent: int) -> Result:
    """Fan speed, % of the fan's maximum → ratio; above :data:`MAX_FAN_PERCENT` dropped."""
    if percent == U32_NA:
        return None, SENTINEL
    if not 0 <= percent <= MAX_FAN_PERCENT:
        return None, OUT_OF_RANGE
    return percent / 100.0, None
