"""Per-device health state machine and back-off.

States are the semantic conventions' ``hw.state`` values (``metric.hw.gpu.status``):

- ``ok``: the last tick read the device without transient failures.
- ``degraded``: the device answers, but the last tick saw a transient failure (UNKNOWN,
  TIMEOUT, INVALID_ARGUMENT, NO_PERMISSION, a garbage reading dropped as a struct mismatch, a
  call abandoned at its deadline). Capability answers (NOT_SUPPORTED, missing symbols) and
  NOT_FOUND are not failures.
- ``failed``: GPU_IS_LOST and friends (RESET_REQUIRED, IRQ_ISSUE, INSUFFICIENT_POWER,
  GPU_NOT_FOUND), or no handle could be obtained for the device's index (F10). A failed device
  gets no calls except one probe per back-off interval (doubling from
  ``device_backoff_initial_s`` to ``device_backoff_max_s``, F11); a successful probe returns it
  to ``ok`` under the same UUID, possibly at a new index.
- ``predicted_failure`` is part of the enum but never entered (NVML gives no prediction).

``hw.status`` is emitted for every state each tick (1 for the current, 0 for the others, so no
stale 1 lingers; semantic conventions, ``hw.status``: "all possible states" are reported,
https://opentelemetry.io/docs/specs/semconv/hardware/common/).
"""

from __future__ import annotations

import enum
import logging

from gpumetrics.metrics import names


class HealthState(enum.StrEnum):
    """The ``hw.state`` values a device can be in."""

    OK = "ok"
    DEGRADED = "degraded"
    FAILED = "failed"
    PREDICTED_FAILURE = "predicted_failure"


assert tuple(s.value for s in HealthState) == names.HwStates
STATES: tuple[HealthState, ...] = tuple(HealthState)
"""Every state, in order (iterating the enum class itself is slow: a few hundred times a cycle)."""


class Backoff:
    """Exponential back-off on a monotonic ns clock.

    Args:
        initial_s: the first delay after a failure (s).
        max_s: the longest delay (s); each consecutive failure doubles the delay up to it.

    ``due(now)`` is True when nothing failed yet or the delay since the last failure passed.

    """

    def __init__(self, initial_s: float, max_s: float) -> None:
        if initial_s <= 0 or max_s < initial_s:
            raise ValueError(f"backoff: need 0 < initial_s <= max_s, got {initial_s}, {max_s}")
        self._initial_ns = round(initial_s * 1e9)
        self._max_ns = round(max_s * 1e9)
        self._delay_ns = 0
        self._next_ns: int | None = None

    @property
    def next_ns(self) -> int | None:
        """When the next attempt is due (monotonic ns), or None when nothing failed."""
        return self._next_ns

    def due(self, now_ns: int) -> bool:
        """Return True when an attempt may be made at ``now_ns``."""
        return self._next_ns is None or now_ns >= self._next_ns

    def failed(self, now_ns: int) -> int:
        """Record a failed attempt at ``now_ns``; return the delay (ns) until the next one."""
        self._delay_ns = (
            self._initial_ns if self._delay_ns == 0 else min(self._delay_ns * 2, self._max_ns)
        )
        self._next_ns = now_ns + self._delay_ns
        return self._delay_ns

    def reset(self) -> None:
        """Forget past failures (after a success)."""
        self._delay_ns = 0
        self._next_ns = None


class DeviceHealth:
    """The state machine of one device (physical GPU, MIG instance, or an index without handle).

    Args:
        label: how logs name the device (its UUID, or ``index:N``).
        backoff: probe back-off while failed.
        log: state changes are logged here (WARNING into failed/degraded, INFO back to ok).

    """

    def __init__(self, label: str, backoff: Backoff, log: logging.Logger) -> None:
        self.label = label
        self.state = HealthState.OK
        self.reason = ""
        self._backoff = backoff
        self._log = log

    def _move(self, state: HealthState, reason: str) -> None:
        if state is self.state:
            self.reason = reason or self.reason
            return
        level = logging.INFO if state is HealthState.OK else logging.WARNING
        self._log.log(level, "GPU %s: %s -> %s %s", self.label, self.state, state, reason)
        self.state, self.reason = state, reason

    def tick_done(self, degraded: bool, reason: str = "") -> None:
        """Record a tick that read the device: ``degraded`` after a transient failure, else ok."""
        self._backoff.reset()
        self._move(HealthState.DEGRADED if degraded else HealthState.OK, reason)

    def fail(self, now_ns: int, reason: str) -> None:
        """Mark the device lost (or without handle); schedule the next probe on back-off."""
        self._backoff.failed(now_ns)
        self._move(HealthState.FAILED, reason)

    @property
    def failed(self) -> bool:
        """True while the device is in ``failed``."""
        return self.state is HealthState.FAILED

    def probe_due(self, now_ns: int) -> bool:
        """Return True when a failed device may be probed at ``now_ns`` (always when not failed)."""
        return not self.failed or self._backoff.due(now_ns)

    def status_values(self) -> list[tuple[str, int]]:
        """``(hw.state, value)`` for every state: 1 for the current one, 0 for the others."""
        return [(s.value, int(s is self.state)) for s in STATES]
