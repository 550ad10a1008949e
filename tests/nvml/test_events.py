"""The NVML event listener on the simulated driver: registration, delivery, GPU lost and back,
MIG, storms, and the session lifecycle (the set is freed before every nvmlShutdown).

Every wait here is on a condition (the listener's registrations, the sink's records) with a
deadline; the listener thread waits in the simulator in real time with a short timeout.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import yaml
from gpumetrics.events import EventProducer, EventSettings, GpuEvent
from gpumetrics.identity.attrs import from_key_values
from gpumetrics.metrics import names
from opentelemetry.proto.logs.v1 import logs_pb2

import nvmlsim as sim

DEADLINE_S = 30.0
XID_TYPES = ["xid", "double_bit_ecc", "single_bit_ecc"]
GPU_A = "GPU-e7e00000-0000-4000-8000-000000000000"
GPU_B = "GPU-e7e00000-0000-4000-8000-000000000001"


class Sink(EventProducer):
    """The real EventProducer, plus a condition tests wait on for records to arrive."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[GpuEvent] = []
        self._seen_cond = threading.Condition()

    def record(self, event: GpuEvent) -> None:
        super().record(event)
        with self._seen_cond:
            self.seen.append(event)
            self._seen_cond.notify_all()

    def wait_seen(self, n: int, timeout_s: float = DEADLINE_S) -> list[GpuEvent]:
        with self._seen_cond:
            ok = self._seen_cond.wait_for(lambda: len(self.seen) >= n, timeout=timeout_s)
            assert ok, f"only {len(self.seen)} of {n} events arrived: {self.seen}"
            return list(self.seen)


def events_settings(**overrides: Any) -> EventSettings:
    return EventSettings(**({"wait_timeout_s": 0.05} | overrides))


def attach(run: Any, **overrides: Any) -> Sink:
    clock = run.drv.clock
    s = events_settings(**overrides)
    sink = Sink(s, {"host.name": "node-1"}, run.tel, clock_ns=lambda: clock.now_us() * 1000)
    run.col.attach_events(sink, s)
    return sink


def records(sink: Sink) -> list[logs_pb2.LogRecord]:
    req = sink.collect()
    return [r for rl in req.resource_logs for sl in rl.scope_logs for r in sl.log_records]


def rattrs(record: logs_pb2.LogRecord) -> dict[str, Any]:
    return dict(from_key_values(record.attributes))


def two_gpus(**top: Any) -> dict[str, Any]:
    def gpu(uuid: str, index: int) -> dict[str, Any]:
        return {
            "uuid": uuid,
            "name": "NVIDIA H100 80GB HBM3",
            "serial": f"165412300000{index}",
            "temperature_c": 50,
            "power": {"usage_mw": 300000},
            "supported_events": XID_TYPES,
        }

    data: dict[str, Any] = {"devices": [gpu(GPU_A, 0), gpu(GPU_B, 1)]}
    data.update(top)
    return data


def start(run: Any, gpus: int = 2) -> None:
    run.cycle()
    assert run.col.events is not None
    assert run.col.events.wait_registered(gpus, DEADLINE_S)


