"""Who may declare: the profiler service on a unix socket knows each caller's SO_PEERCRED.

Issue 23 item 2: on the default listener any local user could declare any pid. Now the
profiler service is on its own unix socket; a caller that is not root, the sidecar's user or a
trusted uid/gid may declare only its own processes, with only the observed keys the sidecar
sees, and its resynchronisations cannot release anyone else's declarations. The caller as
another user is a real child process that drops to uid 65534 (nobody) and calls through grpcio.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpumetrics.identity import DeclaredStore, is_observed_key, process_observer
from gpumetrics.selftelemetry import Telemetry
from gpumetrics.service import ServerSettings, SidecarHealth, SidecarServer
from gpumetrics.service.declarers import Observation
from gpumetrics.service.gate import join_pool
from gpumetrics.service.peercred import PeerCredentials, PeerCredRelay, peer_credentials
from gpumetrics.service.profiler import ProfilerServicer
from gpumetrics.store import BatchStore
from gpumetrics.v1 import profiler_pb2 as pb
from gpumetrics.v1 import profiler_pb2_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ..identity.fakeproc import resource_bytes
from .conftest import TIMEOUT

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as nobody")


# -- the relay on its own ---------------------------------------------------------------------


class _Peers(grpc.ServerInterceptor):
    """Records what the relay says about each call's peer."""

    def __init__(self, relay: PeerCredRelay) -> None:
        self.relay = relay
        self.seen: list[PeerCredentials | None] = []

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        def unary(request: Any, context: Any) -> Any:
            self.seen.append(self.relay.lookup(context.peer()))
            return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary, handler.request_deserializer, handler.response_serializer
        )


Relayed = tuple[PeerCredRelay, "_Peers", str, Telemetry]
ProfilerSocket = tuple[SidecarServer, DeclaredStore, Telemetry, str]


@pytest.fixture
def relayed(short_tmp: Path) -> Iterator[Relayed]:
    path = str(short_tmp / "relayed.sock")
    telemetry = Telemetry()
    relay = PeerCredRelay(path, 0o600, max_connections=2, telemetry=telemetry)
    peers = _Peers(relay)
    pool = futures.ThreadPoolExecutor(2)
    server = grpc.server(
        pool,
        interceptors=[peers],
        options=[("grpc.max_receive_message_length", 32 << 20)],
    )
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_insecure_port(relay.target)
    server.start()
    relay.start()
    try:
        yield relay, peers, path, telemetry
    finally:
        relay.stop_accepting()
        server.stop(0).wait()
        relay.stop()
        assert join_pool(pool, time.monotonic() + 10), "the server's threads did not end"


def test_grpcio_alone_tells_nothing_about_a_unix_peer(short_tmp: Path) -> None:
    """Why the relay exists: without it a call's peer is ``unix:`` and no credentials."""
    seen: dict[str, Any] = {}

    class Record(grpc.ServerInterceptor):
        def intercept_service(self, continuation: Any, details: Any) -> Any:
            handler = continuation(details)

            def unary(request: Any, context: Any) -> Any:
                seen.update(peer=context.peer(), auth=context.auth_context())
                return handler.unary_unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer
            )

    pool = futures.ThreadPoolExecutor(1)
    server = grpc.server(pool, interceptors=[Record()])
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_insecure_port(f"unix:{short_tmp}/plain.sock")
    server.start()
    with grpc.insecure_channel(f"unix:{short_tmp}/plain.sock") as ch:
        health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
    server.stop(0).wait()
    assert join_pool(pool, time.monotonic() + 10), "the server's threads did not end"
    assert seen["peer"] == "unix:"
    assert set(seen["auth"]) == {"transport_security_type", "security_level"}


