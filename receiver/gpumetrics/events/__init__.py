"""GPU events as OTLP logs: the event catalogue, the storm limit, rendering and batching.

No NVML here (the listener is ``gpumetrics.nvml.events``) and no gRPC (the log store is a
``gpumetrics.store.BatchStore``, served by ``gpumetrics.service.logs_pull``). See
``docs/events.md``.
"""

from gpumetrics.events.catalogue import (
    EventCatalogue,
    EventTypeSpec,
    Severity,
    XidSpec,
    event_catalogue,
)
from gpumetrics.events.model import INSTANCE_ID_ANY, EventSink, EventTotal, GpuEvent
from gpumetrics.events.producer import EventProducer, count_log_records
from gpumetrics.events.settings import EventSettings, default_event_types
from gpumetrics.events.storm import StormLimiter

__all__ = [
    "INSTANCE_ID_ANY",
    "EventCatalogue",
    "EventProducer",
    "EventSettings",
    "EventSink",
    "EventTotal",
    "EventTypeSpec",
    "GpuEvent",
    "Severity",
    "StormLimiter",
    "XidSpec",
    "count_log_records",
    "default_event_types",
    "event_catalogue",
]