def test_xid_events_become_log_records_and_a_counter(nvml_run, helpers):
    run = nvml_run(
        two_gpus(
            nvml_events=[
                {"device": 0, "type": "xid", "data": 48, "after_registration": 1},
                {"device": GPU_B, "type": "xid", "data": 94, "after_registration": 1},
            ]
        ),
        helpers.settings(),
    )
    sink = attach(run)
    registered_at = run.drv.now_us * 1000
    start(run)
    sink.wait_seen(2)
    got = {rattrs(r)["hw.id"]: r for r in records(sink)}
    a, b = got[GPU_A], got[GPU_B]
    assert a.event_name == b.event_name == "nvidia.gpu.xid"
    assert (a.severity_text, b.severity_text) == ("ERROR", "WARN")
    assert a.time_unix_nano == 0  # nvmlEventSetWait_v2 gives no time
    assert a.observed_time_unix_nano >= registered_at
    attrs = rattrs(a)
    assert attrs["hw.name"] == "gpu0" and attrs["hw.model"] == "NVIDIA H100 80GB HBM3"
    assert attrs["hw.serial_number"] == "1654123000000" and attrs["hw.type"] == "gpu"
    assert attrs["nvidia.gpu.xid.code"] == 48 and attrs["nvidia.gpu.event.data"] == 48
    assert attrs["nvidia.gpu.xid.mnemonic"] == "ROBUST_CHANNEL_GPU_ECC_DBE"
    assert "Xid 48 on gpu0" in a.body.string_value
    assert rattrs(b)["nvidia.gpu.xid.immediate_action"] == "RESTART_APP"
    run.cycle()
    out = run.output()
    a48 = out.one(names.MetricGPUEvents, hw__id=GPU_A)
    assert a48.value == 1 and a48.attrs["nvidia.gpu.xid.code"] == 48
    assert a48.attrs["nvidia.gpu.event.type"] == "xid" and a48.attrs["hw.name"] == "gpu0"
    assert a48.start >= registered_at
    assert out.one(names.MetricGPUEvents, hw__id=GPU_B).attrs["nvidia.gpu.xid.code"] == 94
    assert run.drv.violations == []


def test_unsupported_gpus_are_probed_once_per_session(nvml_run, helpers):
    run = nvml_run("gb10", helpers.settings())
    attach(run)
    run.cycle(3)
    listener = run.col.events
    assert listener is not None and listener.wait_registered(0, DEADLINE_S)
    assert run.calls("nvmlDeviceGetSupportedEventTypes") == 1
    assert run.calls("nvmlDeviceRegisterEvents") == 0
    assert run.tel.value("gpumetrics.events.registered_devices") == 0
    assert run.errors(code="NOT_SUPPORTED") >= 1


def test_only_configured_types_are_registered(nvml_run, helpers):
    run = nvml_run(two_gpus(), helpers.settings())
    sink = attach(run, types=["double_bit_ecc"])
    start(run)
    assert run.drv.emit_event(0, "xid", 13) == 0  # not registered for Xids
    assert run.drv.emit_event(0, "double_bit_ecc") == 1
    (event,) = sink.wait_seen(1)
    assert event.type == "double_bit_ecc" and event.device_id == GPU_A


def test_gpu_lost_during_the_wait_is_one_record_and_events_resume(nvml_run, helpers):
    data = yaml.safe_load(sim.field_case_path("F11_gpu_lost_and_back").read_text())
    for dev in data["devices"]:
        dev["supported_events"] = ["xid"]
    lost_uuid = data["devices"][1]["uuid"]
    data["nvml_events"] = [
        {"device": lost_uuid, "type": "xid", "data": 31, "after_registration": 2},
    ]
    run = nvml_run(data, helpers.settings(device_backoff_initial_s=2.0, device_backoff_max_s=2.0))
    sink = attach(run)
    start(run, gpus=len(data["devices"]))
    run.cycle(2)  # cycles 2-3
    run.cycle()  # cycle 4: the GPU falls off the bus, during the listener's wait
    (lost,) = sink.wait_seen(1)
    assert lost.type == "gpu_lost" and lost.device_id == lost_uuid
    assert lost.reason == "GPU_IS_LOST"
    run.cycle(3)  # cycles 5-7: still lost; the listener and the ticks both know
    run.cycle()  # cycle 8: back under a new handle: registered again, the Xid 31 arrives
    seen = sink.wait_seen(2)
    assert [e.type for e in seen] == ["gpu_lost", "xid"]
    assert seen[1].data == 31 and seen[1].device_id == lost_uuid
    listener = run.col.events
    assert listener is not None
    # one set at start, one after the loss (the old one kept answering GPU_IS_LOST); the
    # recovered GPU joined the second set, so no other GPU's queued event was lost to a third
    assert listener.rebuilds == 2
    recs = records(sink)
    assert [r.event_name for r in recs] == ["nvidia.gpu.lost", "nvidia.gpu.xid"]
    assert recs[0].severity_text == "FATAL" and "is lost" in recs[0].body.string_value
    run.cycle()
    out = run.output()
    assert out.values(names.MetricGPUEvents, hw__id=lost_uuid, nvidia__gpu__event__type="gpu_lost")
    assert (
        out.values(names.MetricGPUEvents, hw__id=lost_uuid, nvidia__gpu__event__type="gpu_lost")[-1]
        == 1
    )
    assert run.drv.violations == []


