"""One choke point for NVML calls: every failure becomes a :class:`QueryError` of a closed kind.

nvidia-ml-py raises three unrelated exception families (its ``pynvml.py``):
``NVMLError`` and its generated subclasses; ``NVMLLibraryMismatchError``, a plain ``Exception``
raised by the unversioned process wrappers when a symbol is missing (trap 1); and
``UnicodeDecodeError`` from the strict UTF-8 decoding of returned strings (trap 2, field case
F26). :func:`query` turns all three into :class:`QueryError` with one of the kinds in
:class:`ErrorKind`, so the rest of the package reacts to *what happened* (capability missing,
GPU lost, no data...) rather than to exception classes.

Nothing here keeps state: capability caches, log-once and error counting live in
:mod:`gpumetrics.nvml.calls`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

T = TypeVar("T")


class ErrorKind(enum.StrEnum):
    """The closed set of NVML failure kinds and what each means for the caller.

    ``unsupported``: NOT_SUPPORTED — the capability is missing on this device; disable the call.
    ``no_permission``: NO_PERMISSION — not allowed (non-root MIG parent, cgroup-hidden GPU).
    ``gpu_lost``: GPU_IS_LOST and friends (RESET_REQUIRED, IRQ_ISSUE, INSUFFICIENT_POWER,
    GPU_NOT_FOUND) — the device has fallen off the bus or needs a reset.
    ``not_found``: NOT_FOUND / NO_DATA, or SUCCESS on a sizing call — no data right now (an empty
    sample buffer, an empty MIG slot); normal, never an error.
    ``function_missing``: FUNCTION_NOT_FOUND or ``NVMLLibraryMismatchError`` — the driver lacks
    the symbol, or a present symbol refused a struct version (F03).
    ``invalid``: INVALID_ARGUMENT, ARGUMENT_VERSION_MISMATCH, or an undecodable string — a stale
    handle or garbage.
    ``timeout``: TIMEOUT from the driver, or a call abandoned at the per-call deadline.
    ``unknown``: everything else (UNKNOWN 999, INSUFFICIENT_SIZE, IN_USE, OPERATING_SYSTEM, ...),
    and the library-lifecycle codes (see :attr:`QueryError.lifecycle`).
    """

    UNSUPPORTED = "unsupported"
    NO_PERMISSION = "no_permission"
    GPU_LOST = "gpu_lost"
    NOT_FOUND = "not_found"
    FUNCTION_MISSING = "function_missing"
    INVALID = "invalid"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"


_KIND_BY_CODE: dict[int, ErrorKind] = {
    pynvml.NVML_SUCCESS: ErrorKind.NOT_FOUND,  # SUCCESS on a sizing call: nothing to read
    pynvml.NVML_ERROR_NOT_SUPPORTED: ErrorKind.UNSUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION: ErrorKind.NO_PERMISSION,
    pynvml.NVML_ERROR_GPU_IS_LOST: ErrorKind.GPU_LOST,
    pynvml.NVML_ERROR_RESET_REQUIRED: ErrorKind.GPU_LOST,
    pynvml.NVML_ERROR_IRQ_ISSUE: ErrorKind.GPU_LOST,
    pynvml.NVML_ERROR_INSUFFICIENT_POWER: ErrorKind.GPU_LOST,
    pynvml.NVML_ERROR_GPU_NOT_FOUND: ErrorKind.GPU_LOST,
    pynvml.NVML_ERROR_NOT_FOUND: ErrorKind.NOT_FOUND,
    pynvml.NVML_ERROR_NO_DATA: ErrorKind.NOT_FOUND,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: ErrorKind.FUNCTION_MISSING,
    pynvml.NVML_ERROR_INVALID_ARGUMENT: ErrorKind.INVALID,
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: ErrorKind.INVALID,
    pynvml.NVML_ERROR_TIMEOUT: ErrorKind.TIMEOUT,
}

GPU_LOST_CODES: frozenset[int] = frozenset(
    code for code, kind in _KIND_BY_CODE.items() if kind is ErrorKind.GPU_LOST
)
"""Codes of kind ``gpu_lost``: the device fell off the bus or needs a reset."""

LIFECYCLE_CODES: frozenset[int] = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    }
)
"""Codes that concern the library, not one device: the whole session must be re-initialised."""

_NAME_BY_CODE: dict[int, str] = {pynvml.NVML_SUCCESS: "SUCCESS"} | {
    int(getattr(pynvml, n)): n[len("NVML_ERROR_") :]
    for n in dir(pynvml)
    if n.startswith("NVML_ERROR_")
}

UNKNOWN_CODE = pynvml.NVML_ERROR_UNKNOWN
"""NVML_ERROR_UNKNOWN (999): a broken device, or, from every call at once, a library that lost
access to the devices (field case F32)."""

UNICODE_DECODE = "UNICODE_DECODE_ERROR"
"""``QueryError.code_name`` of a string the binding could not decode (F26)."""


def code_name(code: int | None) -> str:
    """Short name of an NVML return code (``NOT_SUPPORTED``), ``CODE_<n>`` if unknown."""
    if code is None:
        return "NONE"
    return _NAME_BY_CODE.get(code, f"CODE_{code}")


class QueryError(Exception):
    """A failed NVML call, classified.

    Attributes:
        function: the NVML function name (``nvmlDeviceGetPowerUsage``).
        kind: what the failure means (:class:`ErrorKind`).
        code: the NVML return code, or None for ``UnicodeDecodeError``.
        code_name: ``NOT_SUPPORTED``, ``FUNCTION_NOT_FOUND``, ``UNICODE_DECODE_ERROR``, ...; the
            ``nvml.return_code`` attribute of ``gpumetrics.nvml.errors``.
        cause: the original exception.

    """

    def __init__(
        self, function: str, kind: ErrorKind, code: int | None, cause: BaseException | None = None
    ) -> None:
        self.function = function
        self.kind = kind
        self.code = code
        decode_error = code is None and kind is ErrorKind.INVALID
        self.code_name = UNICODE_DECODE if decode_error else code_name(code)
        self.cause = cause
        super().__init__(f"{function}: {self.code_name} ({kind.value})")

    @property
    def lifecycle(self) -> bool:
        """Whether the code concerns the library rather than one device or field.

        True for UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH and LIBRARY_NOT_FOUND:
        the session is gone and must be re-initialised.
        """
        return self.code in LIFECYCLE_CODES


def classify(function: str, exc: BaseException) -> QueryError:
    """Map an exception raised by an nvidia-ml-py call to a :class:`QueryError`.

    ``NVMLError`` → its code's kind (unknown codes → ``unknown``); ``NVMLLibraryMismatchError`` →
    ``function_missing`` (code FUNCTION_NOT_FOUND); ``UnicodeDecodeError`` → ``invalid``.

    Raises:
        TypeError: ``exc`` is none of these (a programming error, not an NVML failure).

    """
    if isinstance(exc, pynvml.NVMLError):
        code = int(exc.value)
        return QueryError(function, _KIND_BY_CODE.get(code, ErrorKind.UNKNOWN), code, exc)
    if isinstance(exc, pynvml.NVMLLibraryMismatchError):
        return QueryError(
            function, ErrorKind.FUNCTION_MISSING, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, exc
        )
    if isinstance(exc, UnicodeDecodeError):
        return QueryError(function, ErrorKind.INVALID, None, exc)
    raise TypeError(f"{function}: not an NVML failure: {exc!r}")


NVML_FAILURES = (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError, UnicodeDecodeError)
"""The exceptions an nvidia-ml-py call raises for an NVML failure (:func:`classify` maps them)."""


def query(function: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` (an nvidia-ml-py wrapper) and classify any NVML failure.

    Args:
        function: the NVML function name used in errors, logs and self-telemetry.
        fn: the wrapper, looked up by the caller with ``getattr(pynvml, name)`` so a binding
            without it is a ``function_missing`` decision made once, not an ``ImportError``.
        *args: positional arguments for ``fn``.
        **kwargs: keyword arguments for ``fn``.

    Returns:
        Whatever ``fn`` returns.

    Raises:
        QueryError: for ``NVMLError``, ``NVMLLibraryMismatchError`` and ``UnicodeDecodeError``.
        Other exceptions propagate unchanged.

    """
    try:
        return fn(*args, **kwargs)
    except NVML_FAILURES as exc:
        raise classify(function, exc) from exc


def binding(name: str) -> Callable[..., Any] | None:
    """Return the nvidia-ml-py wrapper ``name``, or None when the binding lacks it (F06)."""
    fn = getattr(pynvml, name, None)
    return fn if callable(fn) else None
