"""Device jobs on worker threads, so a slow or hung device never stalls the others (F21).

NVML calls cannot be interrupted from Python: a thread inside a hung driver call stays there.
So the tick coordinator never runs a device's NVML calls itself: worker threads do, and the
coordinator only *waits* for results, up to two deadlines measured on ``time.monotonic`` (real
time):

- the **per-call deadline** (``call_timeout_s``): a job whose current NVML call has run longer
  is abandoned for this tick;
- the **cycle deadline** (``cycle_timeout_s``, default ``interval_s``): whatever has not finished
  by then is abandoned.

Only the per-call deadline is evidence against a device: a job abandoned at the cycle deadline
while no NVML call of it had run past ``call_timeout_s`` is an **overrun** (``Status.OVERRUN``):
the sidecar itself did not get through the tick in time (a CPU-starved or throttled container,
a slow first cycle), which says nothing about the GPU. Its readings are dropped like any
abandoned job's, but the collector leaves the device's health as it was. A call that passes its
per-call deadline later, while its worker is still busy, is reported ``TIMED_OUT`` then, once.

Jobs run **one after another on one worker**: the tick's jobs are queued in device order and a
worker takes the next as soon as it finished the last, without waking the coordinator in
between (a normal tick is one wake-up to start and one at the end, not two thread hand-overs
per device). Python threads share one interpreter lock: eight device jobs running at once spent
more CPU contending for it than on the work (measured: 14 ms against 6 ms of CPU per 8-GPU
cycle), and one worker thread per device still cost two hand-overs per device per tick. Each
job gets ``stagger_s`` (10 ms) alone: when the running job has not finished by then (a slow or
hung GPU), another worker takes the next job, so a slow or hung job delays the others by
``stagger_s`` only and then they run beside it. Staggering stops after a quarter of the cycle
deadline (the rest start at once), so the last devices of a short cycle are not starved of
time. Workers are not tied to devices; one idle worker is kept between ticks, further ones end.

An abandoned job keeps running on its worker; its result is discarded when it eventually
returns, and until then the device is reported ``busy`` and gets no new job (no pile-up behind
a hung call). :meth:`WorkerPool.close` stops and joins every worker; it reports whether all of
them stopped, so the collector knows whether ``nvmlShutdown`` is safe (F22); workers that did
not stop (inside a hung call) end when it returns and are joined again by the next
:meth:`WorkerPool.close`.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class Status(enum.Enum):
    """What became of one device's job in a tick."""

    DONE = "done"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    """An NVML call of the job ran past the per-call deadline (reported once per call)."""
    BUSY = "busy"
    """The worker is still inside a call already reported TIMED_OUT: no new job."""
    OVERRUN = "overrun"
    """Abandoned at the cycle deadline, no call past its per-call deadline (module docstring)."""


@dataclass
class Outcome:
    """A job's outcome: its result, the exception it raised, or the call it was stuck in.

    Attributes:
        status: see :class:`Status`.
        result: the job's return value (DONE).
        error: the exception the job raised (FAILED).
        function: the NVML call in flight when the job was abandoned (TIMED_OUT / BUSY /
            OVERRUN), if known.

    """

    status: Status
    result: Any = None
    error: BaseException | None = None
    function: str | None = None


@dataclass
class Job:
    """One device's work for a tick.

    Attributes:
        run: the work (runs on the device's worker thread).
        in_flight: returns ``(function, start on time.monotonic)`` of the NVML call running now.

    """

    run: Callable[[], Any]
    in_flight: Callable[[], tuple[str, float] | None]


class _Runner:
    """One worker thread; it runs the current tick's queued jobs one after another."""

    __slots__ = ("thread", "stop")

    def __init__(self, pool: WorkerPool, n: int) -> None:
        self.stop = False
        self.thread = threading.Thread(
            target=pool._serve, args=(self,), name=f"gpumetrics-nvml-worker-{n}", daemon=True
        )


