"""Leaf types of the scenario format: return codes, raw byte strings and values over time.

A *dynamic value* (``Dyn``) is either a number or a pattern that the simulation evaluates at
the moment of each call:

``sine``
    ``min + (max-min) * (1 + sin(2π (t + phase_s) / period_s)) / 2``
``square``
    ``first`` for the first ``duty`` fraction of each ``period_s``, ``rest`` after it
``ramp``
    ``start + per_s * t`` (an energy counter is a ramp of the average power)
``trace``
    a recorded series, one value per cycle (``per: cycle``) or per ``step_s`` seconds
    (``per: second``); after the end it holds the last value or repeats

``t`` is seconds since the simulation was installed; cycle 1 starts at install time.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from nvmlsim.codes import parse_code

__all__ = [
    "Code",
    "RawBytes",
    "Strict",
    "Sine",
    "Square",
    "Ramp",
    "Trace",
    "Pattern",
    "Dyn",
    "evaluate",
    "bounds",
    "VALUE_TYPES",
    "ValueType",
    "Window",
    "named_keys",
    "GpuUuid",
    "MigUuid",
    "OLD_MIG_UUID",
]


class Strict(BaseModel):
    """Base of every scenario model: strict, immutable, finite.

    Unknown keys are errors, instances are immutable, and numbers are finite (a NaN or infinite
    reading is a validation error naming the field).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


_HEX_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_GPU_UUID = re.compile(rf"GPU-{_HEX_UUID}")
_MIG_UUID = re.compile(rf"MIG-{_HEX_UUID}")
OLD_MIG_UUID = re.compile(rf"MIG-(?P<gpu>GPU-{_HEX_UUID})/(?P<gi>[0-9]+)/(?P<ci>[0-9]+)")
"""The MIG UUID of R450-R465 drivers: ``MIG-<GPU UUID>/<GPU instance id>/<compute instance id>``."""


def _gpu_uuid(value: str) -> str:
    if not _GPU_UUID.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an NVML GPU UUID: GPU- and 32 lowercase hex digits as 8-4-4-4-12 "
            "(GPU-7c1e2a90-3f4b-4d21-8e6a-0b9c5d3e1f70), as nvmlDeviceGetUUID and nvidia-smi -L "
            "give it"
        )
    return value


def _mig_uuid(value: str) -> str:
    if not (_MIG_UUID.fullmatch(value) or OLD_MIG_UUID.fullmatch(value)):
        raise ValueError(
            f"{value!r} is not an NVML MIG device UUID: MIG- and 32 lowercase hex digits as "
            "8-4-4-4-12 (MIG-2d4f6b8c-0e1a-5c3d-a5e7-9b1d3f5a7c48, R470 and later), or the "
            "older MIG-<GPU UUID>/<GPU instance id>/<compute instance id> (R450-R465)"
        )
    return value


#: A GPU's UUID as NVML gives it (``nvmlDeviceGetUUID``; nvidia-smi -L prints the same).
GpuUuid = Annotated[str, AfterValidator(_gpu_uuid)]
#: A MIG device's UUID: ``MIG-`` + 8-4-4-4-12 hex (R470+), or ``MIG-GPU-<uuid>/<gi>/<ci>``.
MigUuid = Annotated[str, AfterValidator(_mig_uuid)]


def _code(value: object) -> int:
    return parse_code(value)


#: An NVML return code written as a name (``NOT_SUPPORTED``) or an integer.
Code = Annotated[int, BeforeValidator(_code)]


def _raw_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return value.encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError(
                "raw byte strings may only hold characters U+0000..U+00FF (one byte each); "
                'write a byte as \\xNN inside a double-quoted YAML string, or use "name" for text'
            ) from None
    raise ValueError(f"must be a string, got {type(value).__name__}")


#: Bytes given as a YAML string whose characters are all U+0000–U+00FF (``"pyth\xe9n"``
#: is the 6 bytes ``70 79 74 68 e9 6e``) or as ``!!binary``. Used to inject non-UTF-8 names.
RawBytes = Annotated[bytes, BeforeValidator(_raw_bytes)]


class Sine(Strict):
    """A sinusoid between ``min`` and ``max`` with period ``period_s`` seconds."""

    pattern: Literal["sine"]
    min: float
    max: float
    period_s: float = Field(gt=0)
    phase_s: float = 0.0

    @model_validator(mode="after")
    def _order(self) -> Sine:
        if self.max < self.min:
            raise ValueError("max: must be >= min")
        return self


class Square(Strict):
    """``first`` for the first ``duty`` fraction of every ``period_s`` seconds, then ``rest``."""

    pattern: Literal["square"]
    first: float
    rest: float
    period_s: float = Field(gt=0)
    duty: float = Field(default=0.5, ge=0, le=1)
    phase_s: float = 0.0


class Ramp(Strict):
    """A straight line ``start + per_s * t``; ``per_s`` may be negative."""

    pattern: Literal["ramp"]
    start: float
    per_s: float


class Trace(Strict):
    """A recorded series: one value per cycle, or per ``step_s`` seconds of simulated time."""

    pattern: Literal["trace"]
    values: list[float] = Field(min_length=1)
    per: Literal["cycle", "second"] = "cycle"
    step_s: float = Field(default=1.0, gt=0)
    after: Literal["hold", "repeat"] = "hold"


