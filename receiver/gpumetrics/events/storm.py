"""The storm limit: how many identical events are logged, and how the rest are reported.

A driver can deliver the same event thousands of times a second (a flapping NVLink, a row of
bad memory raising single-bit errors, a looping application hitting Xid 13). Every event is
counted in ``nvidia.gpu.events``; the log records are limited by this policy:

* events are *identical* when they have the same device, event type and ``eventData`` (for an
  Xid, the same code on the same GPU or MIG instance);
* a fixed window opens at the first of them: its first ``burst`` events are logged, the rest of
  the window's are *suppressed*: counted (``gpumetrics.events.suppressed{reason=storm}``) but
  not logged;
* when the window closes (``window_s`` after it opened; checked at every batch and at
  shutdown), a window that suppressed anything yields one ``nvidia.gpu.events.suppressed``
  record saying how many events of that kind were left out, with the first and last of them;
* the next identical event after the window opens a new one.

At most ``max_keys`` windows are open at once (memory stays bounded whatever the driver
sends): an event that would open one more is suppressed with ``reason=too_many_keys`` and no
summary (it is still counted in ``nvidia.gpu.events``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Admission", "StormLimiter", "Window"]

E = TypeVar("E")


@dataclass
class Window(Generic[E]):
    """One open window of identical events.

    Attributes:
        first: the event that opened it (the summary record describes it).
        start_ns: when it opened (the first event's observed time), Unix-epoch ns.
        logged: events of the window that were logged.
        suppressed: events of the window held back.
        first_suppressed_ns, last_suppressed_ns: observed times of the first and last held back.

    """

    first: E
    start_ns: int
    logged: int = 0
    suppressed: int = 0
    first_suppressed_ns: int = 0
    last_suppressed_ns: int = 0


class Admission:
    """Outcomes of :meth:`StormLimiter.admit`."""

    LOG = "log"
    STORM = "storm"
    TOO_MANY_KEYS = "too_many_keys"


class StormLimiter(Generic[E]):
    """Per-key fixed windows (see the module docstring). Not thread-safe: the caller locks.

    Args:
        burst: events logged per key and window (>= 1).
        window_s: window length (s, > 0).
        max_keys: windows open at once (>= 1).

    Raises:
        ValueError: naming the argument that is out of range.

    """

    def __init__(self, burst: int, window_s: float, max_keys: int = 4096) -> None:
        if burst < 1:
            raise ValueError(f"burst: must be >= 1, got {burst}")
        if not window_s > 0:
            raise ValueError(f"window_s: must be > 0, got {window_s}")
        if max_keys < 1:
            raise ValueError(f"max_keys: must be >= 1, got {max_keys}")
        self.burst = burst
        self.window_ns = round(window_s * 1e9)
        self._max_keys = max_keys
        self._open: dict[Hashable, Window[E]] = {}

    def admit(self, key: Hashable, event: E, now_ns: int) -> tuple[str, Window[E] | None]:
        """Decide whether ``event`` (identity ``key``, observed at ``now_ns``) is logged.

        Returns:
            ``(Admission.LOG, None)``, ``(Admission.STORM, None)``, or
            ``(Admission.TOO_MANY_KEYS, None)``; or, when ``key``'s previous window had ended
            with suppressed events, ``(Admission.LOG, closed_window)``: the caller emits its
            summary before this event's record.

        """
        closed = None
        w = self._open.get(key)
        if w is not None and now_ns - w.start_ns >= self.window_ns:
            del self._open[key]
            closed = w if w.suppressed else None
            w = None
        if w is None:
            if len(self._open) >= self._max_keys:
                return Admission.TOO_MANY_KEYS, closed
            self._open[key] = Window(event, now_ns, logged=1)
            return Admission.LOG, closed
        if w.logged < self.burst:
            w.logged += 1
            return Admission.LOG, None
        if not w.suppressed:
            w.first_suppressed_ns = now_ns
        w.suppressed += 1
        w.last_suppressed_ns = now_ns
        return Admission.STORM, None

    def close_expired(self, now_ns: int, everything: bool = False) -> list[Window[E]]:
        """Close the windows that ended by ``now_ns`` (all of them with ``everything``).

        Returns:
            The closed windows that suppressed events (each needs a summary), oldest first.

        """
        done = [
            k for k, w in self._open.items() if everything or now_ns - w.start_ns >= self.window_ns
        ]
        out = []
        for k in done:
            w = self._open.pop(k)
            if w.suppressed:
                out.append(w)
        out.sort(key=lambda w: w.start_ns)
        return out

    def open_windows(self) -> int:
        """How many windows are open (for tests and self-telemetry)."""
        return len(self._open)
