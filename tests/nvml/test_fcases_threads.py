"""Field cases F21 and F22: slow and hung calls, and shutdown with calls in flight.

Synchronisation is by events only: the simulator's ``activity`` condition (calls in flight,
calls hung) and the collector's ``ready`` event. The per-call deadline is real time: every slow
or hung call here blocks until the test moves simulated time or releases it, so the deadline can
be long enough (2 s) that no ordinary call of a loaded machine reaches it (at 0.2 s a loaded CI
run saw nvmlDeviceGetClockInfo counted as a timeout).
"""

from gpumetrics.metrics import names

import nvmlsim as sim

DEADLINE = 2.0


def _wait_for(drv, predicate, timeout=5.0):
    with drv.activity:
        assert drv.activity.wait_for(lambda: predicate(drv), timeout=timeout), (
            "simulator never got there"
        )


def _f21(helpers, keep):
    data = helpers.variant(
        "F21_slow_and_hung_calls", pcie_window_ms=0, **helpers.OLD_PROCESS_UTILIZATION
    )
    raw = data.model_dump(mode="json", exclude_unset=True)
    raw["faults"] = [f for f in raw["faults"] if keep(f)]
    return helpers.scenario(raw)


def _uuid(i):
    return f"GPU-f2100000-0000-4000-8000-00000000000{i}"


def _timeouts(run):
    return {
        p.attrs["nvml.function"]: p.value
        for p in run.self_output().find("gpumetrics.collection.timeouts")
    }


def test_F21_slow_call_is_abandoned_at_the_call_deadline_and_others_continue(nvml_run, helpers):
    scn = _f21(
        helpers, lambda f: f.get("latency_s")
    )  # GetProcessUtilization on GPU 3: 8 s in cycle 5
    run = nvml_run(scn, helpers.settings(call_timeout_s=DEADLINE), latency="block")
    run.cycle(4)
    run.output()
    report = run.collect()  # cycle 5
    assert report.timed_out == [_uuid(3)]
    out = run.output()
    for i in (0, 1, 2):
        assert len(out.find(names.MetricTemperature, hw__id=_uuid(i))) == 1
        assert out.values(names.MetricProcessMemoryUsage, pid=2100 + i) == [1073741824]
    assert [
        p for p in out.points if p.attrs.get("hw.id") == _uuid(3) and p.metric != names.MetricStatus
    ] == []
    assert out.one(names.MetricStatus, hw__id=_uuid(3), hw__state="degraded").value == 1
    assert _timeouts(run) == {"nvmlDeviceGetProcessUtilization": 1}
    # next cycle: GPU 3 is still inside the call, gets no new work, and is not counted twice
    run.drv.next_cycle()
    report = run.collect()
    assert report.timed_out == [_uuid(3)] and _timeouts(run) == {
        "nvmlDeviceGetProcessUtilization": 1
    }
    assert len(run.output().find(names.MetricTemperature)) == 3
    # the call ends (the test moves simulated time past it): GPU 3 is read again
    run.drv.advance(8.0)
    assert run.col.wait_idle(5.0)
    report = run.collect()
    assert report.timed_out == [] and report.states[_uuid(3)] == "ok"
    assert len(run.output().find(names.MetricTemperature, hw__id=_uuid(3))) == 1
    assert run.drv.violations == []


def test_F21_hung_gpu_never_blocks_the_others_or_the_export(nvml_run, helpers):
    scn = _f21(helpers, lambda f: f.get("hang"))  # every call on GPU 2 hangs from cycle 7
    run = nvml_run(scn, helpers.settings(call_timeout_s=DEADLINE))
    run.cycle(6)
    run.output()
    report = run.cycle()  # cycle 7: GPU 2 hangs in its first call
    assert report.timed_out == [_uuid(2)]
    calls_on_2 = sum(n for (_, dev), n in run.drv.calls.items() if dev == 2)
    report = run.cycle(2)  # cycles 8-9
    assert report.timed_out == [_uuid(2)]
    out = run.output()  # the producer answers while GPU 2 hangs
    assert len(out.find(names.MetricTemperature)) == 3 * 3
    assert out.find(names.MetricTemperature, hw__id=_uuid(2)) == []
    assert [
        p.value for p in out.find(names.MetricStatus, hw__id=_uuid(2), hw__state="degraded")
    ] == [1, 1, 1]
    assert sum(_timeouts(run).values()) == 1  # one hung call, counted once
    # no pile-up: nothing more was called on GPU 2 behind the hung call
    assert sum(n for (_, dev), n in run.drv.calls.items() if dev == 2) == calls_on_2
    assert not run.col.stop(DEADLINE)  # a call is in flight: no nvmlShutdown
    assert run.calls("nvmlShutdown") == 0


def test_F21_slow_init_does_not_block_the_exporter(nvml_run, helpers):
    # nvmlInit takes 90 s of simulated time; PCIe's own 20 ms window is off so that only init blocks
    run = nvml_run(
        helpers.variant("F21_slow_init", pcie_window_ms=0), helpers.settings(), latency="block"
    )
    run.col.start()
    _wait_for(run.drv, lambda d: d.in_flight > 0)  # the scheduler is inside nvmlInit
    assert not run.col.ready.is_set() and not run.col.nvml_up()
    out = run.output()  # export and self-telemetry still answer
    up = out.one("gpumetrics.nvml.up")
    assert up.value == 0 and up.attrs == {"reason": "not_started"}
    run.drv.advance(90.0)
    assert run.col.ready.wait(5.0)
    assert run.col.nvml_up()
    assert run.col.stop(5.0)
    assert run.calls("nvmlShutdown") == 1