def test_stop_frees_the_set_before_nvml_shutdown(nvml_run, helpers):
    run = nvml_run(two_gpus(driver={"strict": True}), helpers.settings())
    attach(run)
    start(run)
    assert run.col.stop(5.0)
    assert run.calls("nvmlEventSetFree") == run.calls("nvmlEventSetCreate") >= 1
    assert run.calls("nvmlShutdown") == 1
    assert run.drv.violations == []  # no event_set_not_freed, no shutdown_during_call


def test_release_frees_the_set_and_resume_registers_again(nvml_run, helpers):
    data = two_gpus(driver={"strict": True})
    run = nvml_run(data, helpers.settings())
    sink = attach(run)
    start(run)
    assert run.col.release(5.0)
    assert run.drv.init_count == 0 and run.drv.violations == []
    run.col.resume()
    run.cycle()
    assert run.col.events is not None and run.col.events.wait_registered(2, DEADLINE_S)
    assert run.drv.emit_event(1, "xid", 43) == 1
    (event,) = sink.wait_seen(1)
    assert event.device_id == GPU_B
    assert run.col.stop(5.0) and run.drv.violations == []


def test_a_library_failure_drops_the_set_and_a_new_session_registers(nvml_run, helpers):
    data = two_gpus(
        driver={"strict": True},
        faults=[
            {
                "function": "nvmlDeviceGetPowerUsage",
                "device": 0,
                "code": "UNINITIALIZED",
                "from_cycle": 3,
                "calls": 1,
            }
        ],
    )
    run = nvml_run(data, helpers.settings(init_backoff_initial_s=1.0, init_backoff_max_s=1.0))
    sink = attach(run)
    start(run)
    run.cycle()  # cycle 2
    report = run.cycle()  # cycle 3: the library answers UNINITIALIZED: session down
    assert not report.up
    listener = run.col.events
    assert listener is not None and listener.wait_idle(DEADLINE_S)
    up = None
    for _ in range(5):  # re-initialised once the listener left NVML (the shutdown waited)
        up = run.cycle()
        if up.up:
            break
    assert up is not None and up.up
    assert listener.wait_registered(2, DEADLINE_S)
    assert run.calls("nvmlInitWithFlags") == 2 and run.calls("nvmlShutdown") == 1
    assert run.calls("nvmlEventSetCreate") >= 2
    assert run.drv.emit_event(0, "xid", 13) == 1
    sink.wait_seen(1)
    assert run.drv.violations == []


def test_a_storm_is_counted_in_full_and_logged_within_the_limit(nvml_run, helpers):
    run = nvml_run(two_gpus(), helpers.settings())
    sink = attach(run, storm_burst=5, storm_window_s=10.0)
    start(run)
    assert run.drv.emit_event(0, "xid", 13, count=10_000) == 1
    sink.wait_seen(10_000, timeout_s=120)
    first = records(sink)
    assert len(first) == 5 and {rattrs(r)["nvidia.gpu.xid.code"] for r in first} == {13}
    assert (
        run.tel.value(
            "gpumetrics.events.suppressed", {"nvidia.gpu.event.type": "xid", "reason": "storm"}
        )
        == 9_995
    )
    run.drv.advance(10.0)  # the storm window closes
    (summary,) = records(sink)
    assert summary.event_name == "nvidia.gpu.events.suppressed"
    attrs = rattrs(summary)
    assert attrs["nvidia.gpu.event.suppressed_count"] == 9_995
    assert attrs["nvidia.gpu.xid.code"] == 13 and attrs["hw.id"] == GPU_A
    assert "9995 more identical events" in summary.body.string_value
    run.cycle()
    assert run.output().one(names.MetricGPUEvents, hw__id=GPU_A).value == 10_000


