"""Field cases F27-F32 through the real sidecar: ``gpumetrics serve --simulate FILE`` + ``pull``.

Each test starts the console script on a unix socket with the field case's scenario file (the
simulator under a wall clock, as in a demo), pulls with the ``gpumetrics pull`` command and
checks what a user of the sidecar sees. The collector-level versions, cycle by cycle, are in
``tests/nvml/test_fcases_field_reports.py``.
"""

from __future__ import annotations

import pytest
import yaml
from gpumetrics.metrics import names
from grpc_health.v1 import health_pb2

import nvmlsim as sim

from .served import Point, Served

GPU_SCOPE = names.ScopeName
SELF_SCOPE = names.SelfScopeName
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


START_BUDGET_CYCLES = 4
"""Events of wall-clock runs move this many cycles later: a loaded machine may take seconds
to start the sidecar, and the scenario's first cycles must be collected normally."""


def scenario_file(tmp_path, case: str, invalid_handle: str = "violation"):
    """The field case's scenario file, events delayed by :data:`START_BUDGET_CYCLES`."""
    data = yaml.safe_load(sim.field_case_path(case).read_text())
    if not data.get("events") and invalid_handle == "violation":
        return sim.field_case_path(case)  # the shipped file as is
    for event in data.get("events", []):
        event["at_cycle"] += START_BUDGET_CYCLES
    data["driver"]["invalid_handle"] = invalid_handle
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def serve(tmp_path):
    started: list[Served] = []

    def start(case: str, invalid_handle: str = "violation", **kwargs) -> Served:
        s = Served(tmp_path, scenario_file(tmp_path, case, invalid_handle), **kwargs)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


def _proc(points: list[Point], metric: str, pid: int, **attrs) -> list[float]:
    return [
        p.value
        for p in points
        if p.metric == metric
        and p.resource.get("process.pid") == pid
        and all(p.attrs.get(k.replace("__", ".")) == v for k, v in attrs.items())
    ]


def test_F27_idle_running_process_reads_0_through_the_sidecar(serve):
    s = serve("F27_idle_process_zero_utilization")
    util = names.MetricProcessUtilization

    def busy(points, pid):
        return [v for v in _proc(points, util, pid, hw__gpu__task="general") if v > 0]

    got = s.pull_until(lambda p: busy(p, 2701) and busy(p, 2702) and _proc(p, util, 2704))
    assert set(_proc(got, util, 2704, hw__gpu__task="general")) == {0.0}  # D: idle, read as 0
    assert set(_proc(got, util, 2704, hw__gpu__task="encoder")) == {0.0}
    assert set(_proc(got, names.MetricProcessMemoryCopyUtilization, 2704)) == {0.0}
    # A and B are read from their samples. (Their sampling period equals the 1 s tick here, so
    # a tick that lands just before a process's next sample finds none newer than the cursor
    # and reads 0 for it: what NVML's answer says about that window.)
    assert set(busy(got, 2701)) == {0.9} and set(busy(got, 2702)) == {0.1}
    s.stop()


def test_F28_process_with_memory_not_available_stays_visible(serve):
    s = serve("F28_process_memory_not_available")
    util = names.MetricProcessUtilization
    got = s.pull_until(
        lambda p: {3801, 3802} <= {x.resource.get("process.pid") for x in p if x.metric == util}
    )
    assert [p for p in got if p.metric == names.MetricProcessMemoryUsage] == []
    assert set(_proc(got, util, 3801, hw__gpu__task="general")) == {0.4}
    assert set(_proc(got, util, 3802, hw__gpu__task="general")) == {0.0}
    s.stop()


def test_F29_reserved_memory_is_its_own_metric(serve):
    s = serve("F29_reserved_memory_v2")
    got = s.pull_until(lambda p: any(x.metric == names.MetricGPUMemoryReserved for x in p))
    reserved = {p.value for p in got if p.metric == names.MetricGPUMemoryReserved}
    used = {p.value for p in got if p.metric == names.MetricGPUMemoryUsage}
    assert reserved == {314572800} and used == {1073741824}
    s.stop()


