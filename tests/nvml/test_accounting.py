"""NVML accounting statistics: process run time and max memory, each ended process once."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from gpumetrics.metrics import names

TIME = names.MetricProcessTime
MAX = names.MetricProcessMemoryMax
UUID = "GPU-00000000-0000-4000-8000-00000000000a"
EVERY_TICK = {"accounting_interval_s": 1.0}


@pytest.fixture
def acct_run(nvml_run, helpers):
    """``nvml_run`` with the accounting records read every tick (not every 10 s)."""
    return lambda scn, **settings: nvml_run(scn, helpers.settings(**(EVERY_TICK | settings)))


def _scenario(processes: list[dict[str, Any]], mode: str = "enabled", **device: Any) -> dict:
    return {
        "clock": {"cycle_seconds": 1.0, "start_unix": 1767225600},
        "devices": [
            {
                "uuid": UUID,
                "accounting": {"mode": mode, "buffer_size": 64},
                "processes": processes,
                **device,
            }
        ],
    }


def test_a_short_lived_process_shows_up_with_its_gpu_time(acct_run):
    # starts and ends between the collections at 1 s and 2 s: no process list ever shows it
    run = acct_run(
        _scenario([{"pid": 700, "from_s": 1.25, "until_s": 1.75, "used_memory_bytes": 4096}])
    )
    run.cycle(4)
    out = run.output()
    assert out.values(names.MetricProcessMemoryUsage, pid=700) == []
    (point,) = out.find(TIME, pid=700)
    assert point.value == 0.5
    assert point.start == 1767225601_250_000_000  # the record's startTime
    assert point.time == 1767225602_000_000_000  # the first collection after it ended
    assert out.values(MAX, pid=700) == [4096]
    assert point.attrs["hw.id"] == UUID


def test_a_running_process_is_reported_once_when_it_ends(acct_run):
    run = acct_run(_scenario([{"pid": 701, "until_s": 2.5, "used_memory_bytes": 10}]))
    run.cycle(2)
    assert run.output().find(TIME) == []  # the driver reports time 0 until it ends
    before = run.calls("nvmlDeviceGetAccountingStats")
    run.cycle(1)  # at 2 s it still runs: nothing asked
    assert run.calls("nvmlDeviceGetAccountingStats") == before
    run.cycle(4)
    out = run.output()
    assert len(out.find(TIME, pid=701)) == 1
    assert out.values(MAX, pid=701) == [10]


def test_pid_reuse_reports_each_process_once(acct_run):
    run = acct_run(
        _scenario(
            [
                {"pid": 702, "from_s": 0.2, "until_s": 0.6, "used_memory_bytes": 1},
                {"pid": 702, "from_s": 1.5, "until_s": 3.5, "used_memory_bytes": 2},
            ]
        )
    )
    run.cycle(6)
    out = run.output()
    assert [p.value for p in out.find(MAX, pid=702)] == [1, 2]
    assert len(out.find(TIME, pid=702)) == 2


def test_pid_reuse_run_times_and_starts(acct_run):
    run = acct_run(
        _scenario(
            [
                {"pid": 703, "from_s": 0.2, "until_s": 0.6},
                {"pid": 703, "from_s": 1.5, "until_s": 3.5},
            ]
        )
    )
    run.cycle(6)
    pts = run.output().find(TIME, pid=703)
    assert [p.value for p in pts] == [0.4, 2.0]
    assert pts[0].start != pts[1].start


def test_records_that_ended_before_the_first_read_are_not_reported(acct_run):
    # ended before install (a previous sidecar, or nobody, watched it); the other ends later
    run = acct_run(
        _scenario(
            [
                {"pid": 704, "start_time_unix": 1767225000, "until_cycle": 1},
                {"pid": 705, "until_s": 1.5},
            ]
        )
    )
    run.drv.advance(0.5)  # the first read comes after 704 ended
    run.cycle(3)
    out = run.output()
    assert out.find(TIME, pid=704) == []
    assert len(out.find(TIME, pid=705)) == 1


def test_disabled_accounting_logs_once_and_emits_nothing(acct_run, caplog):
    run = acct_run(_scenario([{"pid": 706, "until_s": 1.5}], mode="disabled"))
    with caplog.at_level(logging.INFO, logger="gpumetrics.nvml"):
        run.cycle(5)
    out = run.output()
    assert out.find(TIME) == [] and out.find(MAX) == []
    lines = [r for r in caplog.records if "accounting mode is disabled" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert run.calls("nvmlDeviceGetAccountingMode") == 1  # read again only after 60 s
    assert run.calls("nvmlDeviceGetAccountingPids") == 0
    assert run.calls("nvmlDeviceSetAccountingMode") == 0


def test_unsupported_accounting_logs_once_and_emits_nothing(acct_run, caplog):
    run = acct_run(_scenario([{"pid": 707, "until_s": 1.5}], mode="unsupported"))
    with caplog.at_level(logging.INFO, logger="gpumetrics.nvml"):
        run.cycle(4)
    assert run.output().find(TIME) == []
    lines = [r for r in caplog.records if "nvmlDeviceGetAccountingMode" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert run.calls("nvmlDeviceGetAccountingMode") == 1
    assert run.failures() == 0


def test_a_process_that_keeps_running_costs_one_pid_read_per_tick(acct_run):
    procs = [{"pid": 800 + k} for k in range(16)]
    run = acct_run(_scenario(procs))
    run.cycle(2)
    stats = run.calls("nvmlDeviceGetAccountingStats")
    assert stats == 16  # each asked once, when new
    run.cycle(5)
    assert run.calls("nvmlDeviceGetAccountingStats") == stats
    assert run.calls("nvmlDeviceGetAccountingPids") == 7
    assert run.calls("nvmlDeviceGetAccountingBufferSize") == 1


def test_records_are_read_every_accounting_interval(nvml_run):
    # the default 10 s cadence: a process that ended at 1.5 s is reported at the 10 s read
    run = nvml_run(_scenario([{"pid": 708, "until_s": 1.5, "used_memory_bytes": 3}]))
    run.cycle(10)
    assert run.output().find(TIME) == []
    assert run.calls("nvmlDeviceGetAccountingPids") == 1
    run.cycle(1)
    assert run.calls("nvmlDeviceGetAccountingPids") == 2
    assert run.output().values(MAX, pid=708) == [3]


def test_an_accounting_interval_of_zero_turns_the_source_off(acct_run):
    run = acct_run(_scenario([{"pid": 709, "until_s": 1.5}]), accounting_interval_s=0)
    run.cycle(3)
    assert run.output().find(TIME) == []
    assert run.calls("nvmlDeviceGetAccountingMode") == 0


def test_a_shorter_accounting_interval_than_the_tick_is_refused(helpers):
    with pytest.raises(ValueError, match="accounting_interval_s"):
        helpers.settings(interval_s=2.0, accounting_interval_s=1.0)
