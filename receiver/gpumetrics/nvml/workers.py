"""One worker thread per device, so a slow or hung device never stalls the others (F21).

NVML calls cannot be interrupted from Python: a thread inside a hung driver call stays there.
So each device gets its own long-lived worker thread, and the tick coordinator only *waits* for
results, up to two deadlines measured on ``time.monotonic`` (real time):

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

Jobs start **one after another**: each job gets ``stagger_s`` (10 ms) alone before the next
device's job starts, and a job that finishes sooner (the normal case: a device's tick is a few
hundred microseconds of NVML calls) lets the next start at once. Python threads share one
interpreter lock, and eight device jobs running at once spent more CPU contending for it than
on the work (measured: 14 ms against 6 ms of CPU per 8-GPU cycle). A slow or hung job only
delays the others by ``stagger_s``; after that they run beside it. Staggering stops after a
quarter of the cycle deadline, so the last devices of a short cycle are not starved of time.

An abandoned job keeps running on its worker; its result is discarded when it eventually
returns, and until then the device is reported ``busy`` and gets no new job (no pile-up behind
a hung call). :meth:`WorkerPool.close` stops and joins every worker; it reports whether all of
them stopped, so the collector knows whether ``nvmlShutdown`` is safe (F22); workers that did
not stop are joined again by the next :meth:`WorkerPool.close`.
"""

from __future__ import annotations

import enum
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
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


class _Worker:
    def __init__(self, name: str, done: threading.Condition) -> None:
        self._jobs: queue.SimpleQueue[tuple[int, Job] | None] = queue.SimpleQueue()
        self._done = done
        self.ticket = 0
        self.result: tuple[int, Outcome] | None = None
        self.job: Job | None = None
        self.busy = False
        self.reported: tuple[str, float] | None = None
        """The in-flight call last reported TIMED_OUT (so a hung call is reported once)."""
        self.thread = threading.Thread(
            target=self._loop, name=f"gpumetrics-nvml-{name}", daemon=True
        )
        self.thread.start()

    def submit(self, ticket: int, job: Job) -> None:
        self.busy = True
        self.job = job
        self._jobs.put((ticket, job))

    def stop(self) -> None:
        self._jobs.put(None)

    def _loop(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            ticket, job = item
            try:
                outcome = Outcome(Status.DONE, result=job.run())
            except BaseException as exc:  # noqa: BLE001 - delivered to the coordinator
                outcome = Outcome(Status.FAILED, error=exc)
            with self._done:
                self.result = (ticket, outcome)
                self.busy = False
                self._done.notify_all()


class WorkerPool:
    """Long-lived worker threads keyed by device.

    Args:
        call_timeout_s: per-call deadline (s).
        stagger_s: how long a job runs alone before the next device's job starts (s).

    """

    def __init__(self, call_timeout_s: float, stagger_s: float = 0.01) -> None:
        self._call_timeout = call_timeout_s
        self._stagger = stagger_s
        self._done = threading.Condition()
        self._workers: dict[str, _Worker] = {}
        self._stopping: list[_Worker] = []
        self._ticket = 0

    def run(self, jobs: Mapping[str, Job], deadline_s: float) -> dict[str, Outcome]:
        """Run each job on its key's worker and wait for them within the deadlines.

        Args:
            jobs: one job per device key.
            deadline_s: the cycle deadline (s from now).

        Returns:
            One :class:`Outcome` per key in ``jobs``.

        """
        self._ticket += 1
        ticket = self._ticket
        outcomes: dict[str, Outcome] = {}
        pending: dict[str, _Worker] = {}
        start = time.monotonic()
        end = start + deadline_s
        stagger_until = start + deadline_s * _STAGGER_SHARE  # then start the rest at once
        with self._done:
            for key, job in jobs.items():
                worker = self._workers.get(key)
                if worker is None:
                    worker = self._workers[key] = _Worker(key, self._done)
                if worker.busy:
                    flight = worker.job.in_flight() if worker.job else None
                    outcomes[key] = self._still_busy(worker, flight, time.monotonic())
                    continue
                worker.submit(ticket, job)
                pending[key] = worker
                head_start = min(self._stagger, stagger_until - time.monotonic())
                if head_start > 0:  # let this job run alone for a while (module docstring)
                    self._done.wait_for(partial(_answered, worker, ticket), head_start)
        with self._done:
            while pending:
                now = time.monotonic()
                wake = end
                for key, worker in list(pending.items()):
                    res = worker.result
                    if res is not None and res[0] == ticket:
                        outcomes[key] = res[1]
                        del pending[key]
                        continue
                    flight = jobs[key].in_flight()
                    if flight is not None:
                        overdue = flight[1] + self._call_timeout
                        if now >= overdue:
                            worker.reported = flight
                            outcomes[key] = Outcome(Status.TIMED_OUT, function=flight[0])
                            del pending[key]
                            continue
                        if now >= end:
                            outcomes[key] = Outcome(Status.OVERRUN, function=flight[0])
                            del pending[key]
                            continue
                        wake = min(wake, overdue)
                    elif now >= end:
                        outcomes[key] = Outcome(Status.OVERRUN)
                        del pending[key]
                    else:  # between calls: the next call cannot be overdue before this
                        wake = min(wake, now + self._call_timeout)
                if pending:
                    self._done.wait(max(0.0, min(wake, end) - now) + 0.001)
        return outcomes

    def _still_busy(self, worker: _Worker, flight: tuple[str, float] | None, now: float) -> Outcome:
        """Return the outcome for a device whose worker is still inside an abandoned job."""
        function = flight[0] if flight else None
        if flight is None or now < flight[1] + self._call_timeout:
            return Outcome(Status.OVERRUN, function=function)
        if worker.reported == flight:
            return Outcome(Status.BUSY, function=function)
        worker.reported = flight  # an overrun call that has now passed its per-call deadline
        return Outcome(Status.TIMED_OUT, function=function)

    def forget(self, key: str) -> None:
        """Stop the worker of a device that no longer exists (it exits after its current job)."""
        worker = self._workers.pop(key, None)
        if worker is not None:
            worker.stop()
            self._stopping.append(worker)

    def close(self, timeout_s: float) -> bool:
        """Stop every worker and join them within ``timeout_s`` in total.

        Returns:
            True when every worker thread has exited (no NVML call can still be in flight).

        """
        for w in self._workers.values():
            w.stop()
        workers = [*self._stopping, *self._workers.values()]
        self._workers.clear()
        end = time.monotonic() + timeout_s
        for w in workers:
            w.thread.join(max(0.0, end - time.monotonic()))
        self._stopping = [w for w in workers if w.thread.is_alive()]
        return not self._stopping

    def busy(self) -> list[str]:
        """Return the workers still running a job (e.g. stuck in a hung call).

        Workers of forgotten devices count too, until their job returns.
        """
        with self._done:
            return self._busy()

    def _busy(self) -> list[str]:
        out = [k for k, w in self._workers.items() if w.busy]
        self._stopping = [w for w in self._stopping if w.thread.is_alive()]
        return out + [w.thread.name for w in self._stopping if w.busy]

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no worker runs a job, or ``timeout_s`` passes; True when idle."""
        with self._done:
            return self._done.wait_for(lambda: not self._busy(), timeout=timeout_s)


_STAGGER_SHARE = 0.25
"""Share of the cycle deadline that job starts may be staggered over."""


def _answered(worker: _Worker, ticket: int) -> bool:
    res = worker.result
    return res is not None and res[0] == ticket