class WorkerPool:
    """Worker threads that run device jobs, and the two deadlines (see the module docstring).

    Args:
        call_timeout_s: per-call deadline (s).
        stagger_s: how long a job runs alone before the next device's job starts (s).

    """

    def __init__(self, call_timeout_s: float, stagger_s: float = 0.01) -> None:
        self._call_timeout = call_timeout_s
        self._stagger = stagger_s
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # runners wait here for jobs
        self._done = threading.Condition(self._lock)  # the coordinator and wait_idle wait here
        self._runners: list[_Runner] = []
        self._idle = 0  # runners waiting for work and not yet called
        self._called = 0  # runners called (woken or started) that have not taken a job yet
        self._started = 0  # runner threads ever started (names)
        self._closing = False
        self._ticket = 0
        self._queue: deque[tuple[str, Job]] = deque()  # this tick's jobs not started yet
        self._open = 0  # this tick's jobs not finished yet (queued or running)
        self._results: dict[str, Outcome] = {}  # this tick's finished jobs
        self._running: dict[str, tuple[Job, int, float]] = {}  # key -> (job, ticket, start)
        self._reported: dict[str, tuple[str, float]] = {}
        """Per device, the in-flight call last reported TIMED_OUT (reported once)."""

    # --- the runners ------------------------------------------------------------------------
    def _serve(self, runner: _Runner) -> None:
        lock = self._lock
        with lock:
            self._called -= 1  # this runner was started to take a job
            item = self._next(runner)
        while item is not None:
            key, job, ticket = item
            try:
                outcome = Outcome(Status.DONE, result=job.run())
            except BaseException as exc:  # noqa: BLE001 - delivered to the coordinator
                outcome = Outcome(Status.FAILED, error=exc)
            with lock:
                del self._running[key]
                if ticket == self._ticket:
                    self._results[key] = outcome
                    self._open -= 1
                if not self._open or not self._running:  # the tick is complete, or all idle
                    self._done.notify_all()
                item = self._next(runner)  # the next queued job at once: no hand-over

    def _next(self, runner: _Runner) -> tuple[str, Job, int] | None:
        """Under the lock: take the next queued job (waiting for one); None when stopping."""
        while True:
            if runner.stop or self._closing:
                self._runners.remove(runner)
                self._done.notify_all()
                return None
            if self._queue:
                key, job = self._queue.popleft()
                self._running[key] = (job, self._ticket, time.monotonic())
                return key, job, self._ticket
            if self._idle and not self._called:  # one idle worker is enough: this one ends
                self._runners.remove(runner)
                return None
            self._idle += 1
            self._work.wait()
            if not self._closing:
                self._called -= 1  # woken by _launch, which counted this runner as called

    def _launch(self, n: int = 1) -> None:
        """Under the lock: have ``n`` more runners take queued jobs (idle ones first)."""
        for _ in range(n):
            self._called += 1
            if self._idle:
                self._idle -= 1
                self._work.notify()
                continue
            self._started += 1
            runner = _Runner(self, self._started)
            self._runners.append(runner)
            runner.thread.start()

    # --- a tick -----------------------------------------------------------------------------
    def run(self, jobs: Mapping[str, Job], deadline_s: float) -> dict[str, Outcome]:
        """Run each job on a worker thread and wait for them within the deadlines.

        Args:
            jobs: one job per device key.
            deadline_s: the cycle deadline (s from now).

        Returns:
            One :class:`Outcome` per key in ``jobs``.

        """
        outcomes: dict[str, Outcome] = {}
        start = time.monotonic()
        end = start + deadline_s
        stagger_until = start + deadline_s * _STAGGER_SHARE  # then start the rest at once
        with self._lock:
            self._ticket += 1
            ticket = self._ticket
            self._results = {}
            self._queue = deque()
            for key, job in jobs.items():
                running = self._running.get(key)
                if running is not None:  # still inside an abandoned job: no new work
                    outcomes[key] = self._still_busy(key, running[0].in_flight(), start)
                else:
                    self._queue.append((key, job))
            self._open = len(self._queue)
            if self._queue:
                self._launch(1 if self._stagger > 0 else len(self._queue))
            while len(outcomes) < len(jobs):
                now = time.monotonic()
                wake = end
                for key, out in self._results.items():
                    outcomes.setdefault(key, out)
                for key, (job, t, began) in self._running.items():
                    if t != ticket or key in outcomes:
                        continue
                    flight = job.in_flight()
                    if flight is not None:
                        overdue = flight[1] + self._call_timeout
                        if now >= overdue:
                            self._reported[key] = flight
                            outcomes[key] = Outcome(Status.TIMED_OUT, function=flight[0])
                            continue
                        wake = min(wake, overdue)
                    else:  # between calls: the next call cannot be overdue before this
                        wake = min(wake, now + self._call_timeout)
                    if self._queue:  # the next device's job starts when this one had its turn
                        wake = min(wake, began + self._stagger)
                if len(outcomes) >= len(jobs):
                    break
                if now >= end:
                    self._give_up(jobs, outcomes, now)
                    break
                if self._queue:
                    self._stagger_more(ticket, outcomes, now, stagger_until)
                    wake = min(wake, stagger_until)
                self._done.wait(max(0.0, wake - now) + 0.001)
        return outcomes

    def _stagger_more(
        self, ticket: int, outcomes: dict[str, Outcome], now: float, stagger_until: float
    ) -> None:
        """Start more runners when every running job of this tick had its time alone."""
        if self._called:
            return  # a runner is on its way to the next job
        if now >= stagger_until:
            self._launch(len(self._queue))  # the rest at once (module docstring)
            return
        running = [
            began
            for key, (_, t, began) in self._running.items()
            if t == ticket and key not in outcomes
        ]
        if not running or all(now >= began + self._stagger for began in running):
            self._launch(1)

    def _give_up(self, jobs: Mapping[str, Job], outcomes: dict[str, Outcome], now: float) -> None:
        """At the cycle deadline: abandon every job without an outcome (unstarted ones too)."""
        self._queue.clear()
        for key, job in jobs.items():
            if key in outcomes:
                continue
            flight = job.in_flight()
            if flight is not None and now >= flight[1] + self._call_timeout:
                self._reported[key] = flight
                outcomes[key] = Outcome(Status.TIMED_OUT, function=flight[0])
            else:
                outcomes[key] = Outcome(Status.OVERRUN, function=flight[0] if flight else None)

    def _still_busy(self, key: str, flight: tuple[str, float] | None, now: float) -> Outcome:
        """Return the outcome for a device whose job from an earlier tick is still running."""
        function = flight[0] if flight else None
        if flight is None or now < flight[1] + self._call_timeout:
            return Outcome(Status.OVERRUN, function=function)
        if self._reported.get(key) == flight:
            return Outcome(Status.BUSY, function=function)
        self._reported[key] = flight  # an overrun call that has now passed its per-call deadline
        return Outcome(Status.TIMED_OUT, function=function)

    # --- lifecycle --------------------------------------------------------------------------
    def forget(self, key: str) -> None:
        """Forget a device that no longer exists.

        Nothing to stop: workers are not tied to devices. A job of ``key`` still running
        counts in :meth:`busy` until it returns.
        """
        with self._lock:
            self._reported.pop(key, None)

    def close(self, timeout_s: float) -> bool:
        """Stop every worker and join them within ``timeout_s`` in total.

        Returns:
            True when every worker thread has exited (no NVML call can still be in flight).
            A worker inside a hung call exits when it returns; ``close`` may be called again.

        """
        with self._lock:
            self._closing = True
            self._queue.clear()
            for runner in self._runners:
                runner.stop = True
            self._idle = self._called = 0
            self._work.notify_all()
            threads = [r.thread for r in self._runners]
        end = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def busy(self) -> list[str]:
        """Return the devices whose job is still running (e.g. stuck in a hung call)."""
        with self._lock:
            return list(self._running)

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no worker runs a job, or ``timeout_s`` passes; True when idle."""
        with self._lock:
            return self._done.wait_for(lambda: not self._running, timeout=timeout_s)


_STAGGER_SHARE = 0.25
"""Share of the cycle deadline that job starts may be staggered over."""