def test_the_relay_names_each_calls_peer_and_carries_large_messages(relayed: Relayed) -> None:
    relay, peers, path, _ = relayed
    with grpc.insecure_channel(
        f"unix:{path}", options=[("grpc.max_send_message_length", 32 << 20)]
    ) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT).status == 1
        with pytest.raises(grpc.RpcError) as err:  # 20 MiB through the relay, byte for byte
            stub.Check(health_pb2.HealthCheckRequest(service="x" * (20 << 20)), timeout=TIMEOUT)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert relay.connections == 1
    me = PeerCredentials(os.getpid(), os.geteuid(), os.getegid())
    assert peers.seen == [me, me]
    assert relay.lookup("unix:") is None and relay.lookup("ipv4:127.0.0.1:1") is None
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_peer_credentials_of_a_socketpair() -> None:
    a, b = socket.socketpair()
    try:
        assert peer_credentials(a) == PeerCredentials(os.getpid(), os.geteuid(), os.getegid())
    finally:
        a.close()
        b.close()


def test_connections_beyond_the_limit_are_closed_and_counted(relayed: Relayed) -> None:
    relay, _, path, telemetry = relayed
    held = []
    try:
        for _ in range(2):
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # the HTTP/2 preface: a live client
            held.append(s)
        # the relay registers a connection when it accepts it; a third is refused
        with grpc.insecure_channel(f"unix:{path}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert err.value.code() in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )
        refused = telemetry.value(
            "gpumetrics.server.refused_connections", {"reason": "too_many_connections"}
        )
        assert refused is not None and refused >= 1
    finally:
        for s in held:
            s.close()


# -- the sidecar's server, with a caller of another uid -----------------------------------------


class NobodyClient:
    """The child of ``nobody_client.py``: one JSON request per call, as uid 65534."""

    def __init__(self, socket_path: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("nobody_client.py")), socket_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        hello = self._line()
        self.pid, self.uid = hello["pid"], hello["uid"]

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the child ended: {self.proc.communicate(timeout=TIMEOUT)[1]}")
        out: dict[str, Any] = json.loads(line)
        return out

    def call(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._line()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=TIMEOUT)


@pytest.fixture
def profiler_socket(
    short_tmp: Path,
) -> Iterator[tuple[SidecarServer, DeclaredStore, Telemetry, str]]:
    """A SidecarServer whose profiler service is on a unix socket every user may connect to."""
    os.chmod(short_tmp, 0o755)  # nobody must reach the socket: its mode is the test's subject
    path = str(short_tmp / "profiler.sock")
    settings = ServerSettings(
        listen=["127.0.0.1:0"], profiler_listen=[f"unix:{path}"], unix_socket_mode=0o666
    )
    declared, telemetry = DeclaredStore(), Telemetry()
    server = SidecarServer(
        settings,
        BatchStore(),
        declared,
        SidecarHealth(),
        telemetry,
        observation=Observation(is_observed_key, process_observer("/proc")),
    )
    server.start()
    try:
        yield server, declared, telemetry, path
    finally:
        server.stop(0)


@pytest.fixture
def nobody(profiler_socket: ProfilerSocket) -> Iterator[NobodyClient]:
    client = NobodyClient(profiler_socket[3])
    try:
        yield client
    finally:
        client.close()


def _declare(*entries: dict[str, Any], replace_all: bool = False) -> dict[str, Any]:
    return {"processes": list(entries), "replaceAll": replace_all}


def _root_declare(path: str, *pids: int, declarer: str = "ebpf-profiler") -> None:
    with grpc.insecure_channel(f"unix:{path}") as ch:
        stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(ch)
        resp = stub.DeclareProcesses(
            pb.DeclareProcessesRequest(
                processes=[
                    pb.ProcessDeclaration(
                        pid=pid, profiler_resource=resource_bytes({"k8s.pod.name": "real-pod"})
                    )
                    for pid in pids
                ]
            ),
            metadata=(("gpumetrics-declarer", declarer),),
            timeout=TIMEOUT,
        )
    assert resp.accepted == len(pids) and not resp.rejected  # root is trusted: any pid, any key


@needs_root
def test_nobody_cannot_declare_another_users_process(
    profiler_socket: ProfilerSocket, nobody: NobodyClient
) -> None:
    _, declared, telemetry, _ = profiler_socket
    assert nobody.uid == NOBODY
    forged = resource_bytes({"host.name": "x", "container.id": "y"})
    import base64

    resp = nobody.call(
        declare=_declare({"pid": 1, "profilerResource": base64.b64encode(forged).decode()})
    )
    assert resp["accepted"] == 0
    (rejection,) = resp["rejected"]
    assert rejection["field"] == "processes[0].pid"
    assert rejection["reason"].startswith(
        "pid 1 belongs to uid 0, not to this peer (uid 65534); only root, the sidecar's own user "
        "and server.trusted_declarer_uids / server.trusted_declarer_gids may declare"
    )
    assert declared.lookup(1) == (None, False)
    assert telemetry.value("gpumetrics.declarations.refused", {"reason": "not_owner"}) == 1


@needs_root
def test_nobody_may_name_its_own_process_but_not_move_it(
    profiler_socket: ProfilerSocket, nobody: NobodyClient
) -> None:
    import base64

    _, declared, telemetry, _ = profiler_socket
    own = {"service.name": "mine", "process.pid": nobody.pid}
    exe = os.readlink(f"/proc/{nobody.pid}/exe")
    own["process.executable.path"] = exe  # what the sidecar sees too: accepted
    resp = nobody.call(
        declare=_declare(
            {"pid": "$self", "profilerResource": base64.b64encode(resource_bytes(own)).decode()}
        )
    )
    assert resp["accepted"] == 1 and resp["rejected"] == [], resp
    d, ok = declared.lookup(nobody.pid)
    assert ok and d is not None and d.profiler_attributes["service.name"] == "mine"

    moved = {"service.name": "mine", "k8s.pod.name": "victim-pod"}
    resp = nobody.call(
        declare=_declare(
            {"pid": "$self", "profilerResource": base64.b64encode(resource_bytes(moved)).decode()}
        )
    )
    (rejection,) = resp["rejected"]
    assert rejection["field"] == "processes[0].profiler_resource"
    assert rejection["reason"].startswith(
        f"attribute k8s.pod.name='victim-pod' is observed identity that the sidecar does not see "
        f"for pid {nobody.pid}; only root"
    )
    assert telemetry.value("gpumetrics.declarations.refused", {"reason": "observed_attribute"}) == 1
    # counted under the field, whatever key the caller chose: a bounded set of series
    assert telemetry.value("gpumetrics.declarations.rejected", {"field": "profiler_resource"}) == 1
    d, _ = declared.lookup(nobody.pid)
    assert d is not None and "k8s.pod.name" not in d.profiler_attributes  # the first one stands


@needs_root
def test_a_declare_batch_is_checked_entry_by_entry(
    profiler_socket: ProfilerSocket, nobody: NobodyClient
) -> None:
    """A stream's DeclareBatch (issue 24) gets each entry the checks a declare event gets: nobody
    declares its own process in it, not pid 1, nor an observed key it does not have."""
    import base64

    _, declared, telemetry, _ = profiler_socket
    own = base64.b64encode(resource_bytes({"service.name": "mine"})).decode()
    moved = base64.b64encode(resource_bytes({"k8s.pod.name": "victim-pod"})).decode()
    batch = {
        "processes": [
            {"pid": "$self", "profilerResource": own},
            {"pid": 1, "profilerResource": own},
            {"pid": "$self", "profilerResource": moved},
        ]
    }
    resp = nobody.call(stream=[{"declareBatch": batch}])
    ((answer),) = resp["stream"]
    assert answer.get("accepted", False) is False and answer["declared"] == 1
    got = [(r.get("index", 0), r["field"]) for r in answer["rejections"]]
    assert got == [
        (1, "declare_batch.processes[1].pid"),
        (2, "declare_batch.processes[2].profiler_resource"),
    ]
    assert answer["rejections"][0]["reason"].startswith(
        "pid 1 belongs to uid 0, not to this peer (uid 65534)"
    )
    assert declared.lookup(1) == (None, False)
    d, ok = declared.lookup(nobody.pid)
    assert ok and d is not None and d.profiler_attributes == {"service.name": "mine"}
    assert telemetry.value("gpumetrics.declarations.refused", {"reason": "not_owner"}) == 1
    assert telemetry.value("gpumetrics.declarations.refused", {"reason": "observed_attribute"}) == 1


@needs_root
def test_nobody_cannot_release_a_trusted_profilers_declarations(
    profiler_socket: ProfilerSocket, nobody: NobodyClient
) -> None:
    server, declared, telemetry, path = profiler_socket
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                               stdin=subprocess.PIPE)  # fmt: skip
    try:
        _root_declare(path, 1, sleeper.pid)
        # the same declarer name, replace_all with nothing: would release the profiler's view
        resp = nobody.call(declare=_declare(replace_all=True), declarer="ebpf-profiler")
        assert resp["released"] == 0
        # a stream's resync likewise
        resp = nobody.call(
            stream=[{"resyncBegin": {}}, {"resyncEnd": {}}], declarer="ebpf-profiler"
        )
        assert resp["stream"][1] == {"accepted": True}  # released nothing (0 is not printed)
        # the exit of a running process of another user
        resp = nobody.call(exits={"exits": [{"pid": sleeper.pid}]})
        assert resp["released"] == 0
        assert resp["rejected"][0]["field"] == "exits[0].pid"
        assert f"pid {sleeper.pid} is running as uid 0" in resp["rejected"][0]["reason"]
        assert declared.lookup(1)[1] and declared.lookup(sleeper.pid)[1]
    finally:
        sleeper.communicate(b"", timeout=TIMEOUT)
    # once it is gone, anyone may report the exit: it releases only what that pid held
    resp = nobody.call(exits={"exits": [{"pid": sleeper.pid}]})
    assert resp["released"] == 1 and resp["rejected"] == []
    assert telemetry.value("gpumetrics.declarations.refused", {"reason": "not_owner"}) == 1


