"""The python runner: one case's steps, over real gRPC, against :class:`InProcessSidecar`.

Requests are built from the step mappings by protobuf's own JSON mapping
(``json_format.ParseDict``, which takes the ``.proto`` field names), after the runner's values
(``ack_epoch: current``, ``max_bytes: {size_of: ...}``) are resolved; answers are compared with
``want`` as ``tests/testdata/conformance/README.md`` says. A mismatch fails with the case and
step named.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import json_format
from gpumetrics.v1 import (
    logs_pull_pb2,
    logs_pull_pb2_grpc,
    profiler_pb2,
    profiler_pb2_grpc,
    pull_pb2,
    pull_pb2_grpc,
)
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from .cases import (
    FIRST_COLLECTION_POINTS,
    Advance,
    Append,
    Case,
    Close,
    Declare,
    DeclareWant,
    ErrorWant,
    Exits,
    ExitsWant,
    LogsPullWant,
    Open,
    OpenWant,
    Process,
    PullWant,
    Rejection,
    Send,
    SendWant,
    Step,
    logs_batch,
    metrics_batch,
)
from .inprocess import InProcessSidecar

TIMEOUT = 30.0
"""Bounds every call; never reached by a healthy server, however loaded the machine."""

DECLARER_KEY = "gpumetrics-declarer"


class Mismatch(AssertionError):
    """An answer that differs from the case's ``want``."""


@dataclass
class _Store:
    """What the runner knows of one store: its batches and the epochs its answers carried."""

    batches: dict[int, tuple[bytes, int]] = field(default_factory=dict)
    next_sequence: int = 1
    current: str | None = None
    previous: str | None = None
    seen: set[str] = field(default_factory=set)
    restarted: bool = False


class _Stream:
    """One open ``StreamDeclarations`` call, driven one event at a time."""

    def __init__(self, stub: profiler_pb2_grpc.ProfilerIntegrationServiceStub, md: Any) -> None:
        self._out: queue.Queue[profiler_pb2.StreamDeclarationsRequest | None] = queue.Queue()
        self.responses: Iterator[profiler_pb2.StreamDeclarationsResponse] = stub.StreamDeclarations(
            iter(self._out.get, None), metadata=md, timeout=TIMEOUT
        )

    def send(
        self, event: profiler_pb2.StreamDeclarationsRequest
    ) -> profiler_pb2.StreamDeclarationsResponse:
        self._out.put(event)
        return next(self.responses)

    def abandon(self) -> None:
        """End the request iterator of a call that already failed (frees grpcio's thread)."""
        self._out.put(None)

    def close(self) -> list[profiler_pb2.StreamDeclarationsResponse]:
        """End the client's side; return the answers that came after (there must be none)."""
        self._out.put(None)
        return list(self.responses)


def _error(step: str, want: ErrorWant | None, exc: grpc.RpcError) -> None:
    code, details = exc.code(), exc.details() or ""
    if want is None:
        raise Mismatch(f"{step}: failed with {code.name}: {details}")
    if code.name != want.code or not details.startswith(want.message):
        raise Mismatch(f"{step}: want {want.code} {want.message!r}..., got {code.name} {details!r}")


def _no_error(step: str, want: ErrorWant | None) -> None:
    if want is not None:
        raise Mismatch(f"{step}: want {want.code} {want.message!r}..., the call succeeded")


def _rejections(step: str, want: list[Rejection], got: Any) -> None:
    if len(want) != len(got):
        raise Mismatch(f"{step}: want {len(want)} rejections, got {list(got)}")
    for w, g in zip(want, got, strict=True):
        if (w.index, w.pid, w.field) != (g.index, g.pid, g.field):
            raise Mismatch(
                f"{step}: want rejection {(w.index, w.pid, w.field)}, got "
                f"{(g.index, g.pid, g.field)} ({g.reason})"
            )
        if (w.reason and w.reason not in g.reason) or not g.reason:
            raise Mismatch(f"{step}: rejection of {g.field}: want {w.reason!r} in {g.reason!r}")


