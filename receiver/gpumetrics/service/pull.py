"""``gpumetrics.v1.MetricsPullService/Pull``: the batch store served to pulling consumers.

The servicer validates the request, turns it into one :meth:`BatchStore.pull` and maps the
result onto ``PullResponse`` (semantics in ``docs/protocol.md``). Errors (``pull.proto``):

* INVALID_ARGUMENT naming the field: a bad or reserved ``consumer``, or a negative
  ``previous_outcome.rejected_data_points``;
* UNAVAILABLE before the first collection has been stored (retryable in OTLP's failure rules);
* RESOURCE_EXHAUSTED when a new consumer would exceed ``StoreLimits.max_consumers``.

UNAUTHENTICATED / PERMISSION_DENIED (token checks) and RESOURCE_EXHAUSTED for oversized requests
or too many calls in flight come from the server around this servicer (``gate.py``, grpcio).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import grpc

from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry
from gpumetrics.store import BatchStore, TooManyConsumersError, validate_consumer
from gpumetrics.v1 import pull_pb2, pull_pb2_grpc

log = logging.getLogger(__name__)

RESERVED_CONSUMERS = frozenset({"push"})
"""Store consumers the sidecar uses itself (the push exporter's ``PUSH_CONSUMER``): a remote Pull
may not name them, or it would move (and acknowledge for) their cursor."""

DEFAULT_PULL_MAX_BYTES = 4 * 1024 * 1024 - 64 * 1024
"""Answer size when a request leaves ``max_bytes`` at 0: 4 MiB minus 64 KiB of envelope, so a
response fits the 4 MiB default receive limit of gRPC clients (grpc-go, grpcio)."""


def _clip(text: str, limit: int = 512) -> str:
    """Return ``text`` quoted (no raw newlines reach the log) and cut to ``limit`` characters."""
    return repr(text[:limit]) + ("…" if len(text) > limit else "")


class PullServicer(pull_pb2_grpc.MetricsPullServiceServicer):
    """Serves :class:`~gpumetrics.store.BatchStore` batches over ``MetricsPullService/Pull``.

    Args:
        store: the batch store.
        telemetry: counts ``gpumetrics.pull.rejected_points{consumer}`` (what consumers report
            in ``previous_outcome``).
        default_max_bytes: answer size cap when the request says 0 (By).
        max_bytes_limit: upper bound on any requested ``max_bytes`` (By), normally the server's
            send limit minus envelope; a larger request is clamped to it.
        default_max_points: point cap when the request says 0 (0 = no point cap).
        reserved_consumers: consumer names refused with INVALID_ARGUMENT.

    """

    def __init__(
        self,
        store: BatchStore,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        default_max_bytes: int = DEFAULT_PULL_MAX_BYTES,
        max_bytes_limit: int | None = None,
        default_max_points: int = 0,
        reserved_consumers: Collection[str] = RESERVED_CONSUMERS,
    ) -> None:
        self._store = store
        self._telemetry = telemetry
        self._default_max_bytes = default_max_bytes
        self._max_bytes_limit = max_bytes_limit or default_max_bytes
        self._default_max_points = default_max_points
        self._reserved = frozenset(reserved_consumers)

    def Pull(self, request: pull_pb2.PullRequest, context: Any) -> pull_pb2.PullResponse:  # noqa: N802
        """Acknowledge, then answer with the batches after the read position.

        The read position is ``max(request.read_after_sequence, acknowledged cursor)``, with
        ``read_after_sequence`` ignored when ``ack_epoch`` is not the store's epoch.
        """
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
        if outcome.rejected_data_points < 0:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "previous_outcome.rejected_data_points: must be >= 0, "
                f"got {outcome.rejected_data_points}",
            )
        if self._store.last_sequence == 0:
            context.abort(
                grpc.StatusCode.UNAVAILABLE, "no collection has been stored yet; retry later"
            )
        max_bytes = min(request.max_bytes or self._default_max_bytes, self._max_bytes_limit)
        try:
            result = self._store.pull(
                consumer,
                ack_sequence=request.ack_sequence,
                ack_epoch=request.ack_epoch,
                max_points=request.max_data_points or self._default_max_points,
                max_bytes=max_bytes,
                ack_only=request.ack_only,
                read_after_sequence=request.read_after_sequence,
            )
        except TooManyConsumersError as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._record_outcome(consumer, outcome)
        if result.dropped_data_points:
            log.warning(
                "consumer %r lost %d data points before acknowledging them (store limits: %s)",
                consumer,
                result.dropped_data_points,
                ", ".join(result.drop_reasons),
            )
        return pull_pb2.PullResponse(
            export_metrics_service_request=result.data,
            epoch=result.epoch,
            first_sequence=result.first_sequence,
            last_sequence=result.last_sequence,
            more=result.more,
            data_points=result.data_points,
            dropped_data_points=result.dropped_data_points,
            dropped_data_points_total=result.dropped_data_points_total,
            drop_reasons=result.drop_reasons,
        )

    def _record_outcome(self, consumer: str, outcome: pull_pb2.PreviousOutcome) -> None:
        if outcome.rejected_data_points > 0:
            self._telemetry.add(
                "gpumetrics.pull.rejected_points",
                outcome.rejected_data_points,
                {"consumer": consumer},
            )
            log.warning(
                "consumer %r: its pipeline rejected %d data points of the answer ending at "
                "sequence %d: %s",
                consumer,
                outcome.rejected_data_points,
                outcome.last_sequence,
                _clip(outcome.error_message),
            )
        elif outcome.error_message:
            log.info(
                "consumer %r reported a warning for the answer ending at sequence %d: %s",
                consumer,
                outcome.last_sequence,
                _clip(outcome.error_message),
            )
