"""A stopped SidecarServer leaves no thread of its own running (issue 28 item 11).

grpc's ``Server.stop`` cancels the calls but leaves the ``ThreadPoolExecutor`` workers that ran
them alive; the sidecar's unary and stream pools are joined by ``SidecarServer.stop``.
"""

from __future__ import annotations

import threading

import grpc
from gpumetrics.identity import DeclaredStore
from gpumetrics.selftelemetry import Telemetry
from gpumetrics.service import ServerSettings, SidecarHealth, SidecarServer
from gpumetrics.store import BatchStore
from gpumetrics.v1 import pull_pb2, pull_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..store.conftest import build_request


def ours(threads: set[threading.Thread]) -> list[str]:
    """The threads of the server's own pools (named grpc-<role>/grpc-<service>)."""
    return sorted(t.name for t in threads if t.is_alive() and t.name.startswith("grpc-"))


def test_stop_joins_the_threads_that_served_calls() -> None:
    before = set(threading.enumerate())
    store = BatchStore(telemetry=Telemetry())
    store.append(build_request(1, "b0"))
    health = SidecarHealth()
    server = SidecarServer(
        ServerSettings(listen=["127.0.0.1:0"], health_listen="127.0.0.1:0"),
        store,
        DeclaredStore(),
        health,
        Telemetry(),
    )
    server.start()
    health.mark_ready()
    address = server.addresses.listen[0]
    with grpc.insecure_channel(address) as channel:
        pull = pull_pb2_grpc.MetricsPullServiceStub(channel)
        assert pull.Pull(pull_pb2.PullRequest(consumer="t"), timeout=10).last_sequence == 1
        health_stub = health_pb2_grpc.HealthStub(channel)
        stream = health_stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
        during = ours(set(threading.enumerate()) - before)
        assert during, "the calls ran on no thread of the server's pools"
        server.stop(grace=0)
        stream.cancel()
    assert ours(set(threading.enumerate()) - before) == [], f"left running (of {during})"
