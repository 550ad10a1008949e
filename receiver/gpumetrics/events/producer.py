"""The :class:`EventProducer`: counts GPU events, limits storms, and batches OTLP log records.

It is the logs-side counterpart of ``metrics.Producer``. The listener calls :meth:`record` from
its thread; the collector reads :meth:`totals` to emit the ``nvidia.gpu.events`` counter with
each cycle; the batcher calls :meth:`collect` (or :meth:`flush_to`) every batch interval to
drain the queued records into one ``ExportLogsServiceRequest`` on the host resource.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

from gpumetrics.events.catalogue import EventCatalogue, event_catalogue
from gpumetrics.events.model import EventTotal, GpuEvent
from gpumetrics.events.render import render_event, render_summary
from gpumetrics.events.settings import EventSettings
from gpumetrics.events.storm import Admission, StormLimiter, Window
from gpumetrics.metrics import names
from gpumetrics.metrics.encode import encode_attributes
from gpumetrics.metrics.spec import Scope, catalogue
from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry

__all__ = ["EventProducer", "LogStore", "count_log_records"]

SUPPRESSED = "gpumetrics.events.suppressed"
MAX_SERIES = 4096
"""Counter series (device × type × Xid code) tracked; later Xid codes count without a code."""


class LogStore(Protocol):
    """What :meth:`EventProducer.flush_to` appends to (``BatchStore.append``)."""

    def append(self, request: Any) -> int:
        """Append one ``ExportLogsServiceRequest``; return the sequence of its last batch.

        The log store serializes it resource by resource and splits, by log records, what does
        not fit one batch, from the message itself (no serialized copy parsed back).
        """


def count_log_records(request: Any) -> int:
    """Return the number of LogRecords in an ``ExportLogsServiceRequest``."""
    return sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)


class EventProducer:
    """Counts events per device, applies the storm limit and renders queued log records.

    Args:
        settings: storm limit and queue bound (``events`` section).
        host_attributes: attributes of the host resource (the metrics' host resource, so logs
            and metrics of a GPU sit on one resource).
        telemetry: ``gpumetrics.events.suppressed{nvidia.gpu.event.type, reason}``.
        clock_ns: wall clock, Unix-epoch ns (window ends and summary times).
        scope: instrumentation scope of the records (default: the GPU metrics' scope).
        catalogue: the event catalogue (default: the shipped one).

    Thread-safe: one lock; rendering happens in :meth:`collect`, outside the listener's path.

    """

    def __init__(
        self,
        settings: EventSettings,
        host_attributes: Mapping[str, Any] | None = None,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        clock_ns: Callable[[], int] = time.time_ns,
        scope: Scope | None = None,
        catalogue: EventCatalogue | None = None,
    ) -> None:
        self._settings = settings
        self._host = dict(host_attributes or {})
        self._telemetry = telemetry
        self._clock_ns = clock_ns
        self._scope = scope or _metrics_scope()
        self._cat = catalogue or event_catalogue()
        self._storm: StormLimiter[GpuEvent] = StormLimiter(
            settings.storm_burst, settings.storm_window_s
        )
        self._lock = threading.Lock()
        self._queue: list[GpuEvent | Window[GpuEvent]] = []
        self._counts: dict[tuple[str, str, int | None], int] = {}
        self._started: dict[str, int] = {}

    # -- the listener's side -------------------------------------------------------------------
    def listening(self, device_id: str, now_ns: int) -> None:
        """Start counting ``device_id``'s events at ``now_ns`` (kept across re-registrations)."""
        with self._lock:
            self._started.setdefault(device_id, now_ns)

    def record(self, event: GpuEvent) -> None:
        """Count ``event``; queue its record unless the storm limit or the queue bound hold it."""
        with self._lock:
            self._count(event)
            key = (event.device_id, event.type, event.data, event.recovery_action)
            verdict, closed = self._storm.admit(key, event, event.observed_ns)
            if closed is not None:
                self._enqueue(closed, event.type)
            if verdict == Admission.LOG:
                self._enqueue(event, event.type)
            else:
                self._suppressed(event.type, verdict)

    def _count(self, event: GpuEvent) -> None:
        self._started.setdefault(event.device_id, event.observed_ns)
        code = event.data if event.type == "xid" else None
        key = (event.device_id, event.type, code)
        if key not in self._counts and len(self._counts) >= MAX_SERIES:
            key = (event.device_id, event.type, None)
        self._counts[key] = self._counts.get(key, 0) + 1

    def _enqueue(self, item: GpuEvent | Window[GpuEvent], event_type: str) -> None:
        if len(self._queue) >= self._settings.max_queued_records:
            self._suppressed(event_type, "queue_full")
            return
        self._queue.append(item)

    def _suppressed(self, event_type: str, reason: str) -> None:
        attrs = {names.AttrEventType: event_type, "reason": reason}
        self._telemetry.add(SUPPRESSED, 1, attrs)

    # -- the collector's side ------------------------------------------------------------------
    def totals(self, device_id: str) -> list[EventTotal]:
        """Return ``device_id``'s ``nvidia.gpu.events`` series (type, and code for xid)."""
        with self._lock:
            start = self._started.get(device_id)
            if start is None:
                return []
            out = []
            for (dev, event_type, code), value in self._counts.items():
                if dev != device_id:
                    continue
                attrs: tuple[tuple[str, Any], ...] = ((names.AttrEventType, event_type),)
                if code is not None:
                    attrs += ((names.AttrXidCode, code),)
                out.append(EventTotal(attrs, value, start))
            return out

    # -- the batcher's side --------------------------------------------------------------------
    def queued(self) -> int:
        """Return how many records wait for the next batch."""
        with self._lock:
            return len(self._queue)

    def collect(self, final: bool = False) -> logs_service_pb2.ExportLogsServiceRequest:
        """Drain the queued records (and the summaries of storm windows that ended).

        Args:
            final: close every storm window (at shutdown), so no suppressed count is lost.

        Returns:
            One request with one ``ResourceLogs`` (the host resource) and one ``ScopeLogs``, or
            an empty request when there is nothing to send.

        """
        now = self._clock_ns()
        with self._lock:
            for window in self._storm.close_expired(now, everything=final):
                self._enqueue(window, window.first.type)
            queue, self._queue = self._queue, []
        req = logs_service_pb2.ExportLogsServiceRequest()
        if not queue:
            return req
        rl = req.resource_logs.add()
        encode_attributes(rl.resource.attributes, self._host.items())
        sl = rl.scope_logs.add()
        sl.scope.name = self._scope.name
        if self._scope.schema_url:
            sl.schema_url = self._scope.schema_url
        s = self._settings
        for item in queue:
            if isinstance(item, Window):
                render_summary(
                    sl.log_records.add(), item, now, s.storm_window_s, s.storm_burst, self._cat
                )
            else:
                render_event(sl.log_records.add(), item, self._cat)
        return req

    def flush_to(self, store: LogStore, final: bool = False) -> int | None:
        """Collect and append the result to ``store``; return its sequence (None: nothing)."""
        req = self.collect(final)
        if not count_log_records(req):
            return None
        return store.append(req)


def _metrics_scope() -> Scope:
    return catalogue().scope
