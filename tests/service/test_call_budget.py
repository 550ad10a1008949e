"""One budget of calls being read for the whole sidecar, however many listeners serve them.

docs/deployment.md ("Memory") bounds the requests being read by the threads that read them:
``unary_workers`` threads for the unary calls of the main and profiler servers together, and
``max_streams`` slots per streaming service, all listeners together. Issue 23 follow-up: with
the profiler service on its own socket (the default), each server had a pool and slots of its
own, so the default configuration read twice as many calls at once as the table said.

Calls are held by servicers the test controls (a blocking generic service on the main socket,
a blocking declared store behind the profiler socket), over real unix sockets; every wait is
for an event the server signals, bounded by ``TIMEOUT``.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpumetrics.identity import DeclaredStore
from gpumetrics.selftelemetry import Telemetry
from gpumetrics.service import ServerSettings, SidecarHealth, SidecarServer
from gpumetrics.service.auth import AuthPolicy
from gpumetrics.service.peercred import ConnectionLimit, PeerCredRelay
from gpumetrics.store import BatchStore
from gpumetrics.v1 import profiler_pb2 as pb
from gpumetrics.v1 import profiler_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from .conftest import TIMEOUT

HOLD_SERVICE = "gpumetrics.test.Hold"
HOLD_METHOD = f"/{HOLD_SERVICE}/Hold"


class Holder:
    """Holds every call it serves until :attr:`release` is set; counts them.

    ``dispatched`` counts the main server's Hold calls as grpcio looks up their handler: on its
    polling thread, which hands a call to the pool before it looks at the next one.
    """

    def __init__(self) -> None:
        self.release = threading.Event()
        self._cond = threading.Condition()
        self.inside = self.most = self.dispatched = 0

    def _wait(self, predicate: Any) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, TIMEOUT)

    def wait_inside(self, n: int) -> bool:
        return self._wait(lambda: self.inside >= n)

    def wait_dispatched(self, n: int) -> bool:
        return self._wait(lambda: self.dispatched >= n)

    def hold(self) -> None:
        with self._cond:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self._cond.notify_all()
        try:
            assert self.release.wait(TIMEOUT)
        finally:
            with self._cond:
                self.inside -= 1

    def handler(self) -> grpc.GenericRpcHandler:
        holder = self

        def serve(request: bytes, context: Any) -> bytes:
            holder.hold()
            return request

        method = grpc.unary_unary_rpc_method_handler(serve)

        class Lookup(grpc.GenericRpcHandler):
            def service(self, details: Any) -> Any:
                if details.method != HOLD_METHOD:
                    return None
                with holder._cond:
                    holder.dispatched += 1
                    holder._cond.notify_all()
                return method

        return Lookup()


class HoldingStore(DeclaredStore):
    """The real declared store, whose ``exit`` waits in ``holder`` first."""

    def __init__(self, holder: Holder) -> None:
        super().__init__()
        self._holder = holder

    def exit(self, pid: int, start_time_ticks: int = 0) -> int:
        self._holder.hold()
        return super().exit(pid, start_time_ticks)


class Rig:
    def __init__(self, directory: Path, **settings: Any) -> None:
        self.holder = Holder()
        self.main = f"unix://{directory / 'gm.sock'}"
        self.profiler = f"unix://{directory / 'profiler.sock'}"
        self.server = SidecarServer(
            ServerSettings(listen=[self.main], profiler_listen=[self.profiler], **settings),
            BatchStore(),
            HoldingStore(self.holder),
            SidecarHealth(),
            Telemetry(),
        )
        self.server.add_service(
            lambda s: s.add_generic_rpc_handlers([self.holder.handler()]),
            [HOLD_SERVICE],
            AuthPolicy.NONE,
        )
        self.server.start()
        self.channels: list[grpc.Channel] = []

    def channel(self, target: str) -> grpc.Channel:
        ch = grpc.insecure_channel(target)
        self.channels.append(ch)
        return ch

    def close(self) -> None:
        self.holder.release.set()
        for ch in self.channels:
            ch.close()
        self.server.stop(0)


@pytest.fixture
def rig(short_tmp: Path) -> Iterator[Any]:
    made: list[Rig] = []

    def make(**settings: Any) -> Rig:
        made.append(Rig(short_tmp, **settings))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _new_grpc_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """The threads of the sidecar's pools (named ``grpc-...``) started since ``before``."""
    return [t for t in threading.enumerate() if t.name.startswith("grpc-") and t not in before]


def test_unary_calls_of_both_listeners_share_one_pool_of_unary_workers(rig: Any) -> None:
    before = set(threading.enumerate())
    r = rig(unary_workers=2, reflection=False)
    declare = profiler_pb2_grpc.ProfilerIntegrationServiceStub(r.channel(r.profiler))
    hold = r.channel(r.main).unary_unary(HOLD_METHOD)
    with futures.ThreadPoolExecutor(4) as clients:
        try:
            exits = [
                clients.submit(
                    declare.ReportExits,
                    pb.ReportExitsRequest(exits=[pb.ProcessExit(pid=pid)]),
                    timeout=TIMEOUT,
                )
                for pid in (101, 102)
            ]
            assert r.holder.wait_inside(2)  # both unary threads hold a profiler-socket call
            first = clients.submit(hold, b"first", timeout=TIMEOUT)
            assert r.holder.wait_dispatched(1)
            second = clients.submit(hold, b"second", timeout=TIMEOUT)
            assert r.holder.wait_dispatched(2)  # so the first has been handed to a pool by now
            # ... to the same pool, whose two threads are busy: it waits, unread, and no thread
            # is started for it (a pool starts its threads in ``submit``: a second pool would)
            threads = sorted(t.name for t in _new_grpc_threads(before))
            assert len(threads) == 2, threads
            assert (r.holder.inside, r.holder.most) == (2, 2)
        finally:
            r.holder.release.set()
        assert [f.result(TIMEOUT).released for f in exits] == [0, 0]
        assert (first.result(TIMEOUT), second.result(TIMEOUT)) == (b"first", b"second")
    assert r.holder.most == 2


