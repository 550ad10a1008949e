"""Simulation clocks: a manual clock that tests step, and the wall clock for demos.

The simulated driver reads time only through a :class:`Clock`. Time is kept as integer
microseconds since the Unix epoch (the unit NVML uses for sample timestamps), so stepping a
manual clock never accumulates floating-point error.

A *cycle* is not a property of the clock: the driver derives it from elapsed time and the
scenario's ``clock.cycle_seconds`` (cycle 1 starts at install time), see
:meth:`nvmlsim.driver.SimDriver.cycle`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "WallClock", "DEFAULT_START_UNIX"]

#: Default start of a manual clock: 2026-01-01T00:00:00Z, in seconds since the Unix epoch.
DEFAULT_START_UNIX = 1_767_225_600.0


@runtime_checkable
class Clock(Protocol):
    """What the driver needs from a clock.

    ``now_us()`` returns the current time in integer microseconds since the Unix epoch.
    ``sleep(seconds)`` lets injected latency pass (a manual clock advances itself instead of
    blocking). ``manual`` says whether tests step it explicitly.

    A clock may also define ``boot_time_us() -> int``: when the host booted, in µs since the
    epoch. The driver then uses it as the origin of its boot clock (``driver.sample_clock:
    boot``) instead of ``clock.uptime_s`` before install, as :class:`WallClock` does.
    """

    manual: bool

    def now_us(self) -> int:
        """Return the current time, integer µs since the Unix epoch."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of injected latency pass (block on a wall clock)."""
        ...


class ManualClock:
    """A clock that only moves when told to; what tests use (no test may sleep).

    Args:
        start_unix: initial time in seconds since the Unix epoch (default 2026-01-01Z).

    ``advance(seconds)`` moves time forward (never backwards) and wakes threads blocked in
    :meth:`wait_until`, then calls the functions given to :meth:`subscribe` (the driver wakes
    its waiting event calls so). It is thread-safe.

    """

    manual = True

    def __init__(self, start_unix: float = DEFAULT_START_UNIX) -> None:
        if start_unix < 0:
            raise ValueError(f"start_unix: must be >= 0, got {start_unix!r}")
        self._now_us = round(start_unix * 1_000_000)
        self._cond = threading.Condition()
        self._observers: list[Callable[[], None]] = []

    def subscribe(self, observer: Callable[[], None]) -> None:
        """Call ``observer()`` after every move of the clock (from the thread that moved it)."""
        with self._cond:
            self._observers.append(observer)

    def unsubscribe(self, observer: Callable[[], None]) -> None:
        """Stop calling ``observer`` (no error if it was not subscribed)."""
        with self._cond:
            if observer in self._observers:
                self._observers.remove(observer)

    def _moved(self) -> None:
        with self._cond:
            observers = list(self._observers)
        for observer in observers:
            observer()

    def now_us(self) -> int:
        """Return the current manual time, integer µs since the Unix epoch."""
        return self._now_us

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (>= 0); raises ValueError if negative."""
        if seconds < 0:
            raise ValueError(f"seconds: must be >= 0, got {seconds!r}")
        with self._cond:
            self._now_us += round(seconds * 1_000_000)
            self._cond.notify_all()
        self._moved()

    def advance_to_us(self, target_us: int) -> None:
        """Move the clock to ``target_us`` (µs since epoch) if that is in the future."""
        with self._cond:
            if target_us <= self._now_us:
                return
            self._now_us = target_us
            self._cond.notify_all()
        self._moved()

    def sleep(self, seconds: float) -> None:
        """Injected latency on a manual clock: advance virtual time, never block."""
        if seconds > 0:
            self.advance(seconds)

    def wait_until(self, target_us: int, timeout_s: float) -> bool:
        """Block until the clock reaches ``target_us`` or ``timeout_s`` of real time passes.

        Returns True if the target was reached. Used by the ``block`` latency policy, where
        a slow call returns only after the test has advanced the clock past its end.
        """
        with self._cond:
            return self._cond.wait_for(lambda: self._now_us >= target_us, timeout=timeout_s)


class WallClock:
    """The real clock (``time.time``): values move with real time, for demos and launchers."""

    manual = False

    def now_us(self) -> int:
        """Return the real time, integer µs since the Unix epoch."""
        return time.time_ns() // 1000

    def boot_time_us(self) -> int:
        """When this host booted, µs since the epoch: wall clock minus ``CLOCK_BOOTTIME``.

        A real driver that counts sample timestamps from boot counts from the host's boot, so
        the simulated one must too under the wall clock (field case F31); ``CLOCK_MONOTONIC``
        stands in where ``CLOCK_BOOTTIME`` does not exist (not Linux).
        """
        clock = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
        return (time.time_ns() - time.clock_gettime_ns(clock)) // 1000

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds`` (injected latency)."""
        if seconds > 0:
            time.sleep(seconds)