def _declaration(p: Process) -> profiler_pb2.ProcessDeclaration:
    res = resource_pb2.Resource()
    for key, value in p.resource.items():
        kv = res.attributes.add()
        kv.key = key
        _set_value(kv.value, value)
    return profiler_pb2.ProcessDeclaration(
        pid=p.pid,
        start_time_ticks=p.start_time_ticks,
        environment=[
            profiler_pb2.EnvironmentVariable(name=e.name, value=e.raw()) for e in p.environment
        ],
        profiler_resource=res.SerializeToString() if p.resource else b"",
        process_context=bytes.fromhex(p.process_context_hex),
    )


def _set_value(target: common_pb2.AnyValue, value: str | bool | int | float) -> None:
    if isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int):
        target.int_value = value
    elif isinstance(value, float):
        target.double_value = value
    else:
        target.string_value = value


class Runner:
    """Runs one :class:`Case` against an :class:`InProcessSidecar`."""

    def __init__(self, case: Case, sidecar: InProcessSidecar) -> None:
        self.case = case
        self.sidecar = sidecar
        self.stores = {"pull": _Store(), "logs": _Store()}
        self.streams: dict[str, _Stream] = {}

    def run(self) -> None:
        """Run every step; raise :class:`Mismatch` at the first answer that differs."""
        self._given()
        for i, step in enumerate(self.case.steps):
            where = f"{self.case.id}: steps[{i}] ({step.kind})"
            getattr(self, f"_{step.kind}")(where, step)
        for name, stream in self.streams.items():
            stream.close()
            raise Mismatch(f"{self.case.id}: stream {name!r} was never closed")

    def _given(self) -> None:
        if self.case.given == "first_collection":
            self._store_batch("pull", FIRST_COLLECTION_POINTS, None, "given")

    # -- controlled steps ------------------------------------------------------------------------

    def _store_batch(self, service: str, items: int, size: int | None, where: str) -> None:
        known = self.stores[service]
        seq = known.next_sequence
        data = logs_batch(seq, items) if service == "logs" else metrics_batch(seq, items)
        if size is not None and len(data) != size:
            raise Mismatch(f"{where}: the batch is {len(data)} bytes, the case says {size}")
        got = self.sidecar.store_of(service).append_serialized(data, items)
        if got != seq:
            raise Mismatch(f"{where}: the store gave the batch sequence {got}, want {seq}")
        known.batches[seq] = (data, items)
        known.next_sequence = seq + 1

    def _append(self, where: str, step: Step) -> None:
        body: Append = step.body
        for _ in range(body.count):
            self._store_batch(self._service, body.points, body.bytes, where)

    def _advance(self, where: str, step: Step) -> None:
        body: Advance = step.body
        self.sidecar.clock.advance(body.seconds)

    def _held(self, where: str, step: Step) -> None:
        stats = self.sidecar.store_of(self._service).stats()
        held = list(range(stats.last_sequence - stats.held_batches + 1, stats.last_sequence + 1))
        if held != step.body:
            raise Mismatch(f"{where}: want batches {step.body} held, the store holds {held}")

    # -- protocol steps --------------------------------------------------------------------------

    @property
    def _service(self) -> str:
        return self.case.service

    def _restart(self, where: str, step: Step) -> None:
        if self.streams:
            raise Mismatch(f"{where}: close the streams {sorted(self.streams)} before a restart")
        self.sidecar.restart()
        for known in self.stores.values():
            known.batches.clear()
            known.next_sequence = 1
            known.previous, known.restarted = known.current, True
        self._given()

    def _request(self, where: str, raw: dict[str, Any]) -> Any:
        known = self.stores[self._service]
        values = dict(raw)
        epoch = values.get("ack_epoch")
        if epoch in ("current", "previous"):
            value = known.current if epoch == "current" else known.previous
            if value is None:
                raise Mismatch(f"{where}: ack_epoch {epoch}: no such epoch seen yet")
            values["ack_epoch"] = value
        size = values.get("max_bytes")
        if isinstance(size, dict):
            extra = set(size) - {"size_of", "plus"}
            if extra or "size_of" not in size:
                raise Mismatch(f"{where}: max_bytes: {{size_of: [seqs], plus: n}}, got {size}")
            try:
                values["max_bytes"] = sum(
                    len(known.batches[s][0]) for s in size["size_of"]
                ) + size.get("plus", 0)
            except KeyError as exc:
                raise Mismatch(f"{where}: max_bytes: no batch {exc} stored") from None
        message = (
            logs_pull_pb2.PullLogsRequest() if self._service == "logs" else pull_pb2.PullRequest()
        )
        try:
            return json_format.ParseDict(values, message)
        except json_format.ParseError as exc:
            raise Mismatch(f"{where}: not a {type(message).__name__}: {exc}") from None

    def _pull(self, where: str, step: Step) -> None:
        want: PullWant | LogsPullWant = step.want
        request = self._request(where, step.body)
        channel = self.sidecar.channel
        try:
            if self._service == "logs":
                r: Any = logs_pull_pb2_grpc.LogsPullServiceStub(channel).PullLogs(
                    request, timeout=TIMEOUT
                )
                payload, items = r.export_logs_service_request, r.log_records
                dropped, total = r.dropped_log_records, r.dropped_log_records_total
                assert isinstance(want, LogsPullWant)
                want_dropped, want_total = want.dropped_log_records, want.dropped_log_records_total
            else:
                r = pull_pb2_grpc.MetricsPullServiceStub(channel).Pull(request, timeout=TIMEOUT)
                payload, items = r.export_metrics_service_request, r.data_points
                dropped, total = r.dropped_data_points, r.dropped_data_points_total
                assert isinstance(want, PullWant)
                want_dropped, want_total = want.dropped_data_points, want.dropped_data_points_total
        except grpc.RpcError as exc:
            _error(where, want.error, exc)
            return
        _no_error(where, want.error)
        self._epoch(where, r.epoch)
        known = self.stores[self._service]
        try:
            parts = [known.batches[s] for s in want.batches]
        except KeyError as exc:
            raise Mismatch(f"{where}: want batch {exc}, which no step stored") from None
        got: dict[str, Any] = {
            "first_sequence": r.first_sequence,
            "last_sequence": r.last_sequence,
            "items": items,
            "payload": payload,
            "more": r.more,
            "dropped": dropped,
            "dropped_total": total,
            "drop_reasons": sorted(r.drop_reasons),
        }
        expected: dict[str, Any] = {
            "first_sequence": want.batches[0] if want.batches else 0,
            "last_sequence": want.batches[-1] if want.batches else 0,
            "items": sum(n for _, n in parts),
            "payload": b"".join(data for data, _ in parts),
            "more": want.more,
            "dropped": want_dropped,
            "dropped_total": want_total,
            "drop_reasons": sorted(want.drop_reasons),
        }
        for key, value in expected.items():
            if got[key] != value:
                shown = got[key] if key != "payload" else f"{len(got[key])} bytes"
                wanted = value if key != "payload" else f"{len(value)} bytes of batches"
                raise Mismatch(
                    f"{where}: {key}: want {wanted!r}, got {shown!r} "
                    f"(answer: batches {r.first_sequence}..{r.last_sequence}, more {r.more})"
                )

    def _epoch(self, where: str, epoch: str) -> None:
        known = self.stores[self._service]
        if known.restarted:
            if epoch in known.seen:
                raise Mismatch(f"{where}: after a restart the epoch {epoch!r} is not new")
            known.restarted = False
        elif known.current is not None and epoch != known.current:
            raise Mismatch(f"{where}: epoch {epoch!r} changed from {known.current!r}")
        known.current = epoch
        known.seen.add(epoch)

    def _metadata(self, declarer: str | None) -> tuple[tuple[str, str], ...]:
        return () if declarer is None else ((DECLARER_KEY, declarer),)

    def _profiler(self) -> profiler_pb2_grpc.ProfilerIntegrationServiceStub:
        return profiler_pb2_grpc.ProfilerIntegrationServiceStub(self.sidecar.channel)

    def _declare(self, where: str, step: Step) -> None:
        body: Declare = step.body
        want: DeclareWant = step.want
        request = profiler_pb2.DeclareProcessesRequest(
            processes=[_declaration(p) for p in body.processes], replace_all=body.replace_all
        )
        try:
            r = self._profiler().DeclareProcesses(
                request, metadata=self._metadata(body.declarer), timeout=TIMEOUT
            )
        except grpc.RpcError as exc:
            _error(where, want.error, exc)
            return
        _no_error(where, want.error)
        if (r.accepted, r.released) != (want.accepted, want.released):
            raise Mismatch(
                f"{where}: want accepted {want.accepted}, released {want.released}; got "
                f"{r.accepted}, {r.released} (rejected: {list(r.rejected)})"
            )
        _rejections(where, want.rejected, r.rejected)

    def _exits(self, where: str, step: Step) -> None:
        body: Exits = step.body
        want: ExitsWant = step.want
        request = profiler_pb2.ReportExitsRequest(
            exits=[
                profiler_pb2.ProcessExit(pid=e.pid, start_time_ticks=e.start_time_ticks)
                for e in body.exits
            ]
        )
        try:
            r = self._profiler().ReportExits(request, timeout=TIMEOUT)
        except grpc.RpcError as exc:
            _error(where, want.error, exc)
            return
        _no_error(where, want.error)
        if r.released != want.released:
            raise Mismatch(f"{where}: want released {want.released}, got {r.released}")
        _rejections(where, want.rejected, r.rejected)

    def _open(self, where: str, step: Step) -> None:
        body: Open = step.body
        want: OpenWant | None = step.want
        if body.stream in self.streams:
            raise Mismatch(f"{where}: stream {body.stream!r} is already open")
        stream = _Stream(self._profiler(), self._metadata(body.declarer))
        if want is None:
            self.streams[body.stream] = stream
            return
        try:
            first = next(stream.responses)
        except grpc.RpcError as exc:
            _error(where, want.error, exc)
            return
        finally:
            stream.abandon()
        raise Mismatch(f"{where}: want the stream to fail, it answered {first}")

    def _send(self, where: str, step: Step) -> None:
        body: Send = step.body
        want: SendWant = step.want
        stream = self.streams.get(body.stream)
        if stream is None:
            raise Mismatch(f"{where}: no open stream {body.stream!r}")
        event = profiler_pb2.StreamDeclarationsRequest()
        if body.declare is not None:
            event.declare.CopyFrom(_declaration(body.declare))
        elif body.declare_batch is not None:
            event.declare_batch.SetInParent()
            for p in body.declare_batch.processes:
                event.declare_batch.processes.add().CopyFrom(_declaration(p))
        elif body.exit is not None:
            event.exit.pid, event.exit.start_time_ticks = body.exit.pid, body.exit.start_time_ticks
        elif body.resync_begin is not None:
            event.resync_begin.SetInParent()
        elif body.resync_end is not None:
            event.resync_end.SetInParent()
        try:
            r = stream.send(event)
        except grpc.RpcError as exc:
            raise Mismatch(
                f"{where}: the stream failed: {exc.code().name}: {exc.details()}"
            ) from None
        got = (r.accepted, r.released, r.declared)
        if got != (want.accepted, want.released, want.declared):
            raise Mismatch(
                f"{where}: want accepted {want.accepted}, released {want.released}, declared "
                f"{want.declared}; got {got} ({r.rejection})"
            )
        if want.rejection is None:
            if r.HasField("rejection"):
                raise Mismatch(f"{where}: unexpected rejection {r.rejection}")
        else:
            _rejections(where, [want.rejection], [r.rejection] if r.HasField("rejection") else [])
        _rejections(where, want.rejections, list(r.rejections))

    def _close(self, where: str, step: Step) -> None:
        body: Close = step.body
        stream = self.streams.pop(body.stream, None)
        if stream is None:
            raise Mismatch(f"{where}: no open stream {body.stream!r}")
        try:
            extra = stream.close()
        except grpc.RpcError as exc:
            raise Mismatch(
                f"{where}: the stream ended with {exc.code().name}: {exc.details()}"
            ) from None
        if extra:
            raise Mismatch(f"{where}: answers after the last event: {extra}")
