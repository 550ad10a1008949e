"""Pull consumers and a profiler that talk to the sidecar through its real gRPC server.

Each :class:`Consumer` keeps a client-side ledger and checks every answer against the batches
the soak appended (``ledger``: sequence -> points, counted when the batch was produced):

* an answer holds batches ``first..last``, contiguous, after the consumer's acknowledged cursor
  and never an acknowledged one again; its ``data_points`` is the ledger's sum over them and the
  point count of the parsed ``ExportMetricsServiceRequest``;
* ``dropped_data_points_total`` is the sum of every ``dropped_data_points`` it was told.

Its behaviour per scrape is drawn from the soak's random generator: drain and acknowledge, fail
downstream (report ``previous_outcome``, acknowledge nothing), skip the acknowledgement, stay
away (lag, so the store's limits drop what it had not taken), reconnect on a fresh channel, or
use small answers.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from gpumetrics.metrics import count_points
from gpumetrics.v1 import profiler_pb2 as ppb
from gpumetrics.v1 import profiler_pb2_grpc, pull_pb2, pull_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

TIMEOUT = 10.0
"""Bounds every RPC; never reached while the server is healthy."""

HAS_READ_AFTER = "read_after_sequence" in pull_pb2.PullRequest.DESCRIPTOR.fields_by_name
"""Whether this checkout's PullRequest has ``read_after_sequence`` (drain before acknowledging)."""

BEHAVIOURS = ("drain", "drain", "drain", "fail", "skip_ack", "away", "reconnect", "small")


@dataclass
class Consumer:
    """One named pull consumer with its own channel and ledger (see the module docstring)."""

    name: str
    connect: Callable[[], grpc.Channel]
    ledger: Mapping[int, int]
    acked: int = 0
    epoch: str = ""
    pending_ack: int = 0
    rejected: int = 0
    received: set[int] = field(default_factory=set)
    dropped: int = 0
    pulls: int = 0
    behaviours: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0
    _channel: grpc.Channel | None = None
    _stub: Any = None

    def _pull_stub(self) -> Any:
        if self._stub is None:
            self._channel = self.connect()
            self._stub = pull_pb2_grpc.MetricsPullServiceStub(self._channel)
        return self._stub

    def reconnect(self) -> None:
        """Drop the channel; the next pull dials again (same consumer name, same cursor)."""
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
        self.reconnects += 1

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def _pull(self, **kw: Any) -> pull_pb2.PullResponse:
        outcome = None
        if self.rejected:
            outcome = pull_pb2.PreviousOutcome(
                last_sequence=self.pending_ack,
                rejected_data_points=self.rejected,
                error_message="soak: downstream refused the batch",
            )
        req = pull_pb2.PullRequest(
            consumer=self.name,
            ack_sequence=self.acked,
            ack_epoch=self.epoch,
            previous_outcome=outcome,
            **kw,
        )
        resp = self._pull_stub().Pull(req, timeout=TIMEOUT)
        self.pulls += 1
        self.rejected = 0
        self._check(resp)
        return resp

    def _check(self, resp: pull_pb2.PullResponse) -> None:
        if resp.epoch != self.epoch:
            assert self.epoch == "", f"{self.name}: epoch changed from {self.epoch} to {resp.epoch}"
            self.epoch = resp.epoch
        self.dropped += resp.dropped_data_points
        assert resp.dropped_data_points_total == self.dropped, (
            f"{self.name}: told dropped_total {resp.dropped_data_points_total}, "
            f"sum of reported drops {self.dropped}"
        )
        if not resp.export_metrics_service_request:
            assert resp.first_sequence == resp.last_sequence == resp.data_points == 0, resp
            return
        first, last = resp.first_sequence, resp.last_sequence
        assert self.acked < first <= last, f"{self.name}: got {first}..{last}, acked {self.acked}"
        expected = sum(self.ledger[s] for s in range(first, last + 1))
        parsed = metrics_service_pb2.ExportMetricsServiceRequest.FromString(
            resp.export_metrics_service_request
        )
        assert resp.data_points == expected == count_points(parsed), (
            f"{self.name}: {first}..{last}: data_points {resp.data_points}, "
            f"ledger {expected}, parsed {count_points(parsed)}"
        )
        self.received.update(range(first, last + 1))

    def drain(self, max_points: int = 0, max_pulls: int = 64) -> int:
        """Pull until ``more`` is false; return the last sequence received (0: none)."""
        last = 0
        position = 0
        for _ in range(max_pulls):
            kw: dict[str, Any] = {"max_data_points": max_points}
            if HAS_READ_AFTER and position:
                kw["read_after_sequence"] = position
            resp = self._pull(**kw)
            if resp.last_sequence:
                last = position = resp.last_sequence
            if not resp.more or not HAS_READ_AFTER:
                return last
        raise AssertionError(f"{self.name}: still more after {max_pulls} pulls")

    def ack(self, upto: int) -> None:
        """Acknowledge everything up to ``upto`` (the next pull carries it; ack_only now)."""
        if upto > self.acked:
            self.acked = upto
            self._pull(ack_only=True)

    def scrape(self, rng: random.Random, how: str | None = None) -> str:
        """One scrape with behaviour ``how`` (default: drawn from ``rng``); return its name."""
        how = how or rng.choice(BEHAVIOURS)
        self.behaviours[how] = self.behaviours.get(how, 0) + 1
        if how == "away":
            return how
        if how == "reconnect":
            self.reconnect()
        last = self.drain(max_points=rng.choice((1, 50, 400)) if how == "small" else 0)
        if how == "fail" and last:
            self.pending_ack = last
            self.rejected = sum(self.ledger[s] for s in range(self.acked + 1, last + 1))
        elif how != "skip_ack" and last:
            self.ack(last)
        return how

    def settle(self) -> None:
        """Drain and acknowledge everything still held for this consumer."""
        for _ in range(64):
            last = self.drain()
            if not last:
                self._pull(ack_only=True)
                return
            self.ack(last)
        raise AssertionError(f"{self.name}: did not settle")


