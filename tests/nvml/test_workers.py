"""WorkerPool: device jobs start one after another, and a hung job does not hold the others."""

from __future__ import annotations

import threading

from gpumetrics.nvml.workers import Job, Status, WorkerPool


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
