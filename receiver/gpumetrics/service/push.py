"""Push mode: export the batch store's content to a collector with OTLP ``MetricsService.Export``.

The same exporter pushes the log store of GPU events with OTLP ``LogsService.Export``
(``signal=LOGS``): only the stub, the request message and the partial-success field differ.

The exporter is one more consumer of the :class:`~gpumetrics.store.BatchStore` (named ``push``):
it pulls what the store holds after its cursor, exports it, and acknowledges a batch only after
the collector accepted it, so a collector outage loses nothing until the store's own limits
(which count every dropped point) force data out.

Retry follows the OpenTelemetry Python OTLP gRPC exporter (``exporter/opentelemetry-exporter-otlp-
proto-grpc``, ``exporter.py``) and the OTLP specification's failure rules
(https://opentelemetry.io/docs/specs/otlp/#failures):

* retryable codes: :data:`RETRYABLE_CODES`, plus ``RESOURCE_EXHAUSTED`` only when the server
  attached ``google.rpc.RetryInfo``; anything else is permanent;
* at most :data:`MAX_ATTEMPTS` attempts sharing **one deadline** (``timeout_s``) per export;
* back-off ``initial_backoff_s * 2**n`` with ±20 % jitter, or the server's ``RetryInfo`` delay;
  it gives up when the next wait would pass the deadline;
* the back-off wait is interruptible by :meth:`PushExporter.shutdown`;
* a populated ``partial_success`` is never retried: its ``rejected_data_points`` are counted
  (``gpumetrics.push.points{outcome=rejected}``) and the rest as sent.

Outcome → store: accepted (fully or partially) and permanently refused batches are
acknowledged (the collector answered for good; refused points are counted as ``failed``);
batches whose retryable failures outlasted the deadline are **not** acknowledged and are sent
again on the next cycle, which then starts after ``initial_backoff_s`` instead of a whole
``interval_s``.

Reconnecting: grpcio's default reconnect back-off (1 s, ×1.6, up to 120 s) let delivery resume
6–18 s after a collector came back. The channel's back-off is bounded to
:data:`MAX_RECONNECT_BACKOFF_MS`, and every export is sent ``wait_for_ready``: during an outage
it waits for the connection (within its deadline) instead of failing at once, so the export in
progress when the collector returns goes through as soon as the channel has reconnected, within
about a second. :meth:`PushExporter.shutdown` cancels an export that is waiting.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from google.rpc import error_details_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

from gpumetrics.logs import LogOnce
from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry
from gpumetrics.service.push_settings import PushSettings

__all__ = [
    "LOGS",
    "MAX_ATTEMPTS",
    "METRICS",
    "PUSH_CONSUMER",
    "RETRYABLE_CODES",
    "ExportResult",
    "PushExporter",
    "PushSettings",
    "Signal",
    "retry_delay_s",
]

log = logging.getLogger(__name__)

PUSH_CONSUMER = "push"
"""The store consumer name of the push exporter."""

RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
"""gRPC codes retried without condition (OTLP specification, "Failures" of the gRPC transport)."""

MAX_ATTEMPTS = 6
"""Attempts per export, all within one deadline (as the OpenTelemetry Python exporter)."""

INITIAL_RECONNECT_BACKOFF_MS = 100
"""First reconnect back-off of the push channel (ms; grpcio's default is 1000)."""

MAX_RECONNECT_BACKOFF_MS = 1000
"""Largest reconnect back-off of the push channel (ms; grpcio's default is 120,000): a
collector that comes back is reconnected to within about a second."""

CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", INITIAL_RECONNECT_BACKOFF_MS),
    ("grpc.min_reconnect_backoff_ms", INITIAL_RECONNECT_BACKOFF_MS),
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
)
"""Options of :func:`open_channel` (gRPC core channel arguments, ``grpc_types.h``)."""

_RETRY_INFO_KEY = "google.rpc.retryinfo-bin"


@dataclass(frozen=True)
class Signal:
    """What differs between pushing metrics and pushing logs.

    Attributes:
        name: ``metrics`` or ``logs`` (for log messages).
        stub: builds the OTLP service stub on a channel.
        parse: parses a serialized export request (a store batch).
        rejected_field: the ``partial_success`` field counting rejected items.
        items: what the store counts, in log messages (``data points``, ``log records``).

    """

    name: str
    stub: Callable[[grpc.Channel], Any]
    parse: Callable[[bytes], Any]
    rejected_field: str
    items: str


METRICS = Signal(
    "metrics",
    metrics_service_pb2_grpc.MetricsServiceStub,
    metrics_service_pb2.ExportMetricsServiceRequest.FromString,
    "rejected_data_points",
    "data points",
)
"""OTLP ``MetricsService.Export`` of the metric store."""

LOGS = Signal(
    "logs",
    logs_service_pb2_grpc.LogsServiceStub,
    logs_service_pb2.ExportLogsServiceRequest.FromString,
    "rejected_log_records",
    "log records",
)
"""OTLP ``LogsService.Export`` of the log store (GPU events)."""