class BackgroundConsumer:
    """A consumer that drains and acknowledges in its own thread until told to stop.

    Bounded: at most ``max_scrapes`` scrapes; errors are kept in ``errors`` for the test.
    """

    def __init__(self, consumer: Consumer, max_scrapes: int = 100_000) -> None:
        self.consumer = consumer
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.scrapes = 0
        self._max = max_scrapes
        self._thread = threading.Thread(target=self._run, name=f"soak-{consumer.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set() and self.scrapes < self._max:
                last = self.consumer.drain()
                if last:
                    self.consumer.ack(last)
                self.scrapes += 1
                self.stop.wait(0.005)  # pacing only: the checks never depend on it
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)

    def join(self, timeout: float) -> None:
        self.stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self.consumer.name} did not stop"


class Profiler:
    """Declares and reports exits like a profiling agent, over the real profiler service."""

    def __init__(self, channel: grpc.Channel, declarer: str = "soak-agent") -> None:
        self.stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel)
        self.metadata = (("gpumetrics-declarer", declarer),)
        self.accepted = self.rejected = self.released = self.exits = 0

    @staticmethod
    def declaration(pid: int, ticks: int, service: str) -> ppb.ProcessDeclaration:
        """``pid`` with a profiler resource (``process.pid``, an APM ``service.name``)."""
        res = resource_pb2.Resource()
        res.attributes.add(key="process.pid").value.int_value = pid
        res.attributes.add(key="service.name").value.string_value = service
        return ppb.ProcessDeclaration(
            pid=pid,
            start_time_ticks=ticks,
            environment=[ppb.EnvironmentVariable(name="OTEL_SERVICE_NAME", value=service.encode())],
            profiler_resource=res.SerializeToString(),
        )

    def declare(self, entries: list[ppb.ProcessDeclaration], replace_all: bool = False) -> None:
        resp = self.stub.DeclareProcesses(
            ppb.DeclareProcessesRequest(processes=entries, replace_all=replace_all),
            metadata=self.metadata,
            timeout=TIMEOUT,
        )
        assert not resp.rejected, resp.rejected
        self.accepted += resp.accepted
        self.released += resp.released

    def report_exits(self, exits: list[tuple[int, int]]) -> None:
        resp = self.stub.ReportExits(
            ppb.ReportExitsRequest(
                exits=[ppb.ProcessExit(pid=p, start_time_ticks=t) for p, t in exits]
            ),
            metadata=self.metadata,
            timeout=TIMEOUT,
        )
        assert not resp.rejected, resp.rejected
        self.exits += len(exits)
        self.released += resp.released


class BackgroundStreamer:
    """Streams a declaration and the exit of short-lived non-GPU pids until told to stop.

    Every event must be answered ``accepted``, in order. Bounded by ``max_events``.
    """

    def __init__(self, channel: grpc.Channel, pids: range, max_events: int = 200_000) -> None:
        self.stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel)
        self.pids = pids
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.events = 0
        self._max = max_events
        self._thread = threading.Thread(target=self._run, name="soak-streamer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _requests(self) -> Any:
        i = 0
        while not self.stop.is_set() and i < self._max:
            pid = self.pids[(i // 2) % len(self.pids)]
            if i % 2:  # each declaration is followed by its exit: the stream holds at most one
                yield ppb.StreamDeclarationsRequest(exit=ppb.ProcessExit(pid=pid))
            else:
                yield ppb.StreamDeclarationsRequest(
                    declare=Profiler.declaration(pid, 0, f"noise-{pid}")
                )
            i += 1

    def _run(self) -> None:
        try:
            for resp in self.stub.StreamDeclarations(
                self._requests(),
                metadata=(("gpumetrics-declarer", "soak-streamer"),),
                timeout=600,
            ):
                assert resp.accepted, resp
                self.events += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)

    def join(self, timeout: float) -> None:
        self.stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "streamer did not stop"
