"""Property tests: profiler declarations with defects, through the real gRPC server and store.

Each example is a ``DeclareProcesses`` request (or the same entries on ``StreamDeclarations``)
of 1–4 entries. Every entry starts clean and gets at most one injected defect, so the oracle
knows the answer: a clean entry is accepted; an entry with a defect is rejected with a
``Rejection`` whose ``field`` is exactly the defective field (``processes[i].environment[2].name``)
and whose reason is not empty. A model of what the store must hold is updated from the answers
(later entries for the same pid win) and compared with ``DeclaredStore.lookup`` after every
request: rejected entries change nothing, good processes declared before stay intact, and the
next batch (which carries a point for every declared pid) is still produced and carries each
accepted declaration's ``service.name``.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass

import grpc
from gpumetrics.identity import encode_process_context
from gpumetrics.v1 import profiler_pb2 as ppb
from gpumetrics.v1 import pull_pb2
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from .conftest import hypothesis_settings
from .rig import GOOD_PIDS, TIMEOUT, good_declaration

PID_MAX = 4_194_304
ATTACK_PIDS = st.one_of(st.integers(1, 40), st.sampled_from(GOOD_PIDS))
"""Mostly a small pool, so entries replace each other; sometimes a good pid."""

_bad_env_names = st.one_of(
    st.sampled_from(["", "=", "PATH=", "OTEL_A=B", "=OTEL_A"]),
    st.tuples(st.text(max_size=6), st.text(max_size=6)).map(lambda t: f"{t[0]}={t[1]}"),
    st.text(max_size=6).map(lambda t: f"{t}\x00"),
)
"""Names a variable cannot have (empty, or with '=' or NUL); any other name is a captured
variable (a profiler's -env-vars are not only OTEL_*)."""
_scalar = st.one_of(
    st.text(max_size=8).map(lambda s: common_pb2.AnyValue(string_value=s)),
    st.integers(-(2**63), 2**63 - 1).map(lambda i: common_pb2.AnyValue(int_value=i)),
    st.floats(allow_nan=True).map(lambda f: common_pb2.AnyValue(double_value=f)),
    st.booleans().map(lambda b: common_pb2.AnyValue(bool_value=b)),
    st.binary(max_size=8).map(lambda b: common_pb2.AnyValue(bytes_value=b)),
    st.just(common_pb2.AnyValue()),  # no value set
)


def _wrap(children: list[tuple[str, common_pb2.AnyValue]], as_list: bool) -> common_pb2.AnyValue:
    v = common_pb2.AnyValue()
    if as_list:
        v.array_value.values.extend(c for _, c in children)
    else:
        for k, c in children:
            v.kvlist_value.values.add(key=k).value.CopyFrom(c)
    return v


any_values = st.recursive(
    _scalar,
    lambda inner: st.builds(
        _wrap, st.lists(st.tuples(st.text(max_size=6), inner), max_size=3), st.booleans()
    ),
    max_leaves=8,
)
keys = st.text(max_size=12).filter(lambda k: k != "service.name")
"""Resource keys; "" included (raw protobuf may carry it; decoding drops it)."""
context_keys = keys.filter(bool)
"""encode_process_context (the test publisher) refuses an empty key, as OTLP does."""
resources = st.lists(st.tuples(keys, any_values), max_size=4).map(lambda kvs: _resource(kvs))


def _resource(kvs: list[tuple[str, common_pb2.AnyValue]]) -> bytes:
    res = resource_pb2.Resource()
    for k, v in kvs:
        res.attributes.add(key=k).value.CopyFrom(v)
    return res.SerializeToString()


def _undecodable(data: bytes, kind: str) -> bool:
    from gpumetrics.identity import ProcessContextDecodeError, decode_process_context

    try:
        if kind == "process_context":
            decode_process_context(data)
        else:
            resource_pb2.Resource.FromString(data)
    except (ProcessContextDecodeError, Exception):  # noqa: BLE001 - any decode failure
        return True
    return False


@dataclass(frozen=True)
class Entry:
    """One declaration and the field its defect must be reported under (None: clean)."""

    msg: ppb.ProcessDeclaration
    defect: str | None


@st.composite
def entries(draw: st.DrawFn) -> Entry:
    pid = draw(ATTACK_PIDS)
    env = [("OTEL_SERVICE_NAME", f"svc-{pid}-{draw(st.integers(0, 9))}".encode())]
    env += draw(
        st.lists(
            st.tuples(
                st.from_regex(r"OTEL_[A-Z0-9_]{1,8}", fullmatch=True), st.binary(max_size=16)
            ),
            max_size=3,
            unique_by=lambda t: t[0],
        ).map(lambda kvs: [(n, v.replace(b"\0", b"")) for n, v in kvs if n != "OTEL_SERVICE_NAME"])
    )
    ctx = draw(
        st.one_of(
            st.just(b""),
            st.dictionaries(context_keys, st.text(max_size=8), max_size=3).map(
                encode_process_context
            ),
        )
    )
    res = draw(st.one_of(st.just(b""), resources))
    if res and draw(st.booleans()):
        res += _resource([("service.name", common_pb2.AnyValue(string_value=f"svc-{pid}"))])
    ticks = draw(st.integers(0, 2**64 - 1))
    kind = draw(
        st.sampled_from(
            [
                None,
                None,
                "pid",
                "env_name",
                "env_dup",
                "env_nul",
                "env_many",
                "ctx",
                "ctx_big",
                "res",
                "res_big",
            ]
        )
    )
    defect = None
    if kind == "pid":
        pid = draw(st.sampled_from([0, PID_MAX + 1, 2**32 - 1]))
        defect = "pid"
    elif kind == "env_name":
        i = draw(st.integers(0, len(env)))
        env.insert(i, (draw(_bad_env_names), b"v"))
        defect = f"environment[{i}].name"
    elif kind == "env_dup":
        env.append((env[0][0], b"again"))
        defect = f"environment[{len(env) - 1}].name"
    elif kind == "env_nul":
        i = draw(st.integers(0, len(env) - 1))
        env[i] = (env[i][0], env[i][1] + b"\0x")
        defect = f"environment[{i}].value"
    elif kind == "env_many":
        env += [(f"OTEL_N{i}", b"") for i in range(257)]
        defect = "environment"
    elif kind == "ctx":
        ctx = draw(
            st.binary(min_size=1, max_size=64).filter(lambda b: _undecodable(b, "process_context"))
        )
        defect = "process_context"
    elif kind == "ctx_big":
        ctx = b"\x0a\x00" * 32769
        defect = "process_context"
    elif kind == "res":
        res = draw(st.binary(min_size=1, max_size=64).filter(lambda b: _undecodable(b, "resource")))
        defect = "profiler_resource"
    elif kind == "res_big":
        res = b"\x0a\x00" * 32769
        defect = "profiler_resource"
    msg = ppb.ProcessDeclaration(
        pid=pid,
        start_time_ticks=ticks,
        process_context=ctx,
        environment=[ppb.EnvironmentVariable(name=n, value=v) for n, v in env],
        profiler_resource=res,
    )
    return Entry(msg, defect)


def _service(msg: ppb.ProcessDeclaration) -> str:
    """The ``service.name`` of the declaration's profiler resource ("" without one): in the
    default profiler mode the declared resource is the process's GPU resource."""
    res = resource_pb2.Resource.FromString(msg.profiler_resource)
    return next((kv.value.string_value for kv in res.attributes if kv.key == "service.name"), "")


def _check_store(rig, model: dict[int, ppb.ProcessDeclaration]) -> None:
    for pid, msg in model.items():
        d, ok = rig.declared.lookup(pid)
        assert ok and d is not None, f"pid {pid} lost"
        assert d.start_time_ticks == msg.start_time_ticks
        assert d.environment == {e.name: e.value for e in msg.environment}
        assert d.has_process_context == bool(msg.process_context)


class Checker:
    """A pull consumer that acknowledges each answer, so the next one holds only new batches."""

    def __init__(self, rig) -> None:
        self.stub = rig.pull_stub()
        self.acked, self.epoch = 0, ""
        self.pull()

    def pull(self) -> pull_pb2.PullResponse:
        resp = self.stub.Pull(
            pull_pb2.PullRequest(consumer="checker", ack_sequence=self.acked, ack_epoch=self.epoch),
            timeout=TIMEOUT,
        )
        self.epoch = resp.epoch
        self.acked = resp.last_sequence or self.acked
        return resp


def _check_batch(rig, checker: Checker, model: dict[int, ppb.ProcessDeclaration]) -> None:
    """The next batch is produced, and each declared pid's resource has the service.name of
    its declared profiler resource."""
    seq = rig.batch(model)
    resp = checker.pull()
    assert resp.first_sequence == resp.last_sequence == seq
    req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(
        resp.export_metrics_service_request
    )
    seen: dict[int, str] = {}
    for rm in req.resource_metrics:
        attrs = {kv.key: kv.value for kv in rm.resource.attributes}
        if "process.pid" in attrs:
            name = attrs.get("service.name")
            seen[attrs["process.pid"].int_value] = name.string_value if name is not None else ""
    for pid, msg in model.items():
        assert seen.get(pid) == _service(msg), (pid, seen.get(pid))


def _apply(model, batch: list[Entry], rejected: dict[int, ppb.Rejection]) -> None:
    for i, e in enumerate(batch):
        r = rejected.get(i)
        if e.defect is None:
            assert r is None, f"clean entry {i} rejected: {r}"
            model[e.msg.pid] = e.msg
        else:
            assert r is not None, f"entry {i} with a bad {e.defect} was accepted"
            assert r.field == f"processes[{i}].{e.defect}", (r.field, e.defect, r.reason)
            assert r.reason and r.pid == e.msg.pid


def test_declarations_with_defects(make_rig, form, figures, timed) -> None:
    rig = make_rig()
    rig.seed()
    checker = Checker(rig)
    stub = rig.profiler_stub()
    model = {p: good_declaration(p) for p in GOOD_PIDS}
    tried = {"clean": 0, "defect": 0}

    @hypothesis_settings(form)
    @given(batch=st.lists(entries(), min_size=1, max_size=4))
    def attack(batch: list[Entry]) -> None:
        resp = stub.DeclareProcesses(
            ppb.DeclareProcessesRequest(processes=[e.msg for e in batch]), timeout=TIMEOUT
        )
        rejected = {r.index: r for r in resp.rejected}
        assert resp.accepted == len(batch) - len(rejected)
        _apply(model, batch, rejected)
        for e in batch:
            tried["defect" if e.defect else "clean"] += 1
        _check_store(rig, model)
        _check_batch(rig, checker, model)

    attack()
    figures.add("bad_input", "declarations_unary.clean", tried["clean"])
    figures.add("bad_input", "declarations_unary.with_defect", tried["defect"])


def test_stream_declarations_with_defects(make_rig, form, figures, timed) -> None:
    rig = make_rig()
    rig.seed()
    checker = Checker(rig)
    out: queue.Queue = queue.Queue()
    answers = rig.profiler_stub().StreamDeclarations(iter(out.get, None), timeout=600)
    model = {p: good_declaration(p) for p in GOOD_PIDS}
    tried = 0

    @hypothesis_settings(form)
    @given(entry=entries())
    def attack(entry: Entry) -> None:
        nonlocal tried
        out.put(ppb.StreamDeclarationsRequest(declare=entry.msg))
        resp = next(answers)
        tried += 1
        if entry.defect is None:
            assert resp.accepted and not resp.HasField("rejection"), resp
            model[entry.msg.pid] = entry.msg
        else:
            assert not resp.accepted
            assert resp.rejection.field == f"declare.{entry.defect}", resp.rejection
        _check_store(rig, model)
        _check_batch(rig, checker, model)

    try:
        attack()
    finally:
        out.put(None)
    assert list(answers) == []
    assert rig.server.wait_streams_closed(TIMEOUT)
    _check_batch(rig, checker, model)
    figures.add("bad_input", "declarations_stream", tried)


def test_exits_never_release_what_they_do_not_name(make_rig, form, figures) -> None:
    rig = make_rig()
    rig.seed()
    before = rig.snapshot()
    stub = rig.profiler_stub()
    tried = 0

    @hypothesis_settings(form)
    @given(
        exits=st.lists(
            st.one_of(
                st.tuples(
                    st.integers(0, 2**32 - 1).filter(lambda p: p not in GOOD_PIDS),
                    st.integers(0, 2**64 - 1),
                ),
                # a good pid with another process's start time releases nothing
                st.tuples(
                    st.sampled_from(GOOD_PIDS),
                    st.integers(1, 2**64 - 1).filter(lambda t: t < 1000 or t > 1999),
                ),
            ),
            max_size=8,
        )
    )
    def attack(exits: list[tuple[int, int]]) -> None:
        nonlocal tried
        resp = stub.ReportExits(
            ppb.ReportExitsRequest(
                exits=[ppb.ProcessExit(pid=p, start_time_ticks=t) for p, t in exits]
            ),
            timeout=TIMEOUT,
        )
        tried += len(exits)
        bad = {i for i, (p, _) in enumerate(exits) if not 1 <= p <= PID_MAX}
        assert {r.index for r in resp.rejected} == bad
        assert all(r.field == f"exits[{r.index}].pid" for r in resp.rejected)
        assert resp.released == 0

    attack()
    assert rig.snapshot() == before
    figures.add("bad_input", "exits", tried)


def test_too_many_entries_is_refused_whole(make_rig, figures) -> None:
    rig = make_rig({"server": {"max_declarations_per_request": 8}})
    rig.seed()
    before = rig.snapshot()
    stub = rig.profiler_stub()
    procs = [ppb.ProcessDeclaration(pid=100 + i) for i in range(9)]
    try:
        stub.DeclareProcesses(ppb.DeclareProcessesRequest(processes=procs), timeout=TIMEOUT)
        raise AssertionError("9 entries accepted with a limit of 8")
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.details().startswith("processes: 9 entries exceed")
    assert rig.snapshot() == before and len(rig.declared) == len(GOOD_PIDS)
    figures.add("bad_input", "declarations_over_count_limit", 1)
