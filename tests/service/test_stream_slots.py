"""Each streaming service has its own stream slots and threads (docs/security.md, "Threads").

Issue: four idle reflection streams, which anyone with a pull token (or anyone, without tokens)
may open, took every slot and ``StreamDeclarations`` was refused.
"""

from __future__ import annotations

import queue

import grpc
import pytest
from gpumetrics.v1 import profiler_pb2 as pb
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from .conftest import TIMEOUT, MakeSidecar, StreamClient


class ReflectionStream:
    """One ServerReflectionInfo stream, kept open after one answered request."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._out: queue.Queue = queue.Queue()
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        self._responses = stub.ServerReflectionInfo(iter(self._out.get, None), timeout=TIMEOUT)

    def list_services(self) -> list[str]:
        self._out.put(reflection_pb2.ServerReflectionRequest(list_services=""))
        r = next(self._responses)
        return [s.name for s in r.list_services_response.service]

    def close(self) -> None:
        self._out.put(None)
        for _ in self._responses:
            pass


def test_idle_reflection_streams_do_not_take_the_profilers_slots(sidecar: MakeSidecar) -> None:
    sc = sidecar(max_streams=4, unary_workers=2, append=1)
    channel = sc.channel()
    idle = [ReflectionStream(channel) for _ in range(4)]
    for stream in idle:  # each is running on the server, holding one of reflection's slots
        assert "gpumetrics.v1.ProfilerIntegrationService" in stream.list_services()
    assert sc.server.open_streams == 4
    declaring = StreamClient(sc.profiler_stub())
    assert declaring.send(declare=pb.ProcessDeclaration(pid=7)).accepted
    fifth = ReflectionStream(channel)  # reflection's own limit still holds
    with pytest.raises(grpc.RpcError) as err:
        fifth.list_services()
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "ServerReflection" in err.value.details()
    fifth._out.put(None)
    # unary calls have their own threads, several at once, while 5 streams are open
    assert sc.pull_concurrently(2) == [1, 1]
    declaring.close()
    for stream in idle:
        stream.close()
    assert sc.server.wait_streams_closed(TIMEOUT)
    assert sc.server.open_streams == 0
