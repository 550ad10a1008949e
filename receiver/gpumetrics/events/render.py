"""Rendering GPU events as OTLP LogRecords (no I/O): event name, severity, attributes, body.

Shape (OpenTelemetry logs data model, https://opentelemetry.io/docs/specs/otel/logs/data-model/,
and the semantic conventions for events, https://opentelemetry.io/docs/specs/semconv/general/events/):

* ``event_name``: the catalogue's name in the ``nvidia.*`` namespace (``nvidia.gpu.xid``); the
  field replaces the deprecated ``event.name`` attribute;
* ``severity_number`` / ``severity_text``: from the catalogue (for an Xid, from its entry);
* ``time_unix_nano``: when the event happened according to NVML, left unset when NVML gave no
  time (``nvmlEventSetWait_v2`` gives none; the data model lets consumers fall back to the
  observed time); ``observed_time_unix_nano``: when the sidecar received it;
* ``attributes``: the GPU's identity attributes (as on its metric points), ``hw.type=gpu``,
  the event type and NVML's ``eventData`` verbatim, and what the catalogue knows about it;
* ``body``: one sentence a person can act on. The semantic conventions say events SHOULD NOT
  use a body; we give one anyway because the logs pipeline's users read it (a debug exporter, a
  log viewer), and every fact in it is also an attribute.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from opentelemetry.proto.logs.v1 import logs_pb2

from gpumetrics.events.catalogue import EventCatalogue, EventTypeSpec, RecoveryAction, Severity
from gpumetrics.events.model import GpuEvent
from gpumetrics.events.storm import Window
from gpumetrics.metrics import names
from gpumetrics.metrics.encode import encode_attributes

__all__ = [
    "AttrEventData",
    "AttrEventNVMLType",
    "AttrRecoveryAction",
    "AttrRecoveryActionValue",
    "AttrSuppressedCount",
    "XID_CATALOG_URL",
    "render_event",
    "render_summary",
    "severity_of",
]

AttrEventData = "nvidia.gpu.event.data"
AttrEventNVMLType = "nvidia.gpu.event.nvml_type"
AttrXidMnemonic = "nvidia.gpu.xid.mnemonic"
AttrXidDescription = "nvidia.gpu.xid.description"
AttrXidImmediateAction = "nvidia.gpu.xid.immediate_action"
AttrXidInvestigatoryAction = "nvidia.gpu.xid.investigatory_action"
AttrRecoveryAction = "nvidia.gpu.recovery_action"
AttrRecoveryActionValue = "nvidia.gpu.recovery_action.value"
AttrReturnCode = "nvml.return_code"
AttrSuppressedCount = "nvidia.gpu.event.suppressed_count"
AttrSuppressedFirst = "nvidia.gpu.event.suppressed_first_time"
AttrSuppressedLast = "nvidia.gpu.event.suppressed_last_time"
AttrWindowS = "nvidia.gpu.event.storm_window_s"

XID_CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
"""NVIDIA's Xid catalog, where an Xid this catalogue lacks is explained."""

_INT64_MAX = 2**63 - 1


UNKNOWN_ACTION = "unknown"
"""``nvidia.gpu.recovery_action`` when the action could not be read or is not in the catalogue."""


def severity_of(event: GpuEvent, cat: EventCatalogue) -> Severity:
    """Return the severity of ``event``: the type's, the Xid's, or the recovery action's.

    Xids missing from the catalogue and unknown recovery actions are WARN: something the
    driver thought worth reporting; NVML's unknown-Xid marker has the catalogue's severity.
    """
    spec = cat.types[event.type]
    if spec.severity_rule == "xid":
        if event.data == cat.unknown_xid.code:
            return cat.unknown_xid.severity
        xid = cat.xids.get(event.data)
        return xid.severity if xid is not None else Severity.WARN
    if spec.severity_rule == "recovery_action":
        action = _action(event, cat)
        return action.severity if action is not None else Severity.WARN
    return spec.severity or Severity.WARN


def _action(event: GpuEvent, cat: EventCatalogue) -> RecoveryAction | None:
    """Return the catalogue entry of the recovery action read for ``event`` (None: unknown)."""
    if event.recovery_action is None:
        return None
    return cat.recovery_actions.get(event.recovery_action)


def _attributes(event: GpuEvent, spec: EventTypeSpec, cat: EventCatalogue) -> list[Any]:
    attrs: list[tuple[str, Any]] = [*event.attributes]
    present = {k for k, _ in attrs}
    attrs.append((names.AttrHwType, names.HwTypeGPU))
    attrs.append((names.AttrEventType, event.type))
    for key, value in (
        (names.AttrMIGGPUInstanceID, event.gpu_instance_id),
        (names.AttrMIGComputeInstanceID, event.compute_instance_id),
    ):
        if value is not None and key not in present:
            attrs.append((key, value))
    if spec.from_nvml:
        attrs.append((AttrEventNVMLType, spec.nvml))
        attrs.append((AttrEventData, event.data if event.data <= _INT64_MAX else str(event.data)))
    if event.type == "xid" and event.data <= _INT64_MAX:
        attrs.append((names.AttrXidCode, event.data))
        xid = cat.xids.get(event.data)
        if event.data == cat.unknown_xid.code:
            attrs.append((AttrXidDescription, cat.unknown_xid.description))
        elif xid is not None:
            attrs += [
                (AttrXidMnemonic, xid.mnemonic),
                (AttrXidDescription, xid.description),
                (AttrXidImmediateAction, xid.immediate_action),
                (AttrXidInvestigatoryAction, xid.investigatory_action),
            ]
    if event.type == "gpu_recovery_action":
        action = _action(event, cat)
        attrs.append((AttrRecoveryAction, action.name if action is not None else UNKNOWN_ACTION))
        if event.recovery_action is not None:
            attrs.append((AttrRecoveryActionValue, event.recovery_action))
    if event.reason:
        attrs.append((AttrReturnCode, event.reason))
    return attrs


