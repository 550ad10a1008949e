"""``gpumetrics.v1.LogsPullService/PullLogs``: the log store (GPU events) served to consumers.

The same protocol as ``MetricsPullService/Pull`` (``pull.py``, ``docs/protocol.md``) over a
second :class:`~gpumetrics.store.BatchStore` that holds serialized ``ExportLogsServiceRequest``
batches: its "points" are log records. Differences: an empty log store is answered (empty, with
its epoch), not UNAVAILABLE, since a healthy node may have no event for days; and the store's
``max_data_points`` drop reason is reported as ``max_log_records``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import grpc

from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry
from gpumetrics.service.pull import DEFAULT_PULL_MAX_BYTES, RESERVED_CONSUMERS
from gpumetrics.store import BatchStore, TooManyConsumersError, validate_consumer
from gpumetrics.v1 import logs_pull_pb2, logs_pull_pb2_grpc

log = logging.getLogger(__name__)

_REASONS = {"max_data_points": "max_log_records"}


class LogsPullServicer(logs_pull_pb2_grpc.LogsPullServiceServicer):
    """Serves the log store over ``LogsPullService/PullLogs``.

    Args:
        store: the log store (batches of serialized ``ExportLogsServiceRequest``).
        telemetry: counts ``gpumetrics.pull.rejected_points{consumer, signal=logs}`` (the log
            records consumers report rejected in ``previous_outcome``).
        default_max_bytes: answer size cap when the request says 0 (By).
        max_bytes_limit: upper bound on any requested ``max_bytes`` (By).
        reserved_consumers: consumer names refused with INVALID_ARGUMENT (the push exporter's).

    """

    def __init__(
        self,
        store: BatchStore,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        default_max_bytes: int = DEFAULT_PULL_MAX_BYTES,
        max_bytes_limit: int | None = None,
        reserved_consumers: Collection[str] = RESERVED_CONSUMERS,
    ) -> None:
        self._store = store
        self._telemetry = telemetry
        self._default_max_bytes = default_max_bytes
        self._max_bytes_limit = max_bytes_limit or default_max_bytes
        self._reserved = frozenset(reserved_consumers)

    def PullLogs(  # noqa: N802
        self, request: logs_pull_pb2.PullLogsRequest, context: Any
    ) -> logs_pull_pb2.PullLogsResponse:
        """Acknowledge, then answer with the log batches after the read position."""
        try:
            consumer = validate_consumer(request.consumer)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if consumer in self._reserved:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"consumer: {consumer!r} is reserved for the sidecar's own exporter",
            )
        outcome = request.previous_outcome
        if outcome.rejected_log_records < 0:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "previous_outcome.rejected_log_records: must be >= 0, "
                f"got {outcome.rejected_log_records}",
            )
        max_bytes = min(request.max_bytes or self._default_max_bytes, self._max_bytes_limit)
        try:
            result = self._store.pull(
                consumer,
                ack_sequence=request.ack_sequence,
                ack_epoch=request.ack_epoch,
                max_points=request.max_log_records,
                max_bytes=max_bytes,
                ack_only=request.ack_only,
                read_after_sequence=request.read_after_sequence,
            )
        except TooManyConsumersError as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        reasons = [_REASONS.get(r, r) for r in result.drop_reasons]
        self._record_outcome(consumer, outcome)
        if result.dropped_data_points:
            log.warning(
                "consumer %r lost %d GPU event records before acknowledging them (log store "
                "limits: %s)",
                consumer,
                result.dropped_data_points,
                ", ".join(reasons),
            )
        return logs_pull_pb2.PullLogsResponse(
            export_logs_service_request=result.data,
            epoch=result.epoch,
            first_sequence=result.first_sequence,
            last_sequence=result.last_sequence,
            more=result.more,
            log_records=result.data_points,
            dropped_log_records=result.dropped_data_points,
            dropped_log_records_total=result.dropped_data_points_total,
            drop_reasons=reasons,
        )

    def _record_outcome(self, consumer: str, outcome: logs_pull_pb2.LogsPreviousOutcome) -> None:
        if outcome.rejected_log_records > 0:
            self._telemetry.add(
                "gpumetrics.pull.rejected_points",
                outcome.rejected_log_records,
                {"consumer": consumer, "signal": "logs"},
            )
            log.warning(
                "consumer %r: its logs pipeline rejected %d records of the answer ending at "
                "sequence %d: %r",
                consumer,
                outcome.rejected_log_records,
                outcome.last_sequence,
                outcome.error_message[:512],
            )
        elif outcome.error_message:
            log.info(
                "consumer %r reported a warning for the log answer ending at sequence %d: %r",
                consumer,
                outcome.last_sequence,
                outcome.error_message[:512],
            )
