"""Field cases F15, F16, F19, F20, F23, F24: pids, empty buffers, growing lists, counters."""

import logging

from gpumetrics.metrics import names

PROC_MEM = names.MetricProcessMemoryUsage
PROC_UTIL = names.MetricProcessUtilization


def test_F15_host_pids_are_reported_without_names(nvml_run, caplog):
    run = nvml_run("F15_container_pid_namespace")
    with caplog.at_level(logging.WARNING, logger="gpumetrics.nvml"):
        run.cycle(2)
    out = run.output()
    assert out.values(PROC_MEM, pid=3412001) == [4294967296] * 2
    assert out.values(PROC_MEM, pid=3412002) == [2147483648] * 2
    # the resource carries the host pid only (no resourcer here); no name is invented
    assert {tuple(p.resource) for p in out.find(PROC_MEM)} == {("process.pid",)}
    assert not any("name" in k for p in out.find(PROC_MEM) for k in p.attrs)
    # NVML's name lookup is never used (it resolves through the caller's /proc: F15's trap)
    assert run.calls("nvmlSystemGetProcessName") == 0
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_F15_a_colliding_local_pid_never_names_the_host_process(nvml_run):
    run = nvml_run("F15_container_pid_collision")
    run.cycle()
    out = run.output()
    assert out.values(PROC_MEM, pid=3412002) == [2147483648]
    assert all(
        "bash" not in str(v) for p in out.points for v in (*p.attrs.values(), *p.resource.values())
    )
    assert run.calls("nvmlSystemGetProcessName") == 0


def test_F16_exited_process_gets_no_point_and_a_reused_pid_a_new_series(nvml_run):
    run = nvml_run("F16_pid_reuse")
    run.cycle()
    c1 = run.output()
    assert c1.values(PROC_MEM, pid=4242) == [8589934592]
    start1 = c1.one(PROC_MEM, pid=4242).start
    run.cycle()
    c2 = run.output()
    assert c2.pids() == set()  # cycle 2: no per-process points at all
    run.cycle()
    c3 = run.output()
    p = c3.one(PROC_MEM, pid=4242)
    assert p.value == 1073741824
    assert p.start > start1  # a new series, not the python one continued
    assert c3.find(PROC_UTIL, pid=4242) == []  # python's samples are not carried over
    run.cycle()  # the driver has a first ffmpeg sample one period after it started
    c4 = run.output()
    assert c4.values(PROC_UTIL, pid=4242, hw__gpu__task="encoder") == [0.4]
    assert c4.values(PROC_UTIL, pid=4242, hw__gpu__task="general") == [0.05]
    assert c4.one(PROC_MEM, pid=4242).start == p.start


F19 = "GPU-f1900000-0000-4000-8000-000000000001"


def test_F19_empty_sample_buffers_fall_back_to_the_snapshot_silently(nvml_run, caplog):
    run = nvml_run("F19_idle_empty_sample_buffers")
    with caplog.at_level(logging.WARNING, logger="gpumetrics.nvml"):
        run.cycle(3)
    out = run.output()
    assert out.values(names.MetricGPUUtilization, hw__gpu__task="general") == [0.0] * 3
    assert out.values(names.MetricGPUMemoryCopyUtilization) == [0.0] * 3
    assert out.find(PROC_UTIL) == [] and out.pids() == set()
    assert run.calls("nvmlDeviceGetUtilizationRates", 0) == 3  # one snapshot feeds both metrics
    assert run.failures() == 0
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    dev = run.col.devices()[0]
    assert dev.cursors.snapshot() == {}  # NOT_FOUND never moved a cursor


def test_F19_cursor_moves_to_the_newest_sample_in_the_driver_domain(nvml_run):
    run = nvml_run("h100-sxm")
    run.cycle()
    dev = run.col.devices()[0]
    newest = dev.cursors.get(1)  # GPU_UTILIZATION
    assert 0 < newest <= run.drv.now_us
    run.cycle()
    assert dev.cursors.get(1) > newest


