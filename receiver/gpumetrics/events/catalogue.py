"""The event catalogue (``catalogue.yaml``): event types, Xid meanings, recovery actions.

Every GPU event the sidecar emits is described here, as every metric is in
``metrics/catalogue.yaml``: its event name, severity and one-line summary; the Xid table gives
NVIDIA's mnemonic, description and resolution buckets for each known code (sources in the YAML
file's header). ``docs/events.md`` shows the same tables (``python -m gpumetrics.events.docs``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

__all__ = [
    "EventCatalogue",
    "EventTypeSpec",
    "RecoveryAction",
    "Severity",
    "UnknownXid",
    "XidSpec",
    "event_catalogue",
    "parse_event_catalogue",
]


class Severity(enum.Enum):
    """OTLP log severities used here: ``SeverityNumber`` and the short ``severity_text``.

    The numbers are the first of each range of the OpenTelemetry logs data model
    (https://opentelemetry.io/docs/specs/otel/logs/data-model/#field-severitynumber).
    """

    TRACE = 1
    DEBUG = 5
    INFO = 9
    WARN = 13
    ERROR = 17
    FATAL = 21


@dataclass(frozen=True)
class EventTypeSpec:
    """One kind of event.

    Attributes:
        type: short name (``xid``, ``double_bit_ecc``, ``gpu_lost``...): the
            ``nvidia.gpu.event.type`` attribute and the ``events.types`` setting.
        event_name: the LogRecord's ``event_name`` (``nvidia.gpu.xid``).
        severity: a fixed severity, or None when it comes from the Xid table (``xid``), the
            recovery action (``gpu_recovery_action``) or the suppressed event (``suppressed``).
        severity_rule: ``fixed``, ``xid``, ``recovery_action`` or ``inherited``.
        nvml: the NVML constant (``nvmlEventTypeXidCriticalError``), "" for derived events.
        bit: the NVML event type bit, 0 for derived events.
        default: registered unless ``events.types`` says otherwise.
        summary: one line for bodies and docs.

    """

    type: str
    event_name: str
    severity: Severity | None
    severity_rule: str
    nvml: str
    bit: int
    default: bool
    summary: str

    @property
    def from_nvml(self) -> bool:
        """True for NVML event types (False for events the sidecar derives)."""
        return self.bit != 0


@dataclass(frozen=True)
class XidSpec:
    """What one Xid means (NVIDIA's Xid catalog).

    Attributes:
        code: the Xid number.
        mnemonic: its name in the driver's ``nverror.h`` (``ROBUST_CHANNEL_GPU_ECC_DBE``).
        description: NVIDIA's description (``Double Bit ECC Error``).
        immediate_action: the catalog's immediate resolution bucket (``RESET_GPU``...).
        investigatory_action: the catalog's investigatory resolution bucket.
        severity: derived from the immediate action (rule in ``catalogue.yaml``).
        meaning: a sentence for people: what happened and what to do.

    """

    code: int
    mnemonic: str
    description: str
    immediate_action: str
    investigatory_action: str
    severity: Severity
    meaning: str


@dataclass(frozen=True)
class RecoveryAction:
    """A value of ``nvmlDeviceGpuRecoveryAction_t``: its name and the severity it carries."""

    value: int
    name: str
    severity: Severity


@dataclass(frozen=True)
class UnknownXid:
    """NVML's marker for an Xid the driver could not identify (``eventData`` 999, nvml.h).

    Attributes:
        code: the marker (999).
        description: what the ``nvidia.gpu.xid.description`` attribute says.
        severity: the record's severity.
        meaning: a sentence for people: what it is and where the real Xid is.

    """

    code: int
    description: str
    severity: Severity
    meaning: str


@dataclass(frozen=True)
class EventCatalogue:
    """The parsed ``catalogue.yaml``."""

    types: Mapping[str, EventTypeSpec]
    xids: Mapping[int, XidSpec]
    recovery_actions: Mapping[int, RecoveryAction]
    unknown_xid: UnknownXid

    def by_bit(self, bit: int) -> EventTypeSpec | None:
        """Return the NVML event type with ``bit``, or None."""
        for spec in self.types.values():
            if spec.bit == bit:
                return spec
        return None

    @property
    def nvml_types(self) -> list[EventTypeSpec]:
        """The NVML event types (not the derived ones), in catalogue order."""
        return [s for s in self.types.values() if s.from_nvml]


_RULES = ("xid", "recovery_action", "inherited")


def _severity(value: Any, where: str) -> Severity:
    try:
        return Severity[str(value)]
    except KeyError:
        raise ValueError(f"{where}: unknown severity {value!r}") from None


def _type(raw: Mapping[str, Any], where: str) -> EventTypeSpec:
    rule = str(raw["severity"])
    derived = raw.get("source") == "sidecar"
    return EventTypeSpec(
        type=str(raw["type"]),
        event_name=str(raw["event_name"]),
        severity=None if rule in _RULES else _severity(rule, f"{where}.severity"),
        severity_rule=rule if rule in _RULES else "fixed",
        nvml="" if derived else str(raw["nvml"]),
        bit=0 if derived else int(raw["bit"]),
        default=bool(raw["default"]),
        summary=str(raw["summary"]),
    )


def parse_event_catalogue(text: str) -> EventCatalogue:
    """Parse the catalogue YAML text.

    Raises:
        ValueError: naming the entry (``xids[3].severity: ...``) when it is malformed or
            repeated.

    """
    doc = yaml.safe_load(text)
    types: dict[str, EventTypeSpec] = {}
    xids: dict[int, XidSpec] = {}
    actions: dict[int, RecoveryAction] = {}
    try:
        for i, raw in enumerate(doc["event_types"]):
            spec = _type(raw, f"event_types[{i}]")
            if spec.type in types:
                raise ValueError(f"event_types[{i}].type: duplicate {spec.type!r}")
            types[spec.type] = spec
        for i, raw in enumerate(doc["xids"]):
            code = int(raw["code"])
            if code in xids:
                raise ValueError(f"xids[{i}].code: duplicate Xid {code}")
            xids[code] = XidSpec(
                code=code,
                mnemonic=str(raw["mnemonic"]),
                description=str(raw["description"]),
                immediate_action=str(raw["immediate_action"]),
                investigatory_action=str(raw["investigatory_action"]),
                severity=_severity(raw["severity"], f"xids[{i}].severity"),
                meaning=str(raw["meaning"]),
            )
        for i, raw in enumerate(doc["recovery_actions"]):
            value = int(raw["value"])
            actions[value] = RecoveryAction(
                value, str(raw["name"]), _severity(raw["severity"], f"recovery_actions[{i}]")
            )
        raw = doc["unknown_xid"]
        unknown = UnknownXid(
            code=int(raw["code"]),
            description=str(raw["description"]),
            severity=_severity(raw["severity"], "unknown_xid.severity"),
            meaning=str(raw["meaning"]),
        )
        if unknown.code in xids:
            raise ValueError(f"unknown_xid.code: Xid {unknown.code} is also in xids")
    except (KeyError, TypeError) as exc:
        raise ValueError(f"event catalogue: missing or malformed field {exc}") from None
    return EventCatalogue(types, xids, actions, unknown)


@cache
def event_catalogue() -> EventCatalogue:
    """Return the catalogue shipped with the package (parsed once)."""
    text = resources.files("gpumetrics.events").joinpath("catalogue.yaml").read_text("utf-8")
    return parse_event_catalogue(text)