def test_mig_instance_events_are_attributed_to_the_instance(nvml_run, helpers):
    data = yaml.safe_load(sim.profile_path("a100-mig").read_text())
    device = data["devices"][0]
    device["mig"]["privileged"] = True
    instance = device["mig"]["instances"][1]
    run = nvml_run(data, helpers.settings())
    sink = attach(run)
    start(run, gpus=1)
    assert run.drv.emit_event(instance["uuid"], "xid", 43) == 1
    assert run.drv.emit_event(0, "double_bit_ecc") == 1
    mig_event, gpu_event = sink.wait_seen(2)
    assert mig_event.device_id == instance["uuid"]
    assert mig_event.gpu_instance_id == instance["gpu_instance_id"]
    assert dict(mig_event.attributes)["hw.parent"] == device["uuid"]
    assert gpu_event.device_id == device["uuid"] and gpu_event.gpu_instance_id is None
    run.cycle()
    out = run.output()
    assert out.one(names.MetricGPUEvents, hw__id=instance["uuid"]).value == 1
    assert run.calls("nvmlDeviceRegisterEvents") == 1  # the GPU only: no per-instance sets


def test_a_driver_without_the_v2_wait_turns_events_off_once(nvml_run, helpers, caplog):
    data = yaml.safe_load(sim.profile_path("old-driver-v100").read_text())
    data["driver"]["profile"] = "440"
    run = nvml_run(data, helpers.settings())
    attach(run)
    with caplog.at_level("WARNING", logger="gpumetrics.nvml"):
        run.cycle()
        listener = run.col.events
        assert listener is not None
        assert listener.wait_idle(DEADLINE_S)
        run.cycle(2)
        assert listener.wait_idle(DEADLINE_S)
    off = [r for r in caplog.records if "GPU events are off" in r.getMessage()]
    assert len(off) == 1 and "nvmlEventSetWait_v2" in off[0].getMessage()
    assert run.calls("nvmlEventSetFree") == run.calls("nvmlEventSetCreate") == 1
    assert len(run.output().find(names.MetricTemperature)) == 3 * 4  # metrics unaffected


def test_disabled_counter_metric_keeps_the_logs(nvml_run, helpers):
    run = nvml_run(two_gpus(), helpers.settings(disabled_metrics={names.MetricGPUEvents}))
    sink = attach(run)
    start(run)
    run.drv.emit_event(0, "xid", 79)
    sink.wait_seen(1)
    run.cycle()
    assert run.output().find(names.MetricGPUEvents) == []
    assert [r.severity_text for r in records(sink)] == ["FATAL"]


def test_profiles_with_events_register_every_gpu(nvml_run, helpers):
    run = nvml_run("h100-8x-training", helpers.settings())
    attach(run)
    start(run, gpus=8)
    mask = run.col.events
    assert mask is not None
    assert run.calls("nvmlDeviceRegisterEvents") == 8


def test_begin_stop_ends_the_listeners_wait_before_stop_is_called(nvml_run, helpers):
    """A shutdown first calls begin_stop (runtime.sidecar): the listener leaves its bounded
    nvmlEventSetWait_v2 and frees its set by itself, so a stop given less than one wait
    timeout still ends in nvmlShutdown (without begin_stop this stop fails: the listener is
    inside a 10 s wait)."""
    run = nvml_run(two_gpus(driver={"strict": True}), helpers.settings())
    attach(run, wait_timeout_s=10.0)  # a wait longer than the stop gets below
    start(run)
    listener = run.col.events
    assert listener is not None
    assert not listener.idle()  # inside its wait, with a set allocated
    run.col.begin_stop()
    assert listener.wait_idle(DEADLINE_S)
    assert run.col.stop(5.0)
    assert run.calls("nvmlEventSetFree") == run.calls("nvmlEventSetCreate") >= 1
    assert run.calls("nvmlShutdown") == 1
    assert run.drv.violations == []