@needs_root
def test_a_trusted_uid_may_declare_any_process(short_tmp: Path) -> None:
    os.chmod(short_tmp, 0o755)
    path = str(short_tmp / "trusted.sock")
    settings = ServerSettings(
        listen=["127.0.0.1:0"],
        profiler_listen=[f"unix:{path}"],
        unix_socket_mode=0o666,
        trusted_declarer_uids=[NOBODY],
    )
    declared = DeclaredStore()
    server = SidecarServer(settings, BatchStore(), declared, SidecarHealth())
    server.start()
    client = NobodyClient(path)
    try:
        resp = client.call(declare=_declare({"pid": 1}))
        assert resp["accepted"] == 1 and resp["rejected"] == []
        assert declared.lookup(1)[1]
    finally:
        client.close()
        server.stop(0)


def test_a_unix_peer_no_relay_knows_is_refused(short_tmp: Path) -> None:
    """Fail closed: the servicer on a unix socket without a relay (never so in the sidecar)."""
    telemetry = Telemetry()
    pool = futures.ThreadPoolExecutor(1)
    server = grpc.server(pool)
    profiler_pb2_grpc.add_ProfilerIntegrationServiceServicer_to_server(
        ProfilerServicer(DeclaredStore(), telemetry), server
    )
    server.add_insecure_port(f"unix:{short_tmp}/bare.sock")
    server.start()
    try:
        with grpc.insecure_channel(f"unix:{short_tmp}/bare.sock") as ch:
            stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                stub.DeclareProcesses(
                    pb.DeclareProcessesRequest(processes=[pb.ProcessDeclaration(pid=1)]),
                    timeout=TIMEOUT,
                )
    finally:
        server.stop(0).wait()
        assert join_pool(pool, time.monotonic() + 10), "the server's threads did not end"
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "credentials are unknown" in (err.value.details() or "")
    assert telemetry.value("gpumetrics.declarations.refused", {"reason": "unknown_peer"}) == 1


def test_the_default_puts_the_profiler_on_its_own_unix_socket() -> None:
    s = ServerSettings()
    assert s.listen == ["127.0.0.1:4319"]
    from gpumetrics.service.settings import default_profiler_socket

    assert s.profiler_listen == [f"unix://{default_profiler_socket()}"]
    assert not s.serves_profiler_on_listen


def test_the_socket_threads_end_with_the_server(profiler_socket: ProfilerSocket) -> None:
    server = profiler_socket[0]
    names = {t.name for t in threading.enumerate()}
    assert any(n.startswith("peercred-") for n in names)
    server.stop(0)
    assert not any(t.name.startswith("peercred-") for t in threading.enumerate())
