"""``gpumetrics.v1.MetricsPullService/Pull``: the batch store served to pulling consumers.

The servicer validates the request, turns it into one :meth:`BatchStore.pull` and maps the
result onto ``PullResponse`` (semantics in ``docs/protocol.md``). Errors (``pull.proto``):

* INVALID_ARGUMENT naming the field: a bad or reserved ``consumer``, or a negative
  ``previous_outcome.rejected_data_points``;
* UNAVAILABLE before the first collection has been stored, and while the answers already in
  flight use the whole ``pull_inflight_bytes`` budget (both retryable in OTLP's failure rules);
* RESOURCE_EXHAUSTED when a new consumer would exceed ``StoreLimits.max_consumers``.

Memory: an answer is at most ``max_bytes_limit`` (or one batch, when a single batch is larger
than the request's ``max_bytes``), it reserves its size in the server's
:class:`~gpumetrics.service.inflight.InflightBudget` until its call ends, and it is copied once,
straight from the store's batches into the serialized ``PullResponse``
(:func:`encode_pull_response`); gRPC's send buffer is the second and last copy.

A failed answer changes nothing: when gRPC could not deliver it (the call was cancelled, its
connection broke, or the message was refused), the store takes the delivery back
(:meth:`BatchStore.undo_pull`), so it can neither be acknowledged nor lose the drops it reported.

UNAUTHENTICATED / PERMISSION_DENIED (token checks) and RESOURCE_EXHAUSTED for oversized requests
or too many calls in flight come from the server around this servicer (``gate.py``, grpcio).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import grpc

from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry
from gpumetrics.service.inflight import InflightBudget
from gpumetrics.service.names import PULL_SERVICE
from gpumetrics.service.settings import (
    DEFAULT_PULL_INFLIGHT_BYTES,
    DEFAULT_PULL_MAX_BYTES,
)
from gpumetrics.store import BatchStore, PullResult, TooManyConsumersError, validate_consumer
from gpumetrics.v1 import pull_pb2
from gpumetrics.wire import varint

log = logging.getLogger(__name__)

RESERVED_CONSUMERS = frozenset({"push"})
"""Store consumers the sidecar uses itself (the push exporter's ``PUSH_CONSUMER``): a remote Pull
may not name them, or it would move (and acknowledge for) their cursor."""

_CANCELLED = "cancelled"  # grpcio's _server._CANCELLED: the client end of a call that failed


def encode_pull_response(result: PullResult) -> bytes:
    """Serialize the ``PullResponse`` for ``result``, copying its batches exactly once.

    Field 1 (``export_metrics_service_request``, length-delimited) is written by hand from
    :attr:`PullResult.parts`; the other fields by protobuf. Field order does not matter to a
    parser (protobuf "Encoding": fields may appear in any order), so the result parses to the
    same message as ``PullResponse(export_metrics_service_request=result.data, ...)``.
    """
    rest = pull_pb2.PullResponse(
        epoch=result.epoch,
        first_sequence=result.first_sequence,
        last_sequence=result.last_sequence,
        more=result.more,
        data_points=result.data_points,
        dropped_data_points=result.dropped_data_points,
        dropped_data_points_total=result.dropped_data_points_total,
        drop_reasons=result.drop_reasons,
    ).SerializeToString()
    size = result.size
    if not size:
        return rest
    return b"".join((b"\x0a", varint(size), *result.parts, rest))


def _serialize(response: bytes | pull_pb2.PullResponse) -> bytes:
    if isinstance(response, bytes):
        return response
    return response.SerializeToString()


def add_pull_servicer(servicer: PullServicer, server: grpc.Server) -> None:
    """Register ``servicer`` as ``MetricsPullService`` on ``server``.

    Like the generated ``add_MetricsPullServiceServicer_to_server``, but the response
    serializer passes the servicer's pre-serialized answers through unchanged.
    """
    handlers = {
        "Pull": grpc.unary_unary_rpc_method_handler(
            servicer.Pull,
            request_deserializer=pull_pb2.PullRequest.FromString,
            response_serializer=_serialize,
        )
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(PULL_SERVICE, handlers),))
    server.add_registered_method_handlers(PULL_SERVICE, handlers)


def _call_failed(context: Any) -> bool:
    """Tell whether the ended call failed to deliver its response (gRPC cancelled it).

    grpcio's synchronous server has no public accessor for this: its per-call state marks the
    client end ``cancelled`` when the response could not be sent (too large, deadline, broken
    connection, cancelled by the client). grpcio is pinned; ``tests/service`` checks that a
    refused send is detected.
    """
    state = getattr(context, "_state", None)
    return getattr(state, "client", None) == _CANCELLED


def _clip(text: str, limit: int = 512) -> str:
    """Return ``text`` quoted (no raw newlines reach the log) and cut to ``limit`` characters."""
    return repr(text[:limit]) + ("…" if len(text) > limit else "")


class StorePull:
    """One Pull against a :class:`~gpumetrics.store.BatchStore`, whatever the signal.

    The core that ``MetricsPullService/Pull`` (:class:`PullServicer`) and
    ``LogsPullService/PullLogs`` (:class:`~gpumetrics.service.logs_pull.LogsPullServicer`)
    share: the request checks, the answer's reservation in the in-flight budget, the store call
    with its errors mapped to gRPC codes, taking a failed delivery back, and the consumer's
    reported outcome. Each servicer maps its own request fields in and encodes its own answer.

    Args:
        store: the batch store.
        telemetry: counts ``gpumetrics.pull.rejected_points{consumer[, signal]}`` (what consumers
            report in ``previous_outcome``) and ``gpumetrics.pull.budget_refusals``.
        default_max_bytes: answer size cap when the request says 0 (By).
        max_bytes_limit: upper bound on any requested ``max_bytes`` (By); a larger request is
            clamped to it.
        reserved_consumers: consumer names refused with INVALID_ARGUMENT.
        budget: the server's budget of answers in flight (shared by every signal's servicer).
        signal: ``None`` for metrics, else the ``signal`` attribute of its telemetry (``logs``).
        unit: what the store's points are, for logs (``data points``, ``GPU event records``).
        rejected_field: the ``previous_outcome`` field that counts rejected points.
        empty_is_unavailable: answer UNAVAILABLE while the store has never held a batch (true
            for metrics: a first collection always comes; a node may have no event for days).

    """

    def __init__(
        self,
        store: BatchStore,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        default_max_bytes: int = DEFAULT_PULL_MAX_BYTES,
        max_bytes_limit: int | None = None,
        reserved_consumers: Collection[str] = RESERVED_CONSUMERS,
        budget: InflightBudget | None = None,
        *,
        signal: str | None = None,
        unit: str = "data points",
        rejected_field: str = "rejected_data_points",
        empty_is_unavailable: bool = True,
    ) -> None:
        self.store = store
        self._telemetry = telemetry
        self._default_max_bytes = default_max_bytes
        self._max_bytes_limit = max_bytes_limit or default_max_bytes
        self._reserved = frozenset(reserved_consumers)
        self.budget = budget or InflightBudget(DEFAULT_PULL_INFLIGHT_BYTES)
        self._signal = signal
        self._unit = unit
        self._rejected_field = rejected_field
        self._empty_is_unavailable = empty_is_unavailable

    def _labels(self, consumer: str) -> dict[str, str]:
        labels = {"consumer": consumer}
        if self._signal is not None:
            labels["signal"] = self._signal
        return labels

    def serve(
        self,
        context: Any,
        request: Any,
        *,
        max_points: int,
    ) -> PullResult:
        """Validate ``request``, acknowledge and read the store; return the answer to encode.

        ``request`` has the fields every pull request shares (``consumer``, ``ack_sequence``,
        ``ack_epoch``, ``max_bytes``, ``ack_only``, ``read_after_sequence``,
        ``previous_outcome``); ``max_points`` is its point cap (0 = none).

        Raises (through ``context.abort``): INVALID_ARGUMENT naming the field, UNAVAILABLE
        (nothing stored yet, or the in-flight budget is used up), RESOURCE_EXHAUSTED (too many
        consumers).
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
        rejected = getattr(outcome, self._rejected_field)
        if rejected < 0:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"previous_outcome.{self._rejected_field}: must be >= 0, got {rejected}",
            )
        if self._empty_is_unavailable and self.store.last_sequence == 0:
            context.abort(
                grpc.StatusCode.UNAVAILABLE, "no collection has been stored yet; retry later"
            )
        want = min(request.max_bytes or self._default_max_bytes, self._max_bytes_limit)
        reserved = 0
        if not request.ack_only:
            # the first batch is sent even when alone larger than `want`: reserve for it too
            batch = self.store.max_batch_bytes
            reserved = self.budget.reserve(max(want, batch), at_least=batch)
            if not reserved:
                self._telemetry.add("gpumetrics.pull.budget_refusals", 1, self._labels(consumer))
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"answers in flight use the whole pull budget ({self.budget.limit} bytes, "
                    "server.pull_inflight_bytes); retry later",
                )
            want = min(want, reserved)
        try:
            result = self.store.pull(
                consumer,
                ack_sequence=request.ack_sequence,
                ack_epoch=request.ack_epoch,
                max_points=max_points,
                max_bytes=want,
                ack_only=request.ack_only,
                read_after_sequence=request.read_after_sequence,
            )
        except TooManyConsumersError as exc:
            self.budget.release(reserved)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except ValueError as exc:
            self.budget.release(reserved)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        held = result.size
        self.budget.release(reserved - held)
        self._settle_when_done(context, result, held)
        self._record_outcome(consumer, outcome, rejected)
        if result.dropped_data_points:
            log.warning(
                "consumer %r lost %d %s before acknowledging them (store limits: %s)",
                consumer,
                result.dropped_data_points,
                self._unit,
                ", ".join(result.drop_reasons),
            )
        return result

    def _settle_when_done(self, context: Any, result: PullResult, held: int) -> None:
        """When the call ends: give back the answer's budget; take the delivery back if failed."""

        def done() -> None:
            self.budget.release(held)
            if _call_failed(context) and self.store.undo_pull(result):
                log.info(
                    "the answer to a Pull (batches %d..%d) did not reach its consumer; "
                    "it will be sent again",
                    result.first_sequence,
                    result.last_sequence,
                )

        if not context.add_callback(done):  # the call has already ended
            self.budget.release(held)
            self.store.undo_pull(result)

    def _record_outcome(self, consumer: str, outcome: Any, rejected: int) -> None:
        if rejected > 0:
            self._telemetry.add("gpumetrics.pull.rejected_points", rejected, self._labels(consumer))
            log.warning(
                "consumer %r: its pipeline rejected %d %s of the answer ending at sequence %d: %s",
                consumer,
                rejected,
                self._unit,
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


class PullServicer:
    """Serves :class:`~gpumetrics.store.BatchStore` batches over ``MetricsPullService/Pull``.

    Register it with :func:`add_pull_servicer` (its answers are pre-serialized bytes).

    Args:
        store: the batch store.
        telemetry: counts ``gpumetrics.pull.rejected_points{consumer}`` (what consumers report
            in ``previous_outcome``) and ``gpumetrics.pull.budget_refusals``.
        default_max_bytes: answer size cap when the request says 0 (By).
        max_bytes_limit: upper bound on any requested ``max_bytes`` (By): the server's
            ``pull_max_bytes``; a larger request is clamped to it.
        default_max_points: point cap when the request says 0 (0 = no point cap).
        reserved_consumers: consumer names refused with INVALID_ARGUMENT.
        budget: the server's budget of answers in flight (default: its own, of
            :data:`DEFAULT_PULL_INFLIGHT_BYTES`).

    """

    def __init__(
        self,
        store: BatchStore,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        default_max_bytes: int = DEFAULT_PULL_MAX_BYTES,
        max_bytes_limit: int | None = None,
        default_max_points: int = 0,
        reserved_consumers: Collection[str] = RESERVED_CONSUMERS,
        budget: InflightBudget | None = None,
    ) -> None:
        self._core = StorePull(
            store, telemetry, default_max_bytes, max_bytes_limit, reserved_consumers, budget
        )
        self._default_max_points = default_max_points

    @property
    def budget(self) -> InflightBudget:
        """The in-flight budget this servicer's answers reserve from."""
        return self._core.budget

    def Pull(self, request: pull_pb2.PullRequest, context: Any) -> bytes:  # noqa: N802
        """Acknowledge, then answer with the batches after the read position.

        The read position is ``max(request.read_after_sequence, acknowledged cursor)``, with
        ``read_after_sequence`` ignored when ``ack_epoch`` is not the store's epoch.

        Returns:
            The serialized ``PullResponse`` (:func:`encode_pull_response`).

        """
        result = self._core.serve(
            context, request, max_points=request.max_data_points or self._default_max_points
        )
        return encode_pull_response(result)