Pattern = Annotated[Sine | Square | Ramp | Trace, Field(discriminator="pattern")]

#: A number, or a pattern evaluated at each call.
Dyn = int | float | Pattern


def evaluate(value: Dyn, t: float, cycle: int) -> float:
    """Return ``value`` at ``t`` seconds after install, in cycle ``cycle`` (1-based)."""
    if isinstance(value, int | float):
        return value
    if isinstance(value, Sine):
        phase = 2 * math.pi * (t + value.phase_s) / value.period_s
        return value.min + (value.max - value.min) * (1 + math.sin(phase)) / 2
    if isinstance(value, Square):
        frac = ((t + value.phase_s) % value.period_s) / value.period_s
        return value.first if frac < value.duty else value.rest
    if isinstance(value, Ramp):
        return value.start + value.per_s * t
    if value.per == "cycle":
        step = cycle - 1
    else:  # integer µs, so 0.7 s / 0.1 s is step 7, not 6.999...
        step = round(t * 1_000_000) // round(value.step_s * 1_000_000)
    n = len(value.values)
    step = max(step, 0)
    if step >= n:
        step = step % n if value.after == "repeat" else n - 1
    return value.values[step]


def bounds(value: Dyn) -> tuple[float, float]:
    """Smallest and largest value ``value`` can take (a ramp is unbounded on one side)."""
    if isinstance(value, int | float):
        return (value, value)
    if isinstance(value, Sine):
        return (value.min, value.max)
    if isinstance(value, Square):
        return (min(value.first, value.rest), max(value.first, value.rest))
    if isinstance(value, Ramp):
        if value.per_s >= 0:
            return (value.start, math.inf)
        return (-math.inf, value.start)
    return (min(value.values), max(value.values))


#: ``NVML_VALUE_TYPE_*``: which member of ``c_nvmlValue_t`` a sample buffer fills.
VALUE_TYPES: dict[str, int] = {
    "DOUBLE": 0,
    "UNSIGNED_INT": 1,
    "UNSIGNED_LONG": 2,
    "UNSIGNED_LONG_LONG": 3,
    "SIGNED_LONG_LONG": 4,
    "SIGNED_INT": 5,
    "UNSIGNED_SHORT": 6,
}


def _value_type(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value in VALUE_TYPES.values():
        return value
    if isinstance(value, str) and value.upper().removeprefix("NVML_VALUE_TYPE_") in VALUE_TYPES:
        return VALUE_TYPES[value.upper().removeprefix("NVML_VALUE_TYPE_")]
    raise ValueError(f"unknown value type {value!r}; known: {', '.join(VALUE_TYPES)} or 0..6")


#: ``NVML_VALUE_TYPE_*`` by name (``UNSIGNED_INT``) or number.
ValueType = Annotated[int, BeforeValidator(_value_type)]


class Window(Strict):
    """When something applies.

    Cycles ``[from_cycle, until_cycle)`` and/or seconds
    ``[from_s, until_s)`` after install; every bound given must hold.
    """

    from_cycle: int | None = Field(default=None, ge=1)
    until_cycle: int | None = Field(default=None, ge=1)
    from_s: float | None = Field(default=None, ge=0)
    until_s: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Window:
        if self.from_cycle is not None and self.until_cycle is not None:
            if self.until_cycle <= self.from_cycle:
                raise ValueError("until_cycle: must be > from_cycle")
        if self.from_s is not None and self.until_s is not None and self.until_s <= self.from_s:
            raise ValueError("until_s: must be > from_s")
        return self

    def active(self, t: float, cycle: int) -> bool:
        """Whether ``t`` seconds / cycle ``cycle`` lie inside the window."""
        if self.from_cycle is not None and cycle < self.from_cycle:
            return False
        if self.until_cycle is not None and cycle >= self.until_cycle:
            return False
        if self.from_s is not None and t < self.from_s:
            return False
        return not (self.until_s is not None and t >= self.until_s)


def named_keys(value: object, prefix: str, default_prefix: str, what: str) -> object:
    """Turn the keys of a mapping from NVML constant names into their numbers.

    A key is a number, a full name (``NVML_FI_DEV_POWER_INSTANT``) starting with ``prefix``, or
    a short one that ``default_prefix`` completes (``POWER_INSTANT``). Used as a pydantic
    ``BeforeValidator``; anything but a mapping is left for the field's own validation.

    Raises:
        ValueError: naming the key, for a name nvidia-ml-py does not define or a key given
            twice (``what`` says what the keys are, for the message).

    """
    if not isinstance(value, dict):
        return value
    import pynvml

    out: dict[object, object] = {}
    for key, item in value.items():
        if isinstance(key, str) and not key.isdigit():
            name = key.upper()
            name = name if name.startswith(prefix) else f"{default_prefix}{name}"
            number = getattr(pynvml, name, None)
            if not isinstance(number, int):
                raise ValueError(f"unknown {what} {key!r} (use a number or a {prefix}* name)")
            key = number
        key = int(key) if isinstance(key, str) else key
        if key in out:
            raise ValueError(f"{what} {key} is given twice")
        out[key] = item
    return out
