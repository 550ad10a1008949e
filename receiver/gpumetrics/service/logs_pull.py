"""``gpumetrics.v1.LogsPullService/PullLogs``: the log store (GPU events) served to consumers.

The same protocol as ``MetricsPullService/Pull`` (``pull.py``, ``docs/protocol.md``) over a
second :class:`~gpumetrics.store.BatchStore` that holds serialized ``ExportLogsServiceRequest``
batches: its "points" are log records. Differences: an empty log store is answered (empty, with
its epoch), not UNAVAILABLE, since a healthy node may have no event for days; and the store's
``max_data_points`` drop reason is reported as ``max_log_records``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry
from gpumetrics.service.inflight import InflightBudget
from gpumetrics.service.pull import RESERVED_CONSUMERS, StorePull
from gpumetrics.service.settings import DEFAULT_PULL_MAX_BYTES
from gpumetrics.store import BatchStore
from gpumetrics.v1 import logs_pull_pb2, logs_pull_pb2_grpc

_REASONS = {"max_data_points": "max_log_records"}


class LogsPullServicer(logs_pull_pb2_grpc.LogsPullServiceServicer):
    """Serves the log store over ``LogsPullService/PullLogs``.

    Everything but the message shapes is :class:`~gpumetrics.service.pull.StorePull`, the core
    ``MetricsPullService/Pull`` uses too (request checks, the in-flight budget, a failed delivery
    taken back, the consumer's reported outcome).

    Args:
        store: the log store (batches of serialized ``ExportLogsServiceRequest``).
        telemetry: counts ``gpumetrics.pull.rejected_points{consumer, signal=logs}`` (the log
            records consumers report rejected in ``previous_outcome``).
        default_max_bytes: answer size cap when the request says 0 (By).
        max_bytes_limit: upper bound on any requested ``max_bytes`` (By).
        reserved_consumers: consumer names refused with INVALID_ARGUMENT (the push exporter's).
        budget: the server's budget of answers in flight, shared with the metrics servicer.

    """

    def __init__(
        self,
        store: BatchStore,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        default_max_bytes: int = DEFAULT_PULL_MAX_BYTES,
        max_bytes_limit: int | None = None,
        reserved_consumers: Collection[str] = RESERVED_CONSUMERS,
        budget: InflightBudget | None = None,
    ) -> None:
        self._core = StorePull(
            store,
            telemetry,
            default_max_bytes,
            max_bytes_limit,
            reserved_consumers,
            budget,
            signal="logs",
            unit="GPU event records",
            rejected_field="rejected_log_records",
            empty_is_unavailable=False,
        )

    def PullLogs(  # noqa: N802
        self, request: logs_pull_pb2.PullLogsRequest, context: Any
    ) -> logs_pull_pb2.PullLogsResponse:
        """Acknowledge, then answer with the log batches after the read position."""
        result = self._core.serve(context, request, max_points=request.max_log_records)
        return logs_pull_pb2.PullLogsResponse(
            export_logs_service_request=result.data,
            epoch=result.epoch,
            first_sequence=result.first_sequence,
            last_sequence=result.last_sequence,
            more=result.more,
            log_records=result.data_points,
            dropped_log_records=result.dropped_data_points,
            dropped_log_records_total=result.dropped_data_points_total,
            drop_reasons=[_REASONS.get(r, r) for r in result.drop_reasons],
        )
