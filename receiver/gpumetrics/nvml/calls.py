"""Per-device call gate: capability cache, error counting, log-once, in-flight tracking.

Every NVML call a collector makes on a device goes through :meth:`DeviceCalls.query` (or
:meth:`DeviceCalls.get`). The gate applies what the NVML field cases require (F01–F32, each
with the public reports behind it, in ``nvmlsim/README.md``):

- **Capability cache.** A call answering NOT_SUPPORTED, FUNCTION_NOT_FOUND (or
  ``NVMLLibraryMismatchError``) or NO_PERMISSION is disabled for that device and capability key
  (a function, or a function with its enum argument such as ``nvmlDeviceGetClockInfo:2``) until
  the next NVML init; the simulator's call counter stays at 1 (F07, F09).
- **Error counting.** ``gpumetrics.nvml.errors{nvml.function, nvml.return_code}`` rises once per
  failing call. NOT_FOUND (no data right now) is not an error (F19).
- **Log once.** One record per (device, function, kind) state change: INFO for a missing
  capability, DEBUG for a missing symbol that has a fallback and for a lost GPU (the device
  state machine logs the loss once, as its state change), WARNING otherwise; a success after
  a failure logs INFO once (DEBUG after a loss: "is back" says it). Capabilities found
  unsupported are logged when the tick ends (:meth:`DeviceCalls.end_tick`): one INFO each,
  or, for a device whose tick read nothing at all (Jetson, field case F30), one WARNING naming
  every source that answered NOT_SUPPORTED.
- **Fatal kinds abort the device's tick:** ``gpu_lost`` raises :class:`DeviceLost`; a lifecycle
  code (UNINITIALIZED, DRIVER_NOT_LOADED, ...) raises :class:`LibraryDown`.
- **Dropped values** (impossible readings) are counted in
  ``gpumetrics.values.dropped{reason}`` and logged once per (device, function, reason).

The gate also records the call in flight (function and start on ``time.monotonic``), which the
worker pool reads to enforce the per-call deadline (F21).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gpumetrics.nvml.query import NVML_FAILURES, UNKNOWN_CODE, ErrorKind, QueryError, classify
from gpumetrics.selftelemetry import SelfTelemetry

T = TypeVar("T")

NVML_ERRORS = "gpumetrics.nvml.errors"
VALUES_DROPPED = "gpumetrics.values.dropped"

_monotonic = time.monotonic
_DISABLING = frozenset({ErrorKind.UNSUPPORTED, ErrorKind.FUNCTION_MISSING, ErrorKind.NO_PERMISSION})
_TRANSIENT = frozenset({ErrorKind.INVALID, ErrorKind.TIMEOUT, ErrorKind.UNKNOWN})


class DeviceLost(Exception):
    """The device answered GPU_IS_LOST (or a friend); its tick stops here."""

    def __init__(self, error: QueryError) -> None:
        super().__init__(str(error))
        self.error = error


class LibraryDown(Exception):
    """A call answered a library-lifecycle code: every tick stops and NVML is re-initialised."""

    def __init__(self, error: QueryError) -> None:
        super().__init__(str(error))
        self.error = error


class DeviceCalls:
    """The call gate of one device.

    Args:
        label: the device in logs (UUID, or ``index:N``).
        telemetry: where errors and dropped values are counted.
        log: the collector's logger.

    Attributes:
        degraded: set when a call of the current tick failed transiently (reset by
            :meth:`begin_tick`); the device state machine reads it.
        reasons: code names of this tick's transient failures, for the state log.
        answered: calls of the current tick that succeeded.
        unknown: calls of the current tick that answered UNKNOWN (with ``answered`` 0 on every
            device, the collector checks whether NVML as a whole stopped answering).

    """

    def __init__(self, label: str, telemetry: SelfTelemetry, log: logging.Logger) -> None:
        self.label = label
        self._telemetry = telemetry
        self._log = log
        self._disabled: dict[str, ErrorKind] = {}
        self._last: dict[str, str] = {}
        self._in_flight: tuple[str, float] | None = None
        self._unsupported: list[tuple[str, str, int]] = []
        self._notes: list[tuple[str, str]] = []
        self._nothing_logged = False
        self._read_something = False
        self.degraded = False
        self.reasons: list[str] = []
        self.answered = 0
        self.unknown = 0

    # --- capability cache -------------------------------------------------------------
    def enabled(self, cap: str) -> bool:
        """Return True unless capability ``cap`` was disabled by an earlier answer."""
        return cap not in self._disabled

    def note(self, function: str, message: str) -> None:
        """Log a decision about ``function`` (a fallback chosen, a source not reported) once.

        At INFO, by :meth:`end_tick`; at DEBUG on a device that has read nothing yet, whose one
        WARNING already names every source tried (F30).
        """
        self._notes.append((function, message))

    def disable(self, cap: str, kind: ErrorKind) -> None:
        """Disable ``cap`` for this device (e.g. a symbol found missing at init)."""
        self._disabled[cap] = kind

    def disabled(self) -> dict[str, ErrorKind]:
        """Return the disabled capabilities and why (a copy)."""
        return dict(self._disabled)

    def begin_tick(self) -> None:
        """Reset the per-tick failure flags and counts."""
        self.degraded = False
        self.reasons = []
        self.answered = 0
        self.unknown = 0

    def end_tick(self, read_anything: bool) -> None:
        """Log the capabilities found unsupported since the last call (field case F30).

        Args:
            read_anything: the tick produced at least one reading (a point besides
                ``hw.status``).

        Normally each capability gets its line (INFO, or the caller's ``unsupported_level``),
        and so does each :meth:`note`. A device that has read nothing yet and whose calls
        answered NOT_SUPPORTED (an integrated GPU such as Jetson Orin) gets one WARNING instead,
        once per device, naming every source tried; the per-capability lines and notes go to
        DEBUG.

        """
        pending, self._unsupported = self._unsupported, []
        notes, self._notes = self._notes, []
        self._read_something = self._read_something or read_anything
        quiet = not self._read_something  # nothing read yet: the one WARNING says it all
        if pending and quiet and not self._nothing_logged:
            self._nothing_logged = True
            self._log.warning(
                "GPU %s reports no supported telemetry: %s answered NOT_SUPPORTED; only "
                "hw.status and its identity are exported",
                self.label,
                ", ".join(cap for cap, _, _ in pending),
            )
        for cap, code, level in pending:
            self._log_once(
                cap,
                ErrorKind.UNSUPPORTED.value,
                logging.DEBUG if quiet else level,
                "%s: %s: not called again on this GPU",
                cap,
                code,
            )
        for function, message in notes:
            level = logging.DEBUG if quiet else logging.INFO
            self._log_once(function, "note:" + message, level, "%s: %s", function, message)

    # --- in-flight tracking -----------------------------------------------------------
    @property
    def in_flight(self) -> tuple[str, float] | None:
        """``(function, start)`` of the call running now (start on ``time.monotonic``), or None."""
        return self._in_flight

    # --- calls ------------------------------------------------------------------------
    def query(
        self,
        cap: str,
        function: str,
        fn: Callable[..., T],
        *args: Any,
        missing_level: int = logging.WARNING,
        fallback: bool = False,
        retry_codes: frozenset[int] = frozenset(),
        unsupported_level: int = logging.INFO,
        **kwargs: Any,
    ) -> T:
        """Call ``fn(*args, **kwargs)`` through the gate.

        Args:
            cap: capability key (disabled as a whole on a capability answer).
            function: the NVML function name (telemetry ``nvml.function``, logs).
            fn: the nvidia-ml-py wrapper (or a reader built on it).
            *args: arguments for ``fn``.
            missing_level: log level for FUNCTION_NOT_FOUND (DEBUG when a fallback exists).
            fallback: the caller falls back to another call on failure: transient failures
                are logged at INFO and do not degrade the device.
            retry_codes: return codes the caller retries (INSUFFICIENT_SIZE): raised without
                counting or logging; the caller calls :meth:`record` if it gives up.
            unsupported_level: log level for NOT_SUPPORTED (DEBUG when the caller logs one
                line for several capabilities of one call, e.g. each violation policy).
            **kwargs: keyword arguments for ``fn``.

        Returns:
            ``fn``'s result.

        Raises:
            QueryError: any non-fatal failure, after counting and logging (``not_found`` is
                neither counted nor logged); also, without a call, when ``cap`` or
                ``function`` is disabled. Callers that only want a value use :meth:`get`.
            DeviceLost: on ``gpu_lost``.
            LibraryDown: on a lifecycle code.

        """
        disabled = self._disabled
        if disabled:
            why = disabled.get(cap) or disabled.get(function)
            if why is not None:
                raise QueryError(function, why, None)
        # One tuple assignment (atomic): the worker pool reads it from the coordinator thread.
        self._in_flight = (function, _monotonic())
        try:
            result = fn(*args, **kwargs)
        except NVML_FAILURES as exc:
            self._in_flight = None
            err = classify(function, exc)
            if err.code not in retry_codes:
                self._failed(cap, err, missing_level, fallback, unsupported_level)
            raise err from exc
        except BaseException:
            self._in_flight = None
            raise
        self._in_flight = None
        self.answered += 1
        if self._last and cap in self._last:
            was = self._last.pop(cap)
            # after a loss the state machine's "is back" says it; other recoveries get a line
            level = logging.DEBUG if was == ErrorKind.GPU_LOST.value else logging.INFO
            self._log.log(level, "GPU %s: %s answers again", self.label, cap)
        return result

    def get(
        self, cap: str, function: str, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T | None:
        """Like :meth:`query` but return None for a disabled capability or a non-fatal failure."""
        try:
            return self.query(cap, function, fn, *args, **kwargs)
        except QueryError:
            return None

    def record(self, err: QueryError) -> None:
        """Count and log a failure the caller held back (a retried call that never succeeded)."""
        self._failed(err.function, err, logging.WARNING, False)

    def _failed(
        self,
        cap: str,
        err: QueryError,
        missing_level: int,
        fallback: bool,
        unsupported_level: int = logging.INFO,
    ) -> None:
        kind = err.kind
        if kind is ErrorKind.NOT_FOUND and not err.lifecycle:
            return
        self._telemetry.add(
            NVML_ERRORS, 1, {"nvml.function": err.function, "nvml.return_code": err.code_name}
        )
        if err.code == UNKNOWN_CODE:
            self.unknown += 1
        if err.lifecycle:
            raise LibraryDown(err) from err
        if kind in _DISABLING:
            self._disabled[cap] = kind
            if kind is ErrorKind.UNSUPPORTED:
                # logged by end_tick, at unsupported_level (DEBUG under a device-wide WARNING)
                self._unsupported.append((cap, err.code_name, unsupported_level))
                return
            level = missing_level if kind is ErrorKind.FUNCTION_MISSING else logging.WARNING
            self._log_once(
                cap, kind.value, level, "%s: %s: not called again on this GPU", cap, err.code_name
            )
            return
        if kind is ErrorKind.GPU_LOST:
            # the device state machine logs the one WARNING of the loss (its state change)
            self._log_once(cap, kind.value, logging.DEBUG, "%s: %s", cap, err.code_name)
            raise DeviceLost(err) from err
        level = logging.INFO if fallback else logging.WARNING
        self._log_once(cap, kind.value, level, "%s: %s", cap, err.code_name)
        if kind in _TRANSIENT and not fallback:
            self.degraded = True
            self.reasons.append(err.code_name)

    def _log_once(self, key: str, state: str, level: int, fmt: str, *args: Any) -> None:
        """Log at ``level`` when ``key`` enters ``state``, at DEBUG while it stays there."""
        if self._last.get(key) == state:
            level = logging.DEBUG
        self._last[key] = state
        self._log.log(level, "GPU %s: " + fmt, self.label, *args)

    # --- dropped values ---------------------------------------------------------------
    def drop(self, function: str, reason: str, count: int = 1, detail: str = "") -> None:
        """Count ``count`` readings of ``function`` discarded for ``reason``; log once per reason.

        Reasons in use: ``out_of_range`` (a ratio outside 0–100 %, a temperature or clock no
        device reports), ``sentinel`` (NVML's not-available values), ``process_struct_mismatch``
        (F01), ``invalid_pid``, ``memory_above_total``, ``unknown_value_type``,
        ``timestamp_out_of_range``, ``insufficient_size`` (F20 retries exhausted),
        ``invalid_point`` (the model refused a point).
        """
        if count <= 0:
            return
        self._telemetry.add(VALUES_DROPPED, count, {"reason": reason})
        self._log_once(
            f"{function}#{reason}",
            "dropped",
            logging.WARNING,
            "%s: dropped %d value(s) (%s) %s",
            function,
            count,
            reason,
            detail,
        )