def test_F30_jetson_exports_status_and_identity_and_warns_once(serve):
    s = serve("F30_jetson_no_supported_telemetry")
    got = s.pull_until(lambda p: any(x.metric == names.MetricStatus for x in p))
    got += s.pull_until(lambda p: any(x.metric == names.MetricStatus for x in p))  # 2nd batch
    assert {p.metric for p in got if p.scope == GPU_SCOPE} == {names.MetricStatus}
    assert {p.attrs["hw.model"] for p in got if p.scope == GPU_SCOPE} == {"Orin (nvgpu)"}
    s.stop()  # then every log record has been read
    warnings = [r["@message"] for r in s.records if r.get("@level") in ("warn", "error")]
    telemetry = [m for m in warnings if "reports no supported telemetry" in m]
    assert len(telemetry) == 1, warnings
    assert not any("symbol" in m for m in warnings), warnings


def test_F31_boot_clock_samples_are_kept_under_serve_simulate(serve):
    s = serve("F31_boot_clock_samples")
    got = s.pull_until(lambda p: sum(x.metric == names.MetricPower for x in p) >= 12)
    ticks = {p.time for p in got if p.metric == names.MetricTemperature}  # snapshot readings
    power = [p for p in got if p.metric == names.MetricPower]
    assert any(p.time not in ticks for p in power)  # each sample at its own time
    dropped = [
        p
        for p in got
        if p.metric == "gpumetrics.values.dropped"
        and p.attrs.get("reason") == "timestamp_out_of_range"
    ]
    assert dropped == []
    newest = max(p.time for p in got)
    assert all(newest - 120 * 10**9 <= p.time <= newest for p in power)  # wall time, not boot
    s.stop()


def test_F32_nvml_down_everywhere_health_not_serving_through_the_sidecar(serve):
    s = serve(
        "F32_device_access_revoked",
        config="runtime:\n  unhealthy_after_nvml_down_s: 1\n",
    )
    statuses = s.watch_health([SERVING, NOT_SERVING])
    assert statuses[-1] == NOT_SERVING
    assert s.health("gpumetrics.v1.MetricsPullService") == NOT_SERVING
    assert s.health("gpumetrics.v1.ProfilerIntegrationService") == SERVING
    got = s.pull_until(lambda p: any(x.metric == "gpumetrics.nvml.up" and x.value == 0 for x in p))
    first_down = min(p.time for p in got if p.metric == "gpumetrics.nvml.up" and p.value == 0)
    assert {p.attrs["reason"] for p in got if p.metric == "gpumetrics.nvml.up" and not p.value} == {
        "unknown"
    }
    device = [p for p in got if p.scope == GPU_SCOPE]
    assert device, "cycles 1-3 had device metrics"
    assert all(p.time < first_down for p in device)  # nothing after NVML went down
    s.wait_record(lambda r: "health NOT_SERVING" in r["@message"])
    s.wait_record(lambda r: "NVML init failed: UNKNOWN" in r["@message"])  # re-init on back-off
    s.stop()


@pytest.mark.parametrize(
    ("case", "back"),
    [
        ("F10_handle_failure_unknown", None),
        ("F11_gpu_lost_back_at_new_index", "GPU-f1200000-0000-4000-8000-000000000001"),
    ],
)
def test_the_sidecar_never_passes_an_invalid_handle(serve, case, back):
    # driver.invalid_handle: abort ends the process on a NULL or never-issued handle, as the
    # real library crashes: the sidecar must survive a GPU without handle, lost and back.
    s = serve(case, invalid_handle="abort")

    def done(points):
        current = [
            (p.attrs["hw.id"], p.attrs["hw.state"], p.time)
            for p in points
            if p.metric == names.MetricStatus and p.value == 1
        ]
        if back is None:  # a few cycles, the handle-less index probed on back-off
            return len({t for _, _, t in current}) >= 4
        failed = [t for i, state, t in current if i == back and state == "failed"]
        ok = [t for i, state, t in current if i == back and state == "ok"]
        return bool(failed) and bool(ok) and max(ok) > max(failed)  # lost, then back

    s.pull_until(done)
    assert s.proc.poll() is None, s.log()
    s.stop()