def _f20(helpers):
    # the scenario grows the sample list on nvmlDeviceGetProcessUtilization (the older call)
    return helpers.variant("F20_process_list_growth", **helpers.OLD_PROCESS_UTILIZATION)


def test_F20_growing_lists_are_retried_and_complete(nvml_run, helpers):
    run = nvml_run(_f20(helpers))
    run.cycle()
    out = run.output()
    mem = {p.resource["process.pid"] for p in out.find(PROC_MEM)}
    assert len(mem) == 23 and {3001, 3017, 2005, 2006} <= mem  # all 20 compute + 3 graphics-only
    general = out.find(PROC_UTIL, hw__gpu__task="general")
    busy = {p.resource["process.pid"] for p in general if p.value > 0}
    assert busy == {2001, 2002, 2003, 2004, 2005, 2006}  # all 6 samples
    # the call returned samples, so every other listed process was idle: 0 (F27)
    assert {p.resource["process.pid"] for p in general if p.value == 0} == mem - busy
    assert run.failures() == 0  # a retry that succeeds is not an error
    assert run.dropped("insufficient_size") == 0
    # the growth really happened: the compute list needed a second wrapper call (2 C calls each)
    assert run.calls("nvmlDeviceGetComputeRunningProcesses_v3", 0) == 4
    assert run.calls("nvmlDeviceGetProcessUtilization", 0) == 4


def test_F20_exhausted_retries_drop_the_lists_and_count(nvml_run, helpers):
    run = nvml_run(_f20(helpers), helpers.settings(insufficient_size_attempts=1))
    run.cycle()
    out = run.output()
    assert out.find(PROC_MEM) == []
    assert run.dropped("insufficient_size") == 2  # process lists and process utilisation
    assert run.errors(code="INSUFFICIENT_SIZE") == 2
    assert len(out.find(names.MetricGPUMemoryLimit)) == 1  # device metrics unaffected


def test_F23_energy_counter_reset_starts_a_new_series(nvml_run):
    run = nvml_run("F23_energy_counter_reset")
    run.cycle(5)
    pts = run.output().find(names.MetricEnergy)
    assert [p.value for p in pts] == [1000.0, 1000.0, 1250.0, 3.0, 9.0]
    starts = [p.start for p in pts]
    assert starts[0] == starts[1] == starts[2] == pts[0].time  # first read: start == time
    assert starts[3] == starts[4] == pts[2].time  # reset after the cycle-3 read
    assert pts[3].start < pts[3].time
    assert run.failures() == 0 and run.dropped("out_of_range") == 0


def test_F24_garbage_is_dropped_and_union_read_by_declared_type(nvml_run, helpers):
    # the scenario's smUtil override targets nvmlDeviceGetProcessUtilization (the older call)
    run = nvml_run(helpers.variant("F24_garbage_utilization", **helpers.OLD_PROCESS_UTILIZATION))
    run.cycle(2)
    out = run.output()
    general = out.values(names.MetricGPUUtilization, hw__gpu__task="general")
    assert general and set(general) == {0.57}  # uiVal, not the dirty 64-bit union
    assert all(0.0 <= p.value <= 1.0 for p in out.points if p.metric.endswith("utilization"))
    # the bad process sample (smUtil 0xFFFFFFFF) is dropped whole; the good one stays
    assert out.find(PROC_UTIL, pid=2402) == []
    assert out.values(PROC_UTIL, pid=2401, hw__gpu__task="general") == [0.4, 0.4]
    assert run.dropped("out_of_range") == 2
    assert out.values(PROC_MEM, pid=2402) == [1073741824] * 2


def test_F24_snapshot_garbage_is_dropped_not_clamped(nvml_run):
    run = nvml_run("F24_garbage_utilization")
    dev = "GPU-f2400000-0000-4000-8000-000000000001"
    # no sample buffers of memory utilisation: the snapshot feeds memory-copy utilisation, and
    # the gpu field of that first snapshot is 808334905
    run.cycle()
    out = run.output()
    assert out.values(names.MetricGPUMemoryCopyUtilization, hw__id=dev) == [0.2]
    assert run.calls("nvmlDeviceGetUtilizationRates", 0) == 1
