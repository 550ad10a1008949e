"""WorkerPool: device jobs start one after another, and a hung job does not hold the others."""

from __future__ import annotations

import threading
import time

from gpumetrics.nvml.workers import Job, Outcome, Status, WorkerPool


class Overlap:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0

    def job(self, value: int) -> Job:
        def run() -> int:
            with self.lock:
                self.running += 1
                self.peak = max(self.peak, self.running)
            total = sum(range(1_000_000))  # CPU work longer than the 5 ms GIL switch interval
            with self.lock:
                self.running -= 1
            return value + total * 0

        return Job(run, lambda: None)


def test_fast_jobs_run_one_at_a_time_in_submission_order():
    pool = WorkerPool(call_timeout_s=5.0, stagger_s=5.0)
    overlap = Overlap()
    try:
        outcomes = pool.run({f"gpu{i}": overlap.job(i) for i in range(8)}, deadline_s=60.0)
    finally:
        assert pool.close(5.0)
    assert [o.status for o in outcomes.values()] == [Status.DONE] * 8
    assert [outcomes[f"gpu{i}"].result for i in range(8)] == list(range(8))
    assert overlap.peak == 1  # never two device jobs at once: no interpreter-lock contention


def test_a_hung_job_delays_the_others_by_the_stagger_only():
    release = threading.Event()
    pool = WorkerPool(call_timeout_s=60.0, stagger_s=0.01)
    done = Overlap()
    jobs = {"hung": Job(lambda: release.wait(30), lambda: ("nvmlDeviceGetPowerUsage", 0.0))}
    jobs.update({f"gpu{i}": done.job(i) for i in range(4)})
    try:
        outcomes = pool.run(jobs, deadline_s=2.0)
    finally:
        release.set()
        assert pool.close(5.0)
    assert outcomes["hung"].status is Status.TIMED_OUT
    assert all(outcomes[f"gpu{i}"].status is Status.DONE for i in range(4))


def test_cycle_deadline_without_an_overdue_call_is_an_overrun_not_a_timeout():
    # Both jobs block until released, so neither can finish inside the 50 ms cycle deadline:
    # one is between NVML calls (in_flight None), one inside a call younger than the 60 s
    # per-call deadline. Neither is evidence against its GPU.
    release = threading.Event()
    pool = WorkerPool(call_timeout_s=60.0, stagger_s=0.0)
    started = time.monotonic()
    jobs = {
        "between": Job(lambda: release.wait(30), lambda: None),
        "in_call": Job(lambda: release.wait(30), lambda: ("nvmlDeviceGetPowerUsage", started)),
    }
    try:
        outcomes = pool.run(jobs, deadline_s=0.05)
        assert outcomes["between"] == Outcome(Status.OVERRUN)
        assert outcomes["in_call"] == Outcome(Status.OVERRUN, function="nvmlDeviceGetPowerUsage")
        # still inside the same jobs next cycle: overruns again, no new job submitted
        again = pool.run(jobs, deadline_s=0.05)
        assert [o.status for o in again.values()] == [Status.OVERRUN, Status.OVERRUN]
    finally:
        release.set()
        assert pool.close(5.0)


def test_an_overrun_call_that_passes_its_deadline_later_is_timed_out_once():
    release = threading.Event()
    pool = WorkerPool(call_timeout_s=60.0, stagger_s=0.0)
    flight = ["nvmlDeviceGetPowerUsage", time.monotonic()]  # the call began just now
    jobs = {"gpu0": Job(lambda: release.wait(30), lambda: (flight[0], flight[1]))}
    try:
        assert pool.run(jobs, deadline_s=0.05)["gpu0"].status is Status.OVERRUN
        flight[1] -= 120.0  # the same call, now seen 120 s older: past the per-call deadline
        first = pool.run(jobs, deadline_s=0.05)["gpu0"]
        assert first == Outcome(Status.TIMED_OUT, function="nvmlDeviceGetPowerUsage")
        second = pool.run(jobs, deadline_s=0.05)["gpu0"]  # reported once; then it is busy
        assert second == Outcome(Status.BUSY, function="nvmlDeviceGetPowerUsage")
    finally:
        release.set()
        assert pool.close(5.0)