class ReflectionStream:
    """One ServerReflectionInfo stream of ``service`` (v1 or v1alpha), kept open."""

    def __init__(self, channel: grpc.Channel, service: str) -> None:
        self._out: queue.Queue[reflection_pb2.ServerReflectionRequest | None] = queue.Queue()
        call = channel.stream_stream(
            f"/{service}/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        self._responses = call(iter(self._out.get, None), timeout=TIMEOUT)

    def list_services(self) -> list[str]:
        self._out.put(reflection_pb2.ServerReflectionRequest(list_services=""))
        r = next(self._responses)
        return [s.name for s in r.list_services_response.service]

    def refused(self) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as err:
            self.list_services()
        self._out.put(None)
        return err.value

    def close(self) -> None:
        self._out.put(None)
        for _ in self._responses:
            pass


V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"
V1 = "grpc.reflection.v1.ServerReflection"


def test_a_services_stream_slots_are_shared_by_every_listener(rig: Any) -> None:
    r = rig(max_streams=1)
    main, profiler = r.channel(r.main), r.channel(r.profiler)
    held = ReflectionStream(main, V1ALPHA)
    assert "gpumetrics.v1.MetricsPullService" in held.list_services()  # holds the one slot
    for channel, service in ((profiler, V1ALPHA), (profiler, V1), (main, V1)):
        err = ReflectionStream(channel, service).refused()
        assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, (service, err.details())
        assert "server.max_streams, all listeners together" in (err.details() or "")
    held.close()
    assert r.server.wait_streams_closed(TIMEOUT)
    again = ReflectionStream(profiler, V1)  # the slot is free again, for either listener
    assert "gpumetrics.v1.ProfilerIntegrationService" in again.list_services()
    again.close()


def test_a_stopped_grpc_server_leaves_a_shared_pool_to_the_other(short_tmp: Path) -> None:
    """What the shared pool relies on: grpcio's ``stop`` never shuts down the pool it was given."""
    pool = futures.ThreadPoolExecutor(2)
    servers, targets = [], []
    from grpc_health.v1 import health

    try:
        for name in ("a", "b"):
            server = grpc.server(pool)
            health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
            target = f"unix:{short_tmp / name}.sock"
            server.add_insecure_port(target)
            server.start()
            servers.append(server)
            targets.append(target)
        servers[0].stop(None).wait()
        with grpc.insecure_channel(targets[1]) as ch:
            answer = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(), timeout=TIMEOUT
            )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        for server in servers:
            server.stop(None).wait()
        pool.shutdown(wait=True)


def test_stop_ends_the_shared_threads(rig: Any) -> None:
    before = set(threading.enumerate())
    r = rig(unary_workers=2)
    with grpc.insecure_channel(r.main) as main, grpc.insecure_channel(r.profiler) as prof:
        for ch in (main, prof):
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
        stream = ReflectionStream(prof, V1)
        stream.list_services()
        stream.close()
    threads = _new_grpc_threads(before)
    assert {t.name.rsplit("_", 1)[0] for t in threads} == {"grpc-unary", "grpc-ServerReflection"}
    r.server.stop(0)
    for t in threads:  # they end once their pools are shut down
        t.join(TIMEOUT)
    assert [t.name for t in threads if t.is_alive()] == []


def _upstream(relay: PeerCredRelay) -> socket.socket:
    """A plain listener where the relay connects (no gRPC needed to see a connection relayed)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(relay.target.removeprefix("unix:"))
    s.listen(8)
    s.settimeout(TIMEOUT)
    return s


def test_relayed_sockets_share_one_connection_limit(short_tmp: Path) -> None:
    telemetry = Telemetry()
    limit = ConnectionLimit(1)
    relays = [
        PeerCredRelay(str(short_tmp / f"{n}.sock"), 0o600, telemetry=telemetry, limit=limit)
        for n in ("p1", "p2")
    ]
    upstreams = [_upstream(relay) for relay in relays]
    clients: list[socket.socket] = []
    try:
        for relay in relays:
            relay.start()
        first = socket.socket(socket.AF_UNIX)
        clients.append(first)
        first.connect(relays[0].path)
        relayed, _ = upstreams[0].accept()  # the first relay took the one connection
        clients.append(relayed)
        second = socket.socket(socket.AF_UNIX)
        clients.append(second)
        second.settimeout(TIMEOUT)
        second.connect(relays[1].path)
        assert second.recv(1) == b""  # the other relay closed it at once
        refused = telemetry.value(
            "gpumetrics.server.refused_connections", {"reason": "too_many_connections"}
        )
        assert refused == 1
        assert limit.used == 1
    finally:
        for s in clients:
            s.close()
        for relay in relays:
            relay.stop()
        for s in upstreams:
            s.close()
    assert limit.used == 0
