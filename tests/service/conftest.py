"""Fixtures for the gRPC service tests: a real SidecarServer on loopback port 0 or a unix socket,
with the real stores (``BatchStore``, ``DeclaredStore`` without a procfs reader)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from gpumetrics.identity import Declared, DeclaredStore
from gpumetrics.selftelemetry import Telemetry
from gpumetrics.service import ServerSettings, SidecarHealth, SidecarServer
from gpumetrics.store import BatchStore, StoreLimits
from gpumetrics.v1 import profiler_pb2 as pb
from gpumetrics.v1 import profiler_pb2_grpc, pull_pb2, pull_pb2_grpc
from grpc_health.v1 import health_pb2_grpc

from ..store.conftest import build_request

TIMEOUT = 10.0  # bounds every call; never reached when the server is healthy


def assert_held(store: DeclaredStore, *pids: int) -> None:
    """Assert that ``store`` holds exactly the declarations of ``pids``."""
    assert len(store) == len(pids), f"{len(store)} declarations held, want {pids}"
    for pid in pids:
        assert store.lookup(pid)[1], f"pid {pid} is not declared"


def declared(store: DeclaredStore, pid: int) -> Declared:
    """The declaration ``store`` holds for ``pid`` (the test fails without one)."""
    d, ok = store.lookup(pid)
    assert ok and d is not None, f"pid {pid} is not declared"
    return d


class StreamClient:
    """Drives a StreamDeclarations call one message at a time (bounded waits, no sleeps)."""

    def __init__(
        self,
        stub: profiler_pb2_grpc.ProfilerIntegrationServiceStub,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self._out: queue.Queue[pb.StreamDeclarationsRequest | None] = queue.Queue()
        self._responses = stub.StreamDeclarations(
            iter(self._out.get, None), metadata=metadata, timeout=TIMEOUT
        )

    def send(self, **event: Any) -> pb.StreamDeclarationsResponse:
        self._out.put(pb.StreamDeclarationsRequest(**event))
        return next(self._responses)

    def close(self) -> None:
        self._out.put(None)
        for _ in self._responses:
            pass

    def abandon(self) -> None:
        self._out.put(None)  # ends the request iterator of a call that already failed


@dataclass
class Sidecar:
    server: SidecarServer
    store: BatchStore
    declared: DeclaredStore
    health: SidecarHealth
    telemetry: Telemetry
    channels: list[grpc.Channel] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.server.addresses.listen[0]

    def channel(
        self,
        address: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> grpc.Channel:
        target = address or self.address
        opts = list(options)
        if credentials is None:
            ch = grpc.insecure_channel(target, options=opts)
        else:
            ch = grpc.secure_channel(target, credentials, options=opts)
        self.channels.append(ch)
        return ch

    def pull_stub(self, **kw: Any) -> pull_pb2_grpc.MetricsPullServiceStub:
        return pull_pb2_grpc.MetricsPullServiceStub(self.channel(**kw))

    def profiler_stub(self, **kw: Any) -> profiler_pb2_grpc.ProfilerIntegrationServiceStub:
        return profiler_pb2_grpc.ProfilerIntegrationServiceStub(self.channel(**kw))

    def health_stub(self, **kw: Any) -> health_pb2_grpc.HealthStub:
        return health_pb2_grpc.HealthStub(self.channel(**kw))

    def pull_concurrently(self, n: int) -> list[int]:
        """``n`` Pulls at once (released together by a barrier); the data points of each."""
        results: list[int] = []
        barrier = threading.Barrier(n)

        def puller() -> None:
            barrier.wait(timeout=TIMEOUT)
            r = self.pull_stub().Pull(pull_pb2.PullRequest(consumer="p"), timeout=TIMEOUT)
            results.append(r.data_points)

        threads = [threading.Thread(target=puller) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=TIMEOUT)
        return results

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        self.server.stop(0)


MakeSidecar = Callable[..., Sidecar]
"""The ``sidecar`` fixture: ``sidecar(store=, declared=, ready=, limits=, append=, **settings)``."""


@pytest.fixture
def sidecar() -> Iterator[MakeSidecar]:
    """Factory: build, start (and at teardown stop) a SidecarServer with its collaborators."""
    made: list[Sidecar] = []

    def make(
        *,
        store: BatchStore | None = None,
        declared: DeclaredStore | None = None,
        ready: bool = True,
        limits: StoreLimits | None = None,
        append: int = 0,
        **settings: Any,
    ) -> Sidecar:
        settings.setdefault("listen", ["127.0.0.1:0"])
        # The servicer tests declare on the main loopback listener, as a single-user host may
        # (server.allow_unauthenticated_declare); never on the machine's default socket.
        if "profiler_listen" not in settings:
            settings["profiler_listen"] = []
            settings.setdefault("allow_unauthenticated_declare", True)
        telemetry = Telemetry()
        store = store or BatchStore(limits, telemetry=telemetry)
        for i in range(append):
            store.append(build_request(1, f"b{i}"))
        declared = declared if declared is not None else DeclaredStore()
        health = SidecarHealth()
        server = SidecarServer(ServerSettings(**settings), store, declared, health, telemetry)
        server.start()
        if ready:
            health.mark_ready()
        sc = Sidecar(server, store, declared, health, telemetry)
        made.append(sc)
        return sc

    yield make
    for sc in made:
        sc.close()


@pytest.fixture
def short_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A short temporary directory (unix socket paths are limited to 107 bytes)."""
    import os
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="gm-", dir="/tmp")
    os.chmod(d, 0o700)
    try:
        from pathlib import Path

        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