class ExportResult(enum.Enum):
    """Outcome of exporting one request."""

    SENT = "sent"
    PARTIAL = "partial"
    REFUSED = "refused"
    """A permanent (non-retryable) error: the data is acknowledged and counted as failed."""
    RETRY_LATER = "retry_later"
    """Retryable errors outlasted the deadline or shutdown interrupted: not acknowledged."""


class Store(Protocol):
    """The part of :class:`~gpumetrics.store.BatchStore` the exporter uses."""

    def pull(
        self,
        consumer: str,
        ack_sequence: int = 0,
        ack_epoch: str = "",
        max_points: int = 0,
        max_bytes: int = 0,
        ack_only: bool = False,
    ) -> Any:
        """See :meth:`gpumetrics.store.BatchStore.pull`."""


def retry_delay_s(error: grpc.RpcError) -> float | None:
    """Return the delay (s) of a ``google.rpc.RetryInfo`` in the error's trailers, or None."""
    trailing = getattr(error, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key == _RETRY_INFO_KEY and isinstance(value, bytes):
            info = error_details_pb2.RetryInfo.FromString(value)
            return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return None


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def open_channel(settings: PushSettings) -> grpc.Channel:
    """Open the channel to ``settings.endpoint`` (TLS unless ``insecure``).

    Raises:
        OSError: a certificate file cannot be read.
        ValueError: ``endpoint`` is unset.

    """
    if settings.endpoint is None:
        raise ValueError("push.endpoint: not set")
    options = list(CHANNEL_OPTIONS)
    if settings.insecure:
        return grpc.insecure_channel(settings.endpoint, options=options)
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(settings.ca_file),
        private_key=_read(settings.key_file),
        certificate_chain=_read(settings.cert_file),
    )
    return grpc.secure_channel(settings.endpoint, creds, options=options)