def _where(event: GpuEvent) -> str:
    return f"{event.label} ({event.device_id})"


def body_of(event: GpuEvent, cat: EventCatalogue) -> str:
    """Return the sentence(s) a person reads for ``event``."""
    spec = cat.types[event.type]
    where = _where(event)
    if event.type == "xid":
        xid = cat.xids.get(event.data)
        if event.data == cat.unknown_xid.code:
            return (
                f"Unknown Xid on {where} (NVML's unknown-Xid marker, eventData "
                f"{event.data}): {cat.unknown_xid.meaning}"
            )
        if xid is None:
            return (
                f"Xid {event.data} on {where}: not in gpumetrics' Xid catalogue; see NVIDIA's "
                f"Xid catalog, {XID_CATALOG_URL}"
            )
        return (
            f"Xid {xid.code} on {where}: {xid.description} ({xid.mnemonic}). {xid.meaning} "
            f"NVIDIA's resolution: immediate {xid.immediate_action}, investigatory "
            f"{xid.investigatory_action}."
        )
    if event.type == "gpu_lost":
        return (
            f"GPU {where} is lost: NVML answered {event.reason or 'GPU_IS_LOST'} while the "
            "sidecar waited for its events (fallen off the bus or otherwise inaccessible, as "
            "Xid 79). Its events are read again once it is back and registered anew."
        )
    text = f"{spec.summary.rstrip('.')} on {where}"
    if event.type == "gpu_recovery_action":
        action = _action(event, cat)
        if action is not None:
            return f"{text}: recovery action {action.name}."
        if event.recovery_action is not None:
            return (
                f"{text}: recovery action unknown (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = "
                f"{event.recovery_action}, a value gpumetrics does not know); see nvidia-smi -q."
            )
        return (
            f"{text}: recovery action unknown (reading NVML_FI_DEV_GET_GPU_RECOVERY_ACTION "
            f"answered {event.reason or 'an error'}); see nvidia-smi -q."
        )
    if event.data:
        return f"{text} (eventData {event.data})."
    return text + "."


def render_event(record: logs_pb2.LogRecord, event: GpuEvent, cat: EventCatalogue) -> None:
    """Write ``event`` into ``record`` (see the module docstring for the shape)."""
    spec = cat.types[event.type]
    severity = severity_of(event, cat)
    record.event_name = spec.event_name
    record.severity_number = severity.value  # type: ignore[assignment]
    record.severity_text = severity.name
    if event.time_ns:
        record.time_unix_nano = event.time_ns
    record.observed_time_unix_nano = event.observed_ns
    record.body.string_value = body_of(event, cat)
    encode_attributes(record.attributes, _attributes(event, spec, cat))


def render_summary(
    record: logs_pb2.LogRecord,
    window: Window[GpuEvent],
    now_ns: int,
    window_s: float,
    burst: int,
    cat: EventCatalogue,
) -> None:
    """Write the summary of a storm window that held events back into ``record``.

    It carries the first event's attributes (so the Xid code, the device...) plus the count
    and the times of the first and last event left out; its severity is the first event's.
    """
    event = window.first
    spec = cat.types[event.type]
    severity = severity_of(event, cat)
    record.event_name = cat.types["suppressed"].event_name
    record.severity_number = severity.value  # type: ignore[assignment]
    record.severity_text = severity.name
    record.observed_time_unix_nano = now_ns
    what = f"Xid {event.data}" if event.type == "xid" else f"{event.type} events"
    record.body.string_value = (
        f"{window.suppressed} more identical events were not logged: {what} on "
        f"{_where(event)}, within {window_s:g} s (storm limit: {burst} logged per GPU, kind "
        "and data in that window). Every one is counted in nvidia.gpu.events."
    )
    attrs = _attributes(event, spec, cat) + [
        (AttrSuppressedCount, window.suppressed),
        (AttrSuppressedFirst, _rfc3339(window.first_suppressed_ns)),
        (AttrSuppressedLast, _rfc3339(window.last_suppressed_ns)),
        (AttrWindowS, float(window_s)),
    ]
    encode_attributes(record.attributes, attrs)


def _rfc3339(ns: int) -> str:
    t = dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC)
    return t.isoformat(timespec="microseconds").replace("+00:00", "Z")
