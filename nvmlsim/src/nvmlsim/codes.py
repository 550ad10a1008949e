"""NVML return codes and the strings ``nvmlErrorString`` gives for them.

Codes are taken from nvidia-ml-py's ``NVML_ERROR_*`` constants (``nvml.h``, NVML API 13) so the
simulation can never disagree with the binding about a number. Scenario files may name a code
as ``NOT_SUPPORTED``, ``NVML_ERROR_NOT_SUPPORTED`` (any case) or give the integer.
"""

from __future__ import annotations

import pynvml

__all__ = [
    "SUCCESS",
    "CODES",
    "code_name",
    "error_string",
    "parse_code",
    "UNINITIALIZED",
    "INVALID_ARGUMENT",
    "NOT_SUPPORTED",
    "NO_PERMISSION",
    "NOT_FOUND",
    "INSUFFICIENT_SIZE",
    "FUNCTION_NOT_FOUND",
    "GPU_IS_LOST",
    "LIB_RM_VERSION_MISMATCH",
    "IN_USE",
    "ARGUMENT_VERSION_MISMATCH",
    "TIMEOUT",
    "UNKNOWN",
]

SUCCESS = 0

#: Every code nvidia-ml-py knows, by short name (``NOT_SUPPORTED``), plus ``SUCCESS``.
CODES: dict[str, int] = {"SUCCESS": SUCCESS} | {
    name[len("NVML_ERROR_") :]: int(getattr(pynvml, name))
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_")
}

UNINITIALIZED = CODES["UNINITIALIZED"]
INVALID_ARGUMENT = CODES["INVALID_ARGUMENT"]
NOT_SUPPORTED = CODES["NOT_SUPPORTED"]
NO_PERMISSION = CODES["NO_PERMISSION"]
NOT_FOUND = CODES["NOT_FOUND"]
INSUFFICIENT_SIZE = CODES["INSUFFICIENT_SIZE"]
FUNCTION_NOT_FOUND = CODES["FUNCTION_NOT_FOUND"]
GPU_IS_LOST = CODES["GPU_IS_LOST"]
LIB_RM_VERSION_MISMATCH = CODES["LIB_RM_VERSION_MISMATCH"]
IN_USE = CODES["IN_USE"]
ARGUMENT_VERSION_MISMATCH = CODES["ARGUMENT_VERSION_MISMATCH"]
TIMEOUT = CODES["TIMEOUT"]
UNKNOWN = CODES["UNKNOWN"]

_NAMES = {value: name for name, value in CODES.items()}

# Texts of libnvidia-ml's nvmlErrorString where the binding's own table has none.
_EXTRA_STRINGS = {
    SUCCESS: "Success",
    CODES["IN_USE"]: "In use by another client",
    CODES["NO_DATA"]: "No data",
    CODES["VGPU_ECC_NOT_SUPPORTED"]: "vGPU ECC is not supported",
    CODES["INSUFFICIENT_RESOURCES"]: "Insufficient resources",
    CODES["FREQ_NOT_SUPPORTED"]: "Frequency not supported",
    CODES["ARGUMENT_VERSION_MISMATCH"]: "Argument version mismatch",
    CODES["DEPRECATED"]: "Deprecated",
    CODES["NOT_READY"]: "Not ready",
    CODES["GPU_NOT_FOUND"]: "GPU not found",
    CODES["INVALID_STATE"]: "Invalid state",
}


def code_name(code: int) -> str:
    """Return the short name of ``code`` (``"NOT_SUPPORTED"``), or ``"CODE_<n>"`` if unknown."""
    return _NAMES.get(code, f"CODE_{code}")


def error_string(code: int) -> bytes:
    """Return the ASCII text ``nvmlErrorString(code)`` gives (``b"Unknown Error"`` if unknown)."""
    known: dict[int, str] = dict(pynvml.NVMLError._errcode_to_string)
    text = _EXTRA_STRINGS.get(code) or known.get(code) or "Unknown Error"
    return text.encode("ascii", "replace")


def parse_code(value: object) -> int:
    """Turn a scenario's code (name or non-negative int) into its integer value.

    Raises:
        ValueError: unknown name, negative or non-integer value (message lists valid names).

    """
    if isinstance(value, bool):
        raise ValueError("must be an NVML return code name or integer, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must be >= 0, got {value}")
        return value
    if isinstance(value, str):
        key = value.strip().upper()
        if key.startswith("NVML_ERROR_"):
            key = key[len("NVML_ERROR_") :]
        if key.startswith("NVML_"):
            key = key[len("NVML_") :]
        if key in CODES:
            return CODES[key]
        raise ValueError(f"unknown NVML return code {value!r}; known: {', '.join(sorted(CODES))}")
    raise ValueError(f"must be an NVML return code name or integer, got {type(value).__name__}")