class PushExporter:
    """Drains the store to a collector; one store consumer named :data:`PUSH_CONSUMER`.

    Args:
        store: the batch store.
        settings: push settings (``endpoint`` must be set).
        channel: a ready channel (tests); default :func:`open_channel`.
        telemetry: records ``gpumetrics.push.points{outcome}``.
        clock: monotonic seconds, for the export deadline.
        jitter: factor applied to each computed back-off (default uniform 0.8–1.2).
        wait: ``wait(seconds) -> bool`` for back-off and the export interval; True means
            "shutdown requested". Default: the exporter's own stop event.
        signal: :data:`METRICS` (the metric store) or :data:`LOGS` (the log store).

    Thread model: :meth:`start` runs :meth:`export_pending` every ``interval_s`` on one thread;
    :meth:`shutdown` interrupts any back-off, joins that thread, then flushes once more.

    """

    def __init__(
        self,
        store: Store,
        settings: PushSettings,
        channel: grpc.Channel | None = None,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2),
        wait: Callable[[float], bool] | None = None,
        signal: Signal = METRICS,
    ) -> None:
        self._store = store
        self._settings = settings
        self._signal = signal
        self._channel = channel if channel is not None else open_channel(settings)
        self._stub = signal.stub(self._channel)
        self._telemetry = telemetry
        self._clock = clock
        self._jitter = jitter
        self._stop = threading.Event()
        self._wait = wait if wait is not None else self._stop.wait
        self._metadata = tuple((k.lower(), v) for k, v in settings.headers.items())
        self._compression = grpc.Compression.Gzip if settings.compression == "gzip" else None
        self._acked = 0
        self._epoch = ""
        self._once = LogOnce(log, repeat_after_s=300.0, clock=clock)
        self._thread: threading.Thread | None = None
        self._inflight_lock = threading.Lock()
        self._inflight: Any = None  # the export future waiting now
        self._interrupt = False  # shutdown in progress: cancel what the thread sends

    def export_pending(
        self, max_rounds: int = 1000, until: float | None = None
    ) -> list[ExportResult]:
        """Export what the store holds for ``push``, in capped requests; return each outcome.

        Stops early at the first :attr:`ExportResult.RETRY_LATER` (nothing later is acknowledged
        ahead of it), after ``max_rounds`` requests, or at ``until`` (``clock`` seconds), which
        also caps each export's deadline.
        """
        results: list[ExportResult] = []
        for _ in range(max_rounds):
            if until is not None and self._clock() >= until:
                break
            res = self._store.pull(
                PUSH_CONSUMER,
                self._acked,
                self._epoch,
                self._settings.max_points_per_export,
                self._settings.max_bytes_per_export,
            )
            if res.epoch != self._epoch:
                self._epoch, self._acked = res.epoch, 0
            if res.dropped_data_points:
                log.warning(
                    "push: the %s store dropped %d %s before they could be exported (%s)",
                    self._signal.name,
                    res.dropped_data_points,
                    self._signal.items,
                    ", ".join(res.drop_reasons),
                )
            if not res.parts:
                break
            result = self.export(res.data, res.data_points, until)
            results.append(result)
            if result is ExportResult.RETRY_LATER:
                break
            self._acked = res.last_sequence
            self._store.pull(PUSH_CONSUMER, self._acked, self._epoch, ack_only=True)
            if not res.more:
                break
        return results

    def export(self, data: bytes, points: int, until: float | None = None) -> ExportResult:
        """Export one serialized ``ExportMetricsServiceRequest`` of ``points`` points, with retry.

        The deadline is ``timeout_s`` from now, or ``until`` (``clock`` seconds) if earlier.
        """
        request = self._signal.parse(data)
        deadline = self._clock() + self._settings.timeout_s
        if until is not None:
            deadline = min(deadline, until)
        for attempt in range(MAX_ATTEMPTS):
            remaining = deadline - self._clock()
            if remaining <= 0:
                break
            try:
                response = self._send(request, remaining)
            except grpc.FutureCancelledError:
                # shutdown closed the channel under an export in flight: a normal end, and the
                # data stays unacknowledged, as for any export that did not finish
                log.debug("push: %s export cancelled by shutdown", self._signal.name)
                return ExportResult.RETRY_LATER
            except grpc.RpcError as err:
                code = (
                    err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
                )
                delay = retry_delay_s(err)
                if not (
                    code in RETRYABLE_CODES
                    or (code is grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None)
                ):
                    log.error(
                        "push: %s export refused with %s (%s); %d %s dropped",
                        self._signal.name,
                        code.name,
                        _details(err),
                        points,
                        self._signal.items,
                    )
                    self._telemetry.add("gpumetrics.push.points", points, {"outcome": "failed"})
                    return ExportResult.REFUSED
                backoff = (
                    delay
                    if delay is not None
                    else self._settings.initial_backoff_s * 2**attempt * self._jitter()
                )
                if attempt + 1 == MAX_ATTEMPTS or backoff > deadline - self._clock():
                    self._once.log(
                        logging.ERROR,
                        "give-up",
                        "push: export to %s (push.endpoint) failed with %s (%s); "
                        "the data stays in the store and is retried later",
                        self._settings.endpoint,
                        code.name,
                        _details(err),
                    )
                    break
                log.warning(
                    "push: transient %s (%s), retrying in %.2fs", code.name, _details(err), backoff
                )
                if self._stop.is_set() or self._wait(backoff):
                    break
                continue
            self._once.reset("give-up")
            return self._accepted(response, points)
        return ExportResult.RETRY_LATER

    def _send(self, request: Any, timeout: float) -> Any:
        """One Export attempt; waits for the connection (``wait_for_ready``) within ``timeout``."""
        call = self._stub.Export.future(
            request,
            timeout=timeout,
            metadata=self._metadata,
            compression=self._compression,
            wait_for_ready=True,
        )
        with self._inflight_lock:
            if self._interrupt and threading.current_thread() is self._thread:
                call.cancel()
            self._inflight = call
        try:
            return call.result()
        finally:
            with self._inflight_lock:
                self._inflight = None

    def _accepted(self, response: Any, points: int) -> ExportResult:
        partial = response.partial_success
        rejected = max(0, getattr(partial, self._signal.rejected_field))
        if rejected or partial.error_message:
            log.warning(
                "push: collector rejected %d of %d %s: %s",
                rejected,
                points,
                self._signal.items,
                partial.error_message or "(no message)",
            )
            if rejected:
                self._telemetry.add("gpumetrics.push.points", rejected, {"outcome": "rejected"})
            self._telemetry.add(
                "gpumetrics.push.points", max(0, points - rejected), {"outcome": "sent"}
            )
            return ExportResult.PARTIAL
        self._telemetry.add("gpumetrics.push.points", points, {"outcome": "sent"})
        return ExportResult.SENT

    def start(self) -> None:
        """Start the export thread (every ``interval_s``, until :meth:`shutdown`)."""
        name = (
            "gpumetrics-push" if self._signal is METRICS else f"gpumetrics-push-{self._signal.name}"
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pause = self._settings.interval_s
        while not self._stop.is_set() and not self._wait(pause):
            pause = self._settings.interval_s
            try:
                if ExportResult.RETRY_LATER in self.export_pending():
                    # the collector is away or refusing: try again soon, not a whole interval
                    # later (an export waits for the connection itself, within its deadline)
                    pause = min(pause, self._settings.initial_backoff_s)
            except Exception:  # noqa: BLE001 - keep exporting; the failure is logged
                log.exception("push: export cycle failed")

    def shutdown(self, flush_timeout_s: float = 5.0) -> list[ExportResult]:
        """Interrupt back-off, join the thread, flush once (no back-off), close the channel.

        The flush is bounded by ``flush_timeout_s`` and by each export's own deadline; what it
        cannot deliver stays unacknowledged.
        """
        self._stop.set()
        with self._inflight_lock:
            self._interrupt = True
            if self._inflight is not None:
                self._inflight.cancel()  # an export waiting for a collector that is away
        if self._thread is not None:
            self._thread.join(flush_timeout_s)
        results: list[ExportResult] = []
        if self._thread is None or not self._thread.is_alive():
            results = self.export_pending(max_rounds=100, until=self._clock() + flush_timeout_s)
        self._channel.close()
        return results


def _details(err: grpc.RpcError) -> str:
    details = getattr(err, "details", None)
    return str(details() if callable(details) else err)