def test_F22_shutdown_waits_for_in_flight_calls_then_shuts_down_once(nvml_run, helpers):
    run = nvml_run("F22_shutdown_race", helpers.settings(call_timeout_s=DEADLINE), strict=True)
    run.cycle()
    report = run.collect()  # cycle 2: the energy call hangs
    assert report.timed_out
    assert not run.col.stop(DEADLINE)  # joined with a timeout: still in flight, so no shutdown
    assert run.calls("nvmlShutdown") == 0
    run.drv.release_hangs()
    assert run.col.wait_idle(5.0)
    assert run.col.stop(5.0)
    assert run.calls("nvmlShutdown") == 1
    assert run.drv.init_count == 0
    calls = sum(run.drv.calls.values())
    assert not run.collect().up  # a stopped collector makes no call
    assert run.col.stop(1.0)  # idempotent: nvmlShutdown is never called twice
    assert sum(run.drv.calls.values()) == calls
    assert run.calls("nvmlShutdown") == 1
    assert run.drv.violations == []  # strict mode: no shutdown under a call, no call after it


def test_F22_threaded_collector_stops_cleanly(nvml_run, helpers):
    run = nvml_run("h100-sxm", helpers.settings(), strict=True)
    run.col.start()
    assert run.col.ready.wait(5.0)  # set after the first complete cycle
    assert run.col.stop(5.0)
    calls = sum(run.drv.calls.values())
    assert run.calls("nvmlShutdown") == 1 and run.drv.init_count == 0
    assert sum(run.drv.calls.values()) == calls
    assert run.drv.violations == []


def test_scheduler_start_returns_at_once_and_stop_without_start_is_safe(nvml_run, helpers):
    run = nvml_run("F14_library_not_found_first_attempts", helpers.settings())
    assert run.col.stop(1.0)  # never started, never initialised: nothing to shut down
    assert run.calls("nvmlShutdown") == 0
    assert isinstance(sim.installed(), sim.SimDriver)


def test_F12_F22_session_lost_while_a_call_hangs_defers_the_shutdown(nvml_run, helpers):
    scn = _f21(helpers, lambda f: f.get("hang"))  # GPU 2 hangs from cycle 7
    run = nvml_run(
        scn, helpers.settings(call_timeout_s=DEADLINE, init_backoff_max_s=1.0), strict=True
    )
    run.cycle(6)
    assert run.cycle().timed_out == [_uuid(2)]  # cycle 7
    run.drv.trigger("upgrade_driver")
    report = run.cycle()  # cycle 8: the other GPUs answer UNINITIALIZED
    assert not report.up and report.reason == "uninitialized"
    assert run.calls("nvmlShutdown") == 0  # GPU 2's call is still in flight
    assert not run.cycle().up  # cycle 9: still in flight, so no shutdown and no re-init
    assert run.calls("nvmlShutdown") == 0 and run.calls("nvmlInitWithFlags") == 1
    run.drv.release_hangs()
    assert run.col.wait_idle(5.0)
    run.cycle()  # now: one nvmlShutdown, then a re-init that the upgraded driver refuses
    assert run.calls("nvmlShutdown") == 1
    assert run.errors("nvmlInit", "LIB_RM_VERSION_MISMATCH") == 1
    assert [v for v in run.drv.violations if v.kind == "shutdown_during_call"] == []


def test_F21_a_tick_cut_short_by_the_cycle_deadline_leaves_the_gpu_healthy(nvml_run, helpers):
    # GPU 3's 8 s call (cycle 5) is younger than the 60 s per-call deadline when the 1 s cycle
    # deadline passes: the tick is an overrun, not evidence against the GPU. (1 s, not 0.2 s:
    # the other ticks must still finish inside it on a loaded machine.)
    scn = _f21(helpers, lambda f: f.get("latency_s"))
    run = nvml_run(scn, helpers.settings(call_timeout_s=60.0, cycle_timeout_s=1.0), latency="block")
    run.cycle(4)
    run.output()
    report = run.collect()  # cycle 5
    assert report.overrun == [_uuid(3)] and report.timed_out == []
    assert report.states[_uuid(3)] == "ok"
    out = run.output()
    assert [
        p for p in out.points if p.attrs.get("hw.id") == _uuid(3) and p.metric != names.MetricStatus
    ] == []  # its readings for the tick are dropped, never re-served
    assert out.one(names.MetricStatus, hw__id=_uuid(3), hw__state="ok").value == 1
    assert _timeouts(run) == {}
    assert run.self_output().one("gpumetrics.collection.overruns").value == 1
    run.drv.next_cycle()
    report = run.collect()  # still inside the call: no new work, another overrun
    assert report.overrun == [_uuid(3)] and report.states[_uuid(3)] == "ok"
    run.drv.advance(8.0)
    assert run.col.wait_idle(5.0)
    report = run.collect()
    assert report.overrun == [] and report.timed_out == []
    assert len(run.output().find(names.MetricTemperature, hw__id=_uuid(3))) == 1
    assert run.self_output().one("gpumetrics.collection.overruns").value == 2