# --- issue 28 items 1-4 ----------------------------------------------------------------------
FAST_RETRY = {"device_backoff_initial_s": 0.05, "device_backoff_max_s": 0.2}
"""A registration retried on the device back-off: short, so the test waits little real time."""


def _warnings(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_registration_answering_unknown_rebuilds_the_set_and_retries(nvml_run, helpers, caplog):
    """Issue 28 item 1: nvml.h says a set whose registration answered UNKNOWN is undefined and
    should be freed. The listener kept it, GPU B was never registered again and its events were
    lost. Now: free it, register every GPU on a new set, retry B on back-off, one WARNING."""
    fault = {"function": "nvmlDeviceRegisterEvents", "device": 1, "code": "UNKNOWN", "calls": 2}
    run = nvml_run(
        two_gpus(faults=[fault], driver={"strict": True}), helpers.settings(**FAST_RETRY)
    )
    sink = attach(run)
    with caplog.at_level(logging.DEBUG, logger="gpumetrics.nvml"):
        run.cycle()
        listener = run.col.events
        assert listener is not None and listener.wait_registered(1, DEADLINE_S)
        assert run.drv.emit_event(0, "xid", 13) == 1  # GPU A listens on the set built meanwhile
        sink.wait_seen(1)
        assert listener.wait_registered(2, DEADLINE_S)  # B, after two failed attempts
    assert run.calls("nvmlDeviceRegisterEvents", 1) == 3
    assert run.drv.emit_event(0, "xid", 13) == 1 and run.drv.emit_event(1, "xid", 43) == 1
    seen = sink.wait_seen(3)
    assert [(e.device_id, e.data) for e in seen] == [(GPU_A, 13), (GPU_A, 13), (GPU_B, 43)]
    run.cycle()
    out = run.output()
    assert out.one(names.MetricGPUEvents, hw__id=GPU_A).value == 2  # nothing counted twice
    assert out.one(names.MetricGPUEvents, hw__id=GPU_B).value == 1
    warned = [m for m in _warnings(caplog) if "nvmlDeviceRegisterEvents" in m]
    assert len(warned) == 1 and "undefined state" in warned[0] and GPU_B in warned[0]
    assert run.errors("nvmlDeviceRegisterEvents", "UNKNOWN") == 2
    # each undefined set was freed, never used again: no undefined_event_set violation
    assert run.calls("nvmlEventSetFree") == run.calls("nvmlEventSetCreate") - 1
    assert run.col.stop(5.0) and run.drv.violations == []


def test_each_gpu_says_once_which_configured_types_it_lacks(nvml_run, helpers, caplog):
    """Issue 28 item 1: registration uses mask & nvmlDeviceGetSupportedEventTypes, and one INFO
    per GPU names the configured types it lacks (before: only a GPU lacking them all said so)."""
    data = two_gpus()
    data["devices"][1]["supported_events"] = ["xid", "single_bit_ecc"]
    run = nvml_run(data, helpers.settings())
    attach(run, types=["xid", "double_bit_ecc", "dram_retirement"])
    with caplog.at_level(logging.INFO, logger="gpumetrics.nvml"):
        start(run)
        assert run.col.release(5.0)
        run.col.resume()
        run.cycle()  # a new session probes the types again: no second line
        assert run.col.events is not None and run.col.events.wait_registered(2, DEADLINE_S)
    lines = [r for r in caplog.records if "does not support the configured event types" in r.msg]
    assert sorted(r.getMessage() for r in lines) == [
        f"GPU {GPU_A} does not support the configured event types dram_retirement "
        "(nvmlDeviceGetSupportedEventTypes); it is registered for the others",
        f"GPU {GPU_B} does not support the configured event types double_bit_ecc, "
        "dram_retirement (nvmlDeviceGetSupportedEventTypes); it is registered for the others",
    ]
    assert all(r.levelno == logging.INFO for r in lines)
    assert run.drv.emit_event(1, "xid", 31) == 1  # registered for what it supports


def test_a_recovery_action_event_carries_the_action_read_from_the_field(nvml_run, helpers):
    """Issue 28 item 2: nvmlEventTypeGpuRecoveryAction has eventData 0; the action is
    nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION). Before, eventData 0 was
    rendered as the action `none`, an invented value; where the field fails it is unknown."""
    data = two_gpus()
    types = [*XID_TYPES, "gpu_recovery_action"]
    for dev in data["devices"]:
        dev["supported_events"] = types
    reboot = {"pattern": "trace", "values": [0, 2]}  # NODE_REBOOT from cycle 2
    data["devices"][0]["field_values"] = {
        "GET_GPU_RECOVERY_ACTION": {"value": reboot, "value_type": "UNSIGNED_INT"}
    }
    run = nvml_run(data, helpers.settings())
    sink = attach(run, types=types)
    start(run)
    run.drv.next_cycle()
    assert run.drv.emit_event(0, "gpu_recovery_action") == 1
    assert run.drv.emit_event(1, "gpu_recovery_action") == 1  # B does not answer the field
    a, b = sink.wait_seen(2)
    assert (a.recovery_action, a.reason) == (2, "")
    assert (b.recovery_action, b.reason) == (None, "NOT_SUPPORTED")
    got = {rattrs(r)["hw.id"]: r for r in records(sink)}
    ra, rb = rattrs(got[GPU_A]), rattrs(got[GPU_B])
    assert got[GPU_A].severity_text == "FATAL" and ra["nvidia.gpu.recovery_action"] == "node_reboot"
    assert ra["nvidia.gpu.event.data"] == 0  # NVML's eventData, verbatim
    assert (
        rb["nvidia.gpu.recovery_action"] == "unknown" and rb["nvml.return_code"] == "NOT_SUPPORTED"
    )
    assert "recovery action unknown" in got[GPU_B].body.string_value
    assert run.calls("nvmlDeviceGetFieldValues", 0) >= 1


def test_xid_999_is_recorded_and_counted_as_nvmls_unknown_xid(nvml_run, helpers):
    """Issue 28 item 3: nvml.h sets eventData to 999 for an unknown Xid; it was rendered as a
    catalogue miss of an Xid 999."""
    run = nvml_run(two_gpus(), helpers.settings())
    sink = attach(run)
    start(run)
    assert run.drv.emit_event(0, "xid", 999, count=2) == 1
    sink.wait_seen(2)
    first = records(sink)[0]
    assert first.body.string_value.startswith(f"Unknown Xid on gpu0 ({GPU_A})")
    assert rattrs(first)["nvidia.gpu.xid.description"].startswith("Unknown Xid")
    run.cycle()
    counted = run.output().one(names.MetricGPUEvents, hw__id=GPU_A)
    assert counted.value == 2 and counted.attrs["nvidia.gpu.xid.code"] == 999


def _f11_run(nvml_run: Any, helpers: Any) -> tuple[Any, Sink, str]:
    """F11 (GPU 1 of 4 lost at cycle 4, back after a reset at 8) with xid events, started at
    cycle 1: the run, its event sink and the lost GPU's UUID."""
    data = yaml.safe_load(sim.field_case_path("F11_gpu_lost_and_back").read_text())
    for dev in data["devices"]:
        dev["supported_events"] = ["xid"]
    run = nvml_run(data, helpers.settings(device_backoff_initial_s=2.0, device_backoff_max_s=2.0))
    sink = attach(run)
    start(run, gpus=len(data["devices"]))
    return run, sink, str(data["devices"][1]["uuid"])


def test_one_lost_gpu_logs_one_warning(nvml_run, helpers, caplog):
    """Issue 28 item 4: losing one GPU logged five WARNING/ERROR lines (the registration, "is
    lost", a getter, the state change, a handle lookup). One line per state change now; the
    detail is at DEBUG."""
    run, sink, lost_uuid = _f11_run(nvml_run, helpers)
    run.cycle(2)  # cycles 2-3
    with caplog.at_level(logging.DEBUG, logger="gpumetrics"):
        run.cycle()  # cycle 4: the GPU falls off the bus, during the listener's wait
        (lost,) = sink.wait_seen(1)
        run.cycle(3)  # cycles 5-7: still lost, probed on back-off
        run.cycle()  # cycle 8: back
        assert run.col.events is not None and run.col.events.wait_registered(4, DEADLINE_S)
    assert lost.type == "gpu_lost"
    assert _warnings(caplog) == [f"GPU {lost_uuid}: ok -> failed GPU_IS_LOST"]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any(f"GPU {lost_uuid} is lost (GPU_IS_LOST)" in m for m in debug)
    back = [
        r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "is back" in r.msg
    ]
    assert back == [f"GPU {lost_uuid} is back (index 1)"]


def test_the_sidecar_recovers_from_a_driver_reload(nvml_run, helpers):
    """Issue 28 item 9: after the kernel module is reloaded under the sidecar, NVML answers
    UNINITIALIZED until nvmlShutdown + nvmlInit, and sets created before are gone. The
    collector shuts NVML down, initialises again and the listener registers on a new set;
    no call uses the old set or the old handles (strict mode records none)."""
    data = two_gpus(driver={"strict": True}, events=[{"at_cycle": 3, "action": "reload_driver"}])
    for dev in data["devices"]:
        dev["energy_mj"] = {"pattern": "ramp", "start": 1_000_000, "per_s": 1000}
    run = nvml_run(data, helpers.settings(init_backoff_initial_s=1.0, init_backoff_max_s=1.0))
    sink = attach(run)
    start(run)
    run.cycle()  # cycle 2
    report = run.cycle()  # cycle 3: the reload: every call answers UNINITIALIZED
    assert not report.up
    listener = run.col.events
    assert listener is not None and listener.wait_idle(DEADLINE_S)
    for _ in range(5):  # re-initialised on back-off once the listener left NVML
        if run.cycle().up:
            break
    assert listener.wait_registered(2, DEADLINE_S)
    assert run.calls("nvmlInitWithFlags") == 2 and run.calls("nvmlShutdown") == 1
    assert run.drv.emit_event(1, "xid", 43) == 1  # events flow on the new set
    (event,) = sink.wait_seen(1)
    assert event.device_id == GPU_B
    run.cycle()
    energy = run.output().find(names.MetricEnergy, hw__id=GPU_A)
    assert energy[-1].value < energy[0].value  # restarted with the module: a new series
    assert energy[-1].start > energy[0].start
    assert run.col.stop(5.0) and run.drv.violations == []


def test_a_lost_gpu_is_not_registered_again_on_the_record_it_was_lost_on(nvml_run, helpers, caplog):
    """After a reset, the lost GPU's old handle answers INVALID_ARGUMENT (F11). A listener
    refresh that still holds the record the GPU was lost on (the collector has not yet read the
    new handle: a race a loaded machine loses) registered that stale handle and logged a WARNING
    for what is expected; the lost record now waits for the collector's new one."""
    run, sink, lost_uuid = _f11_run(nvml_run, helpers)
    run.cycle(3)  # cycles 2-4: the GPU falls off the bus at 4
    (lost,) = sink.wait_seen(1)
    run.cycle(3)  # cycles 5-7; the driver is now at cycle 8: back after a reset, not yet read
    ev, devices = run.col.events, list(run.col._devices)
    assert ev is not None and any(d.uuid == lost_uuid and d.health.failed for d in devices)
    caplog.clear()  # the loss's one WARNING: test_one_lost_gpu_logs_one_warning's
    with caplog.at_level(logging.DEBUG, logger="gpumetrics"):
        ev.sync(devices[::-1], run.col._generation)  # a changed signature: a refresh, same records
        assert ev.wait_registered(3, DEADLINE_S)
    assert lost.type == "gpu_lost"
    assert run.errors("nvmlDeviceRegisterEvents", "INVALID_ARGUMENT") == 0
    assert _warnings(caplog) == []
    run.cycle()  # cycle 8: the collector reads the new handle; its events resume
    assert ev.wait_registered(4, DEADLINE_S)
