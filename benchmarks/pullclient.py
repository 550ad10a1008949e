"""A minimal pull consumer for the benchmarks: the client loop of ``docs/protocol.md``.

:class:`PullConsumer` keeps one consumer's acknowledgement and epoch and drains the backlog
(``Pull`` until ``more`` is false, acknowledging each answer in the next request), as the Go
receiver does every scrape interval.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import grpc
from gpumetrics.v1 import pull_pb2, pull_pb2_grpc

MAX_RECEIVE = 64 * 1024 * 1024
"""Client receive limit (room for a single batch larger than ``max_bytes``, per the protocol)."""


@dataclass
class Drain:
    """One drain: pulls made, serialized OTLP bytes (``size_bytes``) and points, wall seconds."""

    pulls: int = 0
    size_bytes: int = 0
    points: int = 0
    seconds: float = 0.0
    first_sequence: int = 0
    last_sequence: int = 0
    payloads: list[bytes] = field(default_factory=list)


def channel(target: str) -> grpc.Channel:
    """An insecure channel to ``target`` with a receive limit of :data:`MAX_RECEIVE`."""
    return grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", MAX_RECEIVE)])


class PullConsumer:
    """One named consumer of a sidecar's ``MetricsPullService``."""

    def __init__(self, ch: grpc.Channel, consumer: str, max_bytes: int = 0) -> None:
        self.stub = pull_pb2_grpc.MetricsPullServiceStub(ch)  # type: ignore[no-untyped-call]
        self.consumer = consumer
        self.max_bytes = max_bytes
        self.ack = 0
        self.epoch = ""

    def drain(self, keep: bool = False, timeout_s: float = 30.0) -> Drain:
        """Pull until ``more`` is false, acknowledging each answer in the next Pull.

        The last answer stays unacknowledged until the next drain (or :meth:`ack_only`), as in
        the protocol's client loop. ``keep`` keeps the payloads (for decoding).

        Raises:
            grpc.RpcError: a Pull failed (UNAVAILABLE before the first collection).

        """
        d = Drain()
        start = time.perf_counter()
        while True:
            r = self.stub.Pull(
                pull_pb2.PullRequest(
                    consumer=self.consumer,
                    ack_sequence=self.ack,
                    ack_epoch=self.epoch,
                    max_bytes=self.max_bytes,
                ),
                timeout=timeout_s,
            )
            d.pulls += 1
            if r.export_metrics_service_request:
                d.size_bytes += len(r.export_metrics_service_request)
                d.points += r.data_points
                d.first_sequence = d.first_sequence or r.first_sequence
                d.last_sequence = r.last_sequence
                self.ack = r.last_sequence
                if keep:
                    d.payloads.append(r.export_metrics_service_request)
            self.epoch = r.epoch
            if not r.more:
                break
        d.seconds = time.perf_counter() - start
        return d

    def ack_only(self, timeout_s: float = 30.0) -> float:
        """Acknowledge what was received so far without asking for more; return its seconds."""
        start = time.perf_counter()
        self.stub.Pull(
            pull_pb2.PullRequest(
                consumer=self.consumer, ack_sequence=self.ack, ack_epoch=self.epoch, ack_only=True
            ),
            timeout=timeout_s,
        )
        return time.perf_counter() - start
