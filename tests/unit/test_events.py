"""The event catalogue, the storm limit, the LogRecord rendering and the EventProducer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gpumetrics.config import SidecarConfig
from gpumetrics.events import (
    EventProducer,
    EventSettings,
    GpuEvent,
    Severity,
    count_log_records,
    event_catalogue,
)
from gpumetrics.events.docs import BEGIN, END, render_event_tables, replace_generated
from gpumetrics.events.render import XID_CATALOG_URL, render_event
from gpumetrics.events.storm import Admission, StormLimiter
from gpumetrics.identity.attrs import from_key_values
from gpumetrics.metrics import names
from gpumetrics.metrics.spec import catalogue
from gpumetrics.selftelemetry import Telemetry
from opentelemetry.proto.logs.v1 import logs_pb2
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[2]
GPU = (("hw.id", "GPU-1"), ("hw.name", "gpu0"), ("hw.model", "NVIDIA H100 80GB HBM3"))
T0 = 1_767_225_600 * 10**9
ISSUE_XIDS = (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120)


def event(type_: str = "xid", data: int = 48, at: int = T0, device: str = "GPU-1") -> GpuEvent:
    return GpuEvent(type_, data, device, GPU if device == "GPU-1" else (), at)


def attrs(record: logs_pb2.LogRecord) -> dict[str, Any]:
    return dict(from_key_values(record.attributes))


def rendered(e: GpuEvent) -> logs_pb2.LogRecord:
    record = logs_pb2.LogRecord()
    render_event(record, e, event_catalogue())
    return record


# -- the catalogue ---------------------------------------------------------------------------------
@pytest.mark.parametrize("code", ISSUE_XIDS)
def test_the_xids_an_sre_meets_are_described(code):
    x = event_catalogue().xids[code]
    assert x.mnemonic and x.description and x.meaning.endswith(".")
    assert x.immediate_action and x.investigatory_action


def test_xid_severity_follows_the_immediate_action():
    ends_in_reset = {"WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR"}
    for x in event_catalogue().xids.values():
        action = x.immediate_action
        if action == "RESTART_BM":
            want = Severity.FATAL
        elif action == "RESET_GPU" or action in ends_in_reset:
            want = Severity.ERROR
        elif action == "IGNORE":
            contact = x.investigatory_action.startswith("CONTACT_SUPPORT")
            want = Severity.WARN if contact else Severity.INFO
        else:  # RESTART_APP and the other workflows
            want = Severity.WARN
        assert x.severity is want, (x.code, action, x.investigatory_action)


def test_event_types_match_the_counter_metric_and_the_nvml_bits():
    cat = event_catalogue()
    spec = catalogue().metrics[names.MetricGPUEvents]
    counted = {t for t, s in cat.types.items() if t != "suppressed"}
    assert set(spec.attributes[names.AttrEventType]) == counted
    bits = [s.bit for s in cat.nvml_types]
    assert len(set(bits)) == len(bits) and all(b and b & (b - 1) == 0 for b in bits)
    assert all(s.event_name.startswith("nvidia.gpu.") for s in cat.types.values())


def test_docs_events_md_tables_are_generated_from_the_catalogue():
    doc = (ROOT / "docs" / "events.md").read_text()
    fresh = replace_generated(doc, render_event_tables(event_catalogue()))
    assert doc == fresh, "run: python -m gpumetrics.events.docs --write"
    assert BEGIN in doc and END in doc


def test_docs_list_every_rendered_attribute():
    doc = (ROOT / "docs" / "events.md").read_text()
    cat = event_catalogue()
    seen: set[str] = set()
    for e in (
        event(),
        event(data=999),
        GpuEvent("gpu_lost", 0, "GPU-1", GPU, T0, reason="GPU_IS_LOST"),
        GpuEvent("gpu_recovery_action", 2, "GPU-1", GPU, T0),
        GpuEvent("xid", 43, "MIG-1", (("hw.parent", "GPU-1"),), T0, 0, 1, 0),
    ):
        seen |= set(attrs(rendered(e)))
    settings = EventSettings(storm_burst=1, storm_window_s=1)
    p = EventProducer(settings, clock_ns=lambda: T0 + 2 * 10**9)
    for i in range(3):
        p.record(event(at=T0 + i))
    req = p.collect()
    summary = [r for rl in req.resource_logs for sl in rl.scope_logs for r in sl.log_records]
    seen |= set(attrs(summary[-1]))
    assert summary[-1].event_name == cat.types["suppressed"].event_name
    for key in seen - {"hw.name", "hw.model"}:
        assert f"`{key}`" in doc, key


# -- rendering -------------------------------------------------------------------------------------
def test_a_known_xid_record():
    r = rendered(event(data=95))
    assert r.event_name == "nvidia.gpu.xid"
    assert (r.severity_number, r.severity_text) == (logs_pb2.SEVERITY_NUMBER_ERROR, "ERROR")
    assert r.time_unix_nano == 0 and r.observed_time_unix_nano == T0
    a = attrs(r)
    assert a["nvidia.gpu.xid.code"] == 95 and a["nvidia.gpu.event.data"] == 95
    assert a["nvidia.gpu.xid.mnemonic"] == "ROBUST_CHANNEL_UNCONTAINED_ERROR"
    assert a["nvidia.gpu.event.nvml_type"] == "nvmlEventTypeXidCriticalError"
    assert a["hw.type"] == "gpu" and a["hw.id"] == "GPU-1"
    body = r.body.string_value
    assert body.startswith("Xid 95 on gpu0 (GPU-1): Uncontained ECC error")
    assert "immediate RESET_GPU" in body


def test_an_xid_missing_from_the_catalogue_is_a_warning_that_points_to_nvidia():
    r = rendered(event(data=777))
    assert r.severity_text == "WARN" and XID_CATALOG_URL in r.body.string_value
    assert "not in gpumetrics' Xid catalogue" in r.body.string_value
    assert "nvidia.gpu.xid.mnemonic" not in attrs(r)


def test_xid_999_is_nvmls_unknown_xid_marker_not_a_catalogue_miss():
    """nvml.h (nvmlEventData_t): "eventData is set as 999 for unknown Xid error". It was
    rendered as an Xid gpumetrics' catalogue lacks, pointing to NVIDIA's catalog for Xid 999."""
    r = rendered(event(data=999))
    body = r.body.string_value
    assert body.startswith("Unknown Xid on gpu0") and "unknown-Xid marker" in body
    assert "not in gpumetrics' Xid catalogue" not in body and "dmesg" in body
    a = attrs(r)
    assert a["nvidia.gpu.xid.code"] == 999  # NVML's value, verbatim: counted under it
    assert a["nvidia.gpu.xid.description"].startswith("Unknown Xid")
    assert "nvidia.gpu.xid.mnemonic" not in a and r.severity_text == "WARN"


def test_severity_text_and_number_agree_for_every_severity():
    for sev in Severity:
        assert logs_pb2.SeverityNumber.Name(sev.value) == f"SEVERITY_NUMBER_{sev.name}"


def test_recovery_actions_and_lost_gpus():
    """The action is the field value read when the event arrived; eventData is 0 (nvml.h)."""
    reboot = rendered(GpuEvent("gpu_recovery_action", 0, "GPU-1", GPU, T0, recovery_action=2))
    assert reboot.severity_text == "FATAL" and attrs(reboot)["nvidia.gpu.recovery_action"] == (
        "node_reboot"
    )
    assert attrs(reboot)["nvidia.gpu.recovery_action.value"] == 2
    assert "recovery action node_reboot" in reboot.body.string_value
    odd = rendered(GpuEvent("gpu_recovery_action", 0, "GPU-1", GPU, T0, recovery_action=77))
    assert odd.severity_text == "WARN" and attrs(odd)["nvidia.gpu.recovery_action"] == "unknown"
    assert attrs(odd)["nvidia.gpu.recovery_action.value"] == 77  # the value read, verbatim
    unread = rendered(GpuEvent("gpu_recovery_action", 0, "GPU-1", GPU, T0, reason="NOT_SUPPORTED"))
    a = attrs(unread)
    assert a["nvidia.gpu.recovery_action"] == "unknown" and a["nvml.return_code"] == "NOT_SUPPORTED"
    assert "nvidia.gpu.recovery_action.value" not in a and unread.severity_text == "WARN"
    assert "recovery action unknown" in unread.body.string_value
    assert " none" not in unread.body.string_value  # never the invented "none"
    lost = rendered(GpuEvent("gpu_lost", 0, "GPU-1", GPU, T0, reason="GPU_IS_LOST"))
    assert lost.event_name == "nvidia.gpu.lost" and lost.severity_text == "FATAL"
    assert attrs(lost)["nvml.return_code"] == "GPU_IS_LOST"
    assert "nvidia.gpu.event.data" not in attrs(lost)  # not an NVML event: no eventData


def test_huge_event_data_is_kept_verbatim_as_text():
    r = rendered(GpuEvent("single_bit_ecc", 2**64 - 1, "GPU-1", GPU, T0))
    assert attrs(r)["nvidia.gpu.event.data"] == str(2**64 - 1)


def test_mig_attribution_adds_the_instance_ids():
    r = rendered(GpuEvent("xid", 43, "MIG-1", (("hw.id", "MIG-1"),), T0, 0, 3, 1))
    a = attrs(r)
    assert (a["nvidia.gpu.mig.gpu_instance.id"], a["nvidia.gpu.mig.compute_instance.id"]) == (3, 1)


# -- the storm limit -------------------------------------------------------------------------------
def test_storm_windows_log_a_burst_then_suppress_then_reopen():
    lim: StormLimiter[str] = StormLimiter(burst=2, window_s=10.0)
    s = 10**9
    verdicts = [lim.admit("k", "e", T0 + i)[0] for i in range(5)]
    assert verdicts == [Admission.LOG, Admission.LOG] + [Admission.STORM] * 3
    assert lim.admit("other", "e", T0)[0] == Admission.LOG  # keys are independent
    verdict, closed = lim.admit("k", "e", T0 + 10 * s)  # the window ended: summary first
    assert verdict == Admission.LOG and closed is not None and closed.suppressed == 3
    assert lim.close_expired(T0 + 11 * s) == []  # 'other' suppressed nothing
    assert lim.open_windows() == 1


def test_storm_keys_are_bounded():
    lim: StormLimiter[int] = StormLimiter(burst=1, window_s=1.0, max_keys=2)
    assert [lim.admit(k, k, T0)[0] for k in range(3)] == [
        Admission.LOG,
        Admission.LOG,
        Admission.TOO_MANY_KEYS,
    ]


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"burst": 0}, "burst"), ({"window_s": 0}, "window_s")]
)
def test_storm_limits_are_validated(kwargs, field):
    with pytest.raises(ValueError, match=field):
        StormLimiter(**({"burst": 1, "window_s": 1.0} | kwargs))


# -- the producer ----------------------------------------------------------------------------------
def test_the_producer_counts_everything_and_queues_within_limits():
    tel = Telemetry()
    now = [T0]
    p = EventProducer(
        EventSettings(storm_burst=3, storm_window_s=60, max_queued_records=5),
        {"host.name": "n1"},
        tel,
        clock_ns=lambda: now[0],
    )
    assert p.totals("GPU-1") == []  # nothing before listening or an event
    p.listening("GPU-1", T0 - 5)
    for i in range(100):
        p.record(event(at=T0 + i))
    for code in range(10, 16):  # six more kinds: the queue (5) overflows
        p.record(event(data=code, at=T0))
    (total48,) = [t for t in p.totals("GPU-1") if dict(t.attributes).get(names.AttrXidCode) == 48]
    assert total48.value == 100 and total48.start_ns == T0 - 5
    assert sum(t.value for t in p.totals("GPU-1")) == 106

    def suppressed(reason: str) -> Any:
        attributes = {"nvidia.gpu.event.type": "xid", "reason": reason}
        return tel.value("gpumetrics.events.suppressed", attributes)

    assert suppressed("storm") == 97 and suppressed("queue_full") == 4
    req = p.collect()
    (rl,) = req.resource_logs
    resource = [(kv.key, kv.value.string_value) for kv in rl.resource.attributes]
    assert resource == [("host.name", "n1")]
    (sl,) = rl.scope_logs
    assert sl.scope.name == names.ScopeName and sl.schema_url == names.SchemaURL
    assert len(sl.log_records) == 5
    assert len(p.collect().resource_logs) == 0  # drained; the window is still open
    final = p.collect(final=True)  # shutdown closes it: the summary of 97
    (summary,) = final.resource_logs[0].scope_logs[0].log_records
    assert attrs(summary)["nvidia.gpu.event.suppressed_count"] == 97


def test_flush_to_appends_one_batch_with_its_record_count():
    class Store:
        def __init__(self) -> None:
            self.got: list[int] = []

        def append(self, request) -> int:
            self.got.append(count_log_records(request))
            return len(self.got)

    p = EventProducer(EventSettings())
    store = Store()
    assert p.flush_to(store) is None and store.got == []
    p.record(event())
    p.record(event(data=94))
    assert p.flush_to(store) == 1 and store.got == [2]


# -- settings --------------------------------------------------------------------------------------
def test_default_types_leave_out_the_chatty_ones():
    s = EventSettings()
    assert "xid" in s.types and "pstate" not in s.types and "clock" not in s.types
    assert s.mask() & 0x8 and not s.mask() & 0x4


def test_bad_event_settings_name_the_field():
    with pytest.raises(ValidationError) as info:
        SidecarConfig.model_validate({"events": {"types": ["xid", "xidd"]}})
    text = str(info.value)
    assert "events.types" in text and "unknown event type 'xidd'" in text
    with pytest.raises(ValidationError, match="storm_burst"):
        SidecarConfig.model_validate({"events": {"storm_burst": 0}})
