"""GPU event settings (YAML section ``events``): what to listen for, the storm limit, the log store.

Every default is on its field and in ``docs/configuration.md``; errors name the field
(``events.types[2]: unknown event type 'xidd'; known: ...``).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from gpumetrics.events.catalogue import event_catalogue
from gpumetrics.settingsbase import SettingsModel

__all__ = ["EventSettings", "default_event_types"]

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
"""Default ``events.max_bytes``: 16 MiB of serialized OTLP logs (~16,000 records of ~1 KiB)."""

DEFAULT_MAX_LOG_RECORDS = 50_000
"""Default ``events.max_log_records`` held in the log store."""


def default_event_types() -> tuple[str, ...]:
    """Return the NVML event types registered by default (the catalogue's ``default: true``)."""
    return tuple(s.type for s in event_catalogue().nvml_types if s.default)


class EventSettings(SettingsModel):
    """How GPU events are collected, limited and kept.

    Attributes:
        enabled: listen for NVML events at all (one listener thread per NVML session).
        types: NVML event types to register (catalogue names); each GPU is registered for those
            it supports (``nvmlDeviceGetSupportedEventTypes``). Default: every type but ``pstate``
            and ``clock``, which change often and are visible as metrics.
        wait_timeout_s: the longest one ``nvmlEventSetWait_v2`` blocks (s). Bounds how long
            stopping or re-registering waits for the listener; events arrive at once anyway.
        storm_burst: identical events logged per storm window (``events/storm.py``).
        storm_window_s: the storm window (s).
        max_queued_records: log records waiting for the next batch; beyond it new records are
            counted (``gpumetrics.events.suppressed{reason=queue_full}``) and not logged.
        max_bytes: serialized bytes the log store holds (By).
        max_log_records: log records the log store holds.
        max_age_s: oldest log batch kept (s).

    The log store's consumer limits (``consumer_ttl_s``, ``max_consumers``) are the metric
    store's (``store.*``).

    """

    enabled: bool = True
    types: tuple[str, ...] = Field(default_factory=default_event_types)
    wait_timeout_s: float = Field(default=0.5, ge=0.01, le=10.0)
    storm_burst: int = Field(default=10, ge=1, le=100_000)
    storm_window_s: float = Field(default=60.0, gt=0, le=86_400)
    max_queued_records: int = Field(default=10_000, ge=1)
    max_bytes: int = Field(default=DEFAULT_MAX_BYTES, gt=0)
    max_log_records: int = Field(default=DEFAULT_MAX_LOG_RECORDS, gt=0)
    max_age_s: float = Field(default=900.0, gt=0)

    @field_validator("types", mode="before")
    @classmethod
    def _known_types(cls, value: object) -> object:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ValueError("must be a list of event type names")
        known = [s.type for s in event_catalogue().nvml_types]
        for i, name in enumerate(value):
            if name not in known:
                raise ValueError(f"[{i}]: unknown event type {name!r}; known: {', '.join(known)}")
        if len(set(value)) != len(value):
            raise ValueError("an event type is listed twice")
        return tuple(value)

    def mask(self) -> int:
        """Return the NVML event type bits of ``types``, ORed."""
        types = event_catalogue().types
        out = 0
        for name in self.types:
            out |= types[name].bit
        return out
