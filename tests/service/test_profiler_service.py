from __future__ import annotations

import grpc
import pytest
from gpumetrics.v1 import profiler_pb2 as pb

from .conftest import TIMEOUT, StreamClient


def decl(pid: int, start: int = 100, **env: bytes) -> pb.ProcessDeclaration:
    return pb.ProcessDeclaration(
        pid=pid,
        start_time_ticks=start,
        environment=[pb.EnvironmentVariable(name=k, value=v) for k, v in env.items()],
    )


def declarer_md(name: str) -> tuple[tuple[str, str], ...]:
    return (("gpumetrics-declarer", name),)


def test_declare_batch_applies_accepted_entries_and_names_rejected_fields(sidecar):
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
    assert sc.declared.held[10]["env"] == {"OTEL_SERVICE_NAME": b"trainer"}
    assert sc.declared.held[7]["env"] == {"OTEL_SERVICE_NAME": b"kept"}  # rejected: unchanged
    assert 11 in sc.declared.held
    assert sc.telemetry.value("gpumetrics.declarations.rejected", {"field": "pid"}) == 1
    assert (
        sc.telemetry.value("gpumetrics.declarations.rejected", {"field": "environment[].name"}) == 1
    )
    assert sc.telemetry.value("gpumetrics.declarations") == 3


def test_replace_all_releases_what_the_declarer_did_not_repeat(sidecar):
    sc = sidecar()
    stub = sc.profiler_stub()
    stub.DeclareProcesses(
        pb.DeclareProcessesRequest(processes=[decl(1), decl(2), decl(3)]),
        metadata=declarer_md("agent-a"),
        timeout=TIMEOUT,
    )
    stub.DeclareProcesses(
        pb.DeclareProcessesRequest(processes=[decl(9)]),
        metadata=declarer_md("agent-b"),
        timeout=TIMEOUT,
    )
    resp = stub.DeclareProcesses(
        pb.DeclareProcessesRequest(processes=[decl(2), decl(0)], replace_all=True),
        metadata=declarer_md("agent-a"),
        timeout=TIMEOUT,
    )
    assert (resp.accepted, resp.released) == (1, 2)
    assert [r.field for r in resp.rejected] == ["processes[1].pid"]
    assert sorted(sc.declared.held) == [2, 9]  # agent-b's process untouched


def test_report_exits(sidecar):
    sc = sidecar()
    stub = sc.profiler_stub()
    stub.DeclareProcesses(
        pb.DeclareProcessesRequest(processes=[decl(5, 50), decl(6, 60)]), timeout=TIMEOUT
    )
    resp = stub.ReportExits(
        pb.ReportExitsRequest(
            exits=[
                pb.ProcessExit(pid=5, start_time_ticks=50),
                pb.ProcessExit(pid=6, start_time_ticks=61),  # another process's start time: kept
                pb.ProcessExit(pid=0),
            ]
        ),
        timeout=TIMEOUT,
    )
    assert resp.released == 1
    assert [(r.index, r.field) for r in resp.rejected] == [(2, "exits[2].pid")]
    assert sorted(sc.declared.held) == [6]


def test_too_many_entries_is_refused_whole(sidecar):
    sc = sidecar(max_declarations_per_request=3)
    with pytest.raises(grpc.RpcError) as err:
        sc.profiler_stub().DeclareProcesses(
            pb.DeclareProcessesRequest(processes=[decl(p) for p in range(1, 5)]), timeout=TIMEOUT
        )
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details().startswith("processes: 4 entries exceed the limit of 3")
    assert len(sc.declared) == 0


def test_bad_declarer_metadata_is_invalid_argument(sidecar):
    sc = sidecar()
    with pytest.raises(grpc.RpcError) as err:
        sc.profiler_stub().DeclareProcesses(
            pb.DeclareProcessesRequest(processes=[decl(1)]),
            metadata=declarer_md("a b"),
            timeout=TIMEOUT,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("metadata gpumetrics-declarer:")
    assert len(sc.declared) == 0


def test_stream_declares_exits_and_resyncs(sidecar):
    sc = sidecar()
    stream = StreamClient(sc.profiler_stub(), declarer_md("agent"))
    assert stream.send(declare=decl(1)).accepted
    assert stream.send(declare=decl(2)).accepted
    assert stream.send(declare=decl(3)).accepted
    bad = stream.send(declare=decl(4, OTEL_OK=b"x", **{"HOME=": b"/root"}))
    assert not bad.accepted
    assert (bad.rejection.field, bad.rejection.pid) == ("declare.environment[1].name", 4)
    assert stream.send(exit=pb.ProcessExit(pid=3)).accepted
    assert stream.send(resync_begin=pb.ResyncBegin()).accepted
    assert stream.send(declare=decl(2)).accepted
    end = stream.send(resync_end=pb.ResyncEnd())
    assert (end.accepted, end.released) == (True, 1)  # pid 1 was not re-declared
    assert sorted(sc.declared.held) == [2]
    unset = stream.send()
    assert (unset.accepted, unset.rejection.field) == (False, "event")
    orphan = stream.send(resync_end=pb.ResyncEnd())
    assert (orphan.accepted, orphan.rejection.field) == (False, "resync_end")
    stream.close()
    assert sc.server.wait_streams_closed(TIMEOUT)
    assert sc.server.open_streams == 0


def test_streams_beyond_the_limit_are_refused_and_pull_is_not_starved(sidecar):
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
