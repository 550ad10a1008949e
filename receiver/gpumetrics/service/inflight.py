"""``InflightBudget``: the bytes of Pull answers that may be in flight at once, server-wide.

A Pull answer lives in memory from the moment it is built until gRPC has sent it (or the call
failed): once as the serialized ``PullResponse`` the servicer hands over, once more in gRPC's
own send buffer. Without a bound, eight concurrent large Pulls on a big backlog multiply the
store's memory (issue: 65 MB held, 1.29 GB peak RSS). Every answer therefore reserves its
largest possible size before it is built, gives back what it did not use at once, and the rest
when its call ends (``grpc.ServicerContext.add_callback``). The sum of reservations never
exceeds the budget, so the memory of answers in flight stays below about twice the budget.
"""

from __future__ import annotations

import threading

__all__ = ["InflightBudget"]


class InflightBudget:
    """A counting budget of bytes (By), shared by the Pull calls of one server.

    Args:
        limit: bytes that may be reserved at once (> 0).

    Raises:
        ValueError: ``limit`` is not positive.

    """

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"pull_inflight_bytes: must be > 0, got {limit}")
        self.limit = limit
        self._lock = threading.Condition()
        self._used = 0
        self._peak = 0

    def reserve(self, want: int, at_least: int) -> int:
        """Reserve up to ``want`` bytes, and at least ``at_least``; return what was reserved.

        Returns:
            ``min(want, free)`` when that is at least ``at_least`` (and ``want``), else 0
            (nothing reserved: the caller answers "retry later").

        """
        with self._lock:
            free = self.limit - self._used
            grant = min(want, free)
            if grant < min(at_least, want) or grant <= 0:
                return 0
            self._used += grant
            self._peak = max(self._peak, self._used)
            return grant

    def release(self, n: int) -> None:
        """Give back ``n`` reserved bytes."""
        if n <= 0:
            return
        with self._lock:
            self._used = max(0, self._used - n)
            self._lock.notify_all()

    def wait_used_at_most(self, n: int, timeout: float) -> bool:
        """Wait until at most ``n`` bytes are reserved; False if ``timeout`` s passed first."""
        with self._lock:
            return self._lock.wait_for(lambda: self._used <= n, timeout)

    @property
    def used(self) -> int:
        """Bytes reserved now."""
        with self._lock:
            return self._used

    @property
    def peak(self) -> int:
        """Most bytes ever reserved at once (the high-water mark)."""
        with self._lock:
            return self._peak
