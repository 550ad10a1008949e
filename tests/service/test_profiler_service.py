from __future__ import annotations

import grpc
import pytest
from gpumetrics.v1 import profiler_pb2 as pb

from .conftest import TIMEOUT, MakeSidecar, StreamClient, assert_held, declared


def decl(pid: int, start: int = 100, **env: bytes) -> pb.ProcessDeclaration:
    return pb.ProcessDeclaration(
        pid=pid,
        start_time_ticks=start,
        environment=[pb.EnvironmentVariable(name=k, value=v) for k, v in env.items()],
    )


def declarer_md(name: str) -> tuple[tuple[str, str], ...]:
    return (("gpumetrics-declarer", name),)


def test_declare_batch_applies_accepted_entries_and_names_rejected_fields(
    sidecar: MakeSidecar,
) -> None:
    sc = sidecar()
    sc.declared.declare(7, 1, b"", [("OTEL_SERVICE_NAME", b"kept")], b"")
    resp = sc.profiler_stub().DeclareProcesses(
        pb.DeclareProcessesRequest(
            processes=[
                decl(10, OTEL_SERVICE_NAME=b"trainer"),
                decl(0),  # bad pid
                pb.ProcessDeclaration(
                    pid=7,
                    environment=[
                        pb.EnvironmentVariable(name="OTEL_SERVICE_NAME", value=b"new"),
                        pb.EnvironmentVariable(name="PATH=", value=b"/bin"),
                    ],
                ),
                decl(11),
            ]
        ),
        timeout=TIMEOUT,
    )
    assert resp.accepted == 2
    assert [(r.index, r.pid, r.field) for r in resp.rejected] == [
        (1, 0, "processes[1].pid"),
        (2, 7, "processes[2].environment[1].name"),
    ]
    assert all(r.reason for r in resp.rejected)
    assert declared(sc.declared, 10).environment == {"OTEL_SERVICE_NAME": b"trainer"}
    # rejected: unchanged
    assert declared(sc.declared, 7).environment == {"OTEL_SERVICE_NAME": b"kept"}
    assert_held(sc.declared, 7, 10, 11)
    assert sc.telemetry.value("gpumetrics.declarations.rejected", {"field": "pid"}) == 1
    assert (
        sc.telemetry.value("gpumetrics.declarations.rejected", {"field": "environment[].name"}) == 1
    )
    assert sc.telemetry.value("gpumetrics.declarations") == 3


def test_stream_declares_exits_and_resyncs(sidecar: MakeSidecar) -> None:
    sc = sidecar()
    stream = StreamClient(sc.profiler_stub(), declarer_md("agent"))
    assert stream.send(declare=decl(1)).accepted
    assert stream.send(declare=decl(2)).accepted
    assert stream.send(declare=decl(3)).accepted
    bad = stream.send(declare=decl(4, 100, OTEL_OK=b"x", **{"HOME=": b"/root"}))
    assert not bad.accepted
    assert (bad.rejection.field, bad.rejection.pid) == ("declare.environment[1].name", 4)
    assert stream.send(exit=pb.ProcessExit(pid=3)).accepted
    assert stream.send(resync_begin=pb.ResyncBegin()).accepted
    assert stream.send(declare=decl(2)).accepted
    end = stream.send(resync_end=pb.ResyncEnd())
    assert (end.accepted, end.released) == (True, 1)  # pid 1 was not re-declared
    assert_held(sc.declared, 2)
    unset = stream.send()
    assert (unset.accepted, unset.rejection.field) == (False, "event")
    orphan = stream.send(resync_end=pb.ResyncEnd())
    assert (orphan.accepted, orphan.rejection.field) == (False, "resync_end")
    stream.close()
    assert sc.server.wait_streams_closed(TIMEOUT)
    assert sc.server.open_streams == 0


def test_streams_beyond_the_limit_are_refused_and_pull_is_not_starved(sidecar: MakeSidecar) -> None:
    sc = sidecar(max_streams=2, unary_workers=2, append=1)
    stub = sc.profiler_stub()
    open_streams = [StreamClient(stub) for _ in range(2)]
    for s in open_streams:
        assert s.send(declare=decl(1)).accepted  # both are running, each on a worker thread
    refused = StreamClient(stub)
    with pytest.raises(grpc.RpcError) as err:
        refused.send(declare=decl(2))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    refused.abandon()
    # both remaining workers still answer unary calls, several at once
    assert sc.pull_concurrently(2) == [1, 1]
    assert (
        sc.telemetry.value(
            "gpumetrics.server.rejected_calls",
            {
                "rpc.method": "gpumetrics.v1.ProfilerIntegrationService/StreamDeclarations",
                "reason": "too_many_streams",
            },
        )
        == 1
    )
    for s in open_streams:
        s.close()
    assert sc.server.wait_streams_closed(TIMEOUT)
    again = StreamClient(stub)
    assert again.send(declare=decl(3)).accepted  # slots were given back
    again.close()
