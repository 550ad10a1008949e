"""The profiler service against the real gpumetrics.identity DeclaredStore (not the fake)."""

from __future__ import annotations

from gpumetrics.identity.declared import DeclaredStore, Resync
from gpumetrics.v1 import profiler_pb2 as pb
from opentelemetry.proto.resource.v1 import resource_pb2

from .conftest import TIMEOUT, MakeSidecar, StreamClient


def resource(**attrs: str) -> bytes:
    r = resource_pb2.Resource()
    for k, v in attrs.items():
        kv = r.attributes.add()
        kv.key, kv.value.string_value = k, v
    return r.SerializeToString()


def test_declare_then_lookup(sidecar: MakeSidecar) -> None:
    store = DeclaredStore()
    sc = sidecar(declared=store)
    resp = sc.profiler_stub().DeclareProcesses(
        pb.DeclareProcessesRequest(
            processes=[
                pb.ProcessDeclaration(
                    pid=4242,
                    start_time_ticks=987,
                    environment=[
                        pb.EnvironmentVariable(name="OTEL_SERVICE_NAME", value=b"trainer")
                    ],
                    profiler_resource=resource(
                        **{"service.name": "trainer-apm", "container.id": "c0ffee"}
                    ),
                ),
            ]
        ),
        metadata=(("gpumetrics-declarer", "parca-agent"),),
        timeout=TIMEOUT,
    )
    assert (resp.accepted, list(resp.rejected)) == (1, [])
    declared, ok = store.lookup(4242)
    assert ok and declared is not None
    assert declared.environment["OTEL_SERVICE_NAME"] == b"trainer"
    assert declared.profiler_attributes["service.name"] == "trainer-apm"
    assert (declared.start_time_ticks, declared.declarer) == (987, "parca-agent")
    assert sc.telemetry.value("gpumetrics.declarations") == 1


def test_real_store_rejections_are_prefixed_with_the_entry(sidecar: MakeSidecar) -> None:
    store = DeclaredStore()
    sc = sidecar(declared=store)
    resp = sc.profiler_stub().DeclareProcesses(
        pb.DeclareProcessesRequest(
            processes=[
                pb.ProcessDeclaration(
                    pid=1, environment=[pb.EnvironmentVariable(name="PATH=", value=b"/")]
                ),
                pb.ProcessDeclaration(pid=2, process_context=b"\xff\xff\xff"),
                pb.ProcessDeclaration(pid=3, profiler_resource=b"\x0a\x05"),
                pb.ProcessDeclaration(pid=4),
            ]
        ),
        timeout=TIMEOUT,
    )
    assert resp.accepted == 1
    assert [(r.index, r.field) for r in resp.rejected] == [
        (0, "processes[0].environment[0].name"),
        (1, "processes[1].process_context"),
        (2, "processes[2].profiler_resource"),
    ]
    assert [p for p in range(1, 5) if store.lookup(p)[1]] == [4]


def test_real_store_stream_resync_releases_what_was_not_redeclared(sidecar: MakeSidecar) -> None:
    store = DeclaredStore()
    sc = sidecar(declared=store)
    stream = StreamClient(sc.profiler_stub(), (("gpumetrics-declarer", "agent"),))
    for pid in (10, 11, 12):
        assert stream.send(declare=pb.ProcessDeclaration(pid=pid)).accepted
    assert stream.send(resync_begin=pb.ResyncBegin()).accepted
    assert stream.send(declare=pb.ProcessDeclaration(pid=11)).accepted
    bad = stream.send(
        declare=pb.ProcessDeclaration(
            pid=12, environment=[pb.EnvironmentVariable(name="NO=PE", value=b"")]
        )
    )
    assert bad.rejection.field == "declare.environment[0].name"
    end = stream.send(resync_end=pb.ResyncEnd())
    assert (end.accepted, end.released) == (True, 1)
    # 10 was not re-declared; 12's rejected re-declaration kept what it had
    assert [p for p in (10, 11, 12) if store.lookup(p)[1]] == [11, 12]
    stream.close()


def test_stream_ending_inside_a_resync_abandons_it_without_releasing(sidecar: MakeSidecar) -> None:
    import threading

    aborted = threading.Event()

    class Store(DeclaredStore):
        def abort_resync(self, resync: Resync) -> bool:
            result = super().abort_resync(resync)
            aborted.set()
            return result

    store = Store()
    sc = sidecar(declared=store)
    stream = StreamClient(sc.profiler_stub(), (("gpumetrics-declarer", "agent"),))
    for pid in (20, 21):
        assert stream.send(declare=pb.ProcessDeclaration(pid=pid)).accepted
    assert stream.send(resync_begin=pb.ResyncBegin()).accepted
    assert stream.send(declare=pb.ProcessDeclaration(pid=21)).accepted
    stream.close()  # the agent disconnects before ResyncEnd
    assert aborted.wait(TIMEOUT)
    assert [p for p in (20, 21) if store.lookup(p)[1]] == [20, 21]
    second = StreamClient(sc.profiler_stub(), (("gpumetrics-declarer", "agent"),))
    end = second.send(resync_end=pb.ResyncEnd())  # nothing left in progress
    assert not end.accepted and end.rejection.field == "resync_end"
    second.close()


SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"


def test_schema_url_reaches_the_store_by_every_path(sidecar: MakeSidecar) -> None:
    """Issue 27 item 5: profiler_resource_schema_url, on DeclareProcesses (plain and
    replace_all) and on the stream, is held with the declaration; too long is rejected by name."""
    store = DeclaredStore()
    sc = sidecar(declared=store)
    stub = sc.profiler_stub()
    res = resource(**{"container.id": "c0ffee"})

    def decl(pid: int, url: str = SCHEMA_URL) -> pb.ProcessDeclaration:
        return pb.ProcessDeclaration(
            pid=pid, profiler_resource=res, profiler_resource_schema_url=url
        )

    plain = stub.DeclareProcesses(
        pb.DeclareProcessesRequest(processes=[decl(1), decl(2, "x" * 2049), decl(3, "")]),
        timeout=TIMEOUT,
    )
    assert [(r.field, r.reason) for r in plain.rejected] == [
        ("processes[1].profiler_resource_schema_url", "2049 bytes exceed the limit of 2048")
    ]
    full = stub.DeclareProcesses(
        pb.DeclareProcessesRequest(processes=[decl(4)], replace_all=True),
        metadata=(("gpumetrics-declarer", "batch"),),
        timeout=TIMEOUT,
    )
    assert full.accepted == 1
    stream = StreamClient(stub, (("gpumetrics-declarer", "agent"),))
    assert stream.send(declare=decl(5)).accepted
    stream.close()
    held = {pid: store.lookup(pid)[0] for pid in (1, 2, 3, 4, 5)}
    assert {pid: d.schema_url if d else None for pid, d in held.items()} == {
        1: SCHEMA_URL,
        2: None,
        3: "",
        4: SCHEMA_URL,
        5: SCHEMA_URL,
    }
