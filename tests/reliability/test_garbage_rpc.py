"""Raw garbage bytes to every RPC method of a real sidecar (identity serializers).

The sidecar is the real runtime (``Rig``: real declared store, batch store, server) with
go-plugin's ``plugin.GRPCController`` and ``plugin.GRPCStdio`` added as in plugin mode, so every
method a client can reach is attacked: pull, the three profiler methods, health (Check, Watch,
List), reflection, and the two go-plugin methods. Batches are stored and good processes are
declared first; then hypothesis sends arbitrary bytes, valid messages of the wrong type,
truncated valid messages and concatenations to random methods.

Every call must end with a status other than UNKNOWN/INTERNAL; a payload its method cannot
parse must get INVALID_ARGUMENT naming the method. Afterwards nothing held has changed (points
appended/released/held/dropped, the good declarations), no stream is left open, and the
sidecar still serves health, pulls and declarations.
"""

from __future__ import annotations

import threading

import grpc
from google.protobuf.message_factory import GetMessageClass
from gpumetrics.service.plugin import PluginServices
from gpumetrics.v1 import profiler_pb2 as ppb
from gpumetrics.v1 import pull_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from hypothesis import given
from hypothesis import strategies as st

from .conftest import hypothesis_settings
from .rig import GOOD_PIDS, TIMEOUT

SERVICES = [
    pull_pb2.DESCRIPTOR.services_by_name["MetricsPullService"],
    ppb.DESCRIPTOR.services_by_name["ProfilerIntegrationService"],
    health_pb2.DESCRIPTOR.services_by_name["Health"],
    reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
]
PROTO_METHODS = {
    f"/{svc.full_name}/{m.name}": (
        m.client_streaming,
        m.server_streaming,
        GetMessageClass(m.input_type),
    )
    for svc in SERVICES
    for m in svc.methods
}
PLUGIN_METHODS = {
    "/plugin.GRPCController/Shutdown": (False, False, None),
    "/plugin.GRPCStdio/StreamStdio": (False, True, None),
}
METHODS = {**PROTO_METHODS, **PLUGIN_METHODS}
NEVER = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)

SAMPLES = [
    pull_pb2.PullRequest(
        consumer="x", ack_sequence=3, ack_epoch="e", max_bytes=9
    ).SerializeToString(),
    ppb.DeclareProcessesRequest(
        processes=[
            ppb.ProcessDeclaration(pid=7, environment=[ppb.EnvironmentVariable(name="OTEL_X")])
        ]
    ).SerializeToString(),
    ppb.StreamDeclarationsRequest(exit=ppb.ProcessExit(pid=9)).SerializeToString(),
    health_pb2.HealthCheckRequest(service="gpumetrics.v1.MetricsPullService").SerializeToString(),
    reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString(),
]

payloads = st.one_of(
    st.binary(max_size=256),
    st.sampled_from(SAMPLES),
    st.builds(lambda s, n: s[:n], st.sampled_from(SAMPLES), st.integers(0, 40)),  # truncated
    st.builds(lambda a, b: a + b, st.sampled_from(SAMPLES), st.binary(max_size=32)),
    st.builds(lambda a, b: a + b, st.binary(max_size=8), st.sampled_from(SAMPLES)),
)


def parses(method: str, payload: bytes) -> bool:
    cls = METHODS[method][2]
    if cls is None:
        return True  # go-plugin handlers take raw bytes: there is nothing to parse
    try:
        cls.FromString(payload)
    except Exception:  # noqa: BLE001 - any parse error
        return False
    return True


def call(channel: grpc.Channel, method: str, payload: bytes, plugin: PluginServices) -> None:
    cstream, sstream, _ = METHODS[method]
    kw = {"request_serializer": None, "response_deserializer": None}
    if method == "/plugin.GRPCStdio/StreamStdio":
        it = channel.unary_stream(method, **kw)(payload, timeout=TIMEOUT)
        assert plugin.wait_for_streams(1, TIMEOUT), "StreamStdio did not open"
        it.cancel()
        assert plugin.wait_for_streams(0, TIMEOUT), "StreamStdio stayed open after cancel"
        return
    if not cstream and not sstream:
        channel.unary_unary(method, **kw)(payload, timeout=TIMEOUT)
    elif sstream and not cstream:  # Health/Watch streams until cancelled: take the first answer
        it = channel.unary_stream(method, **kw)(payload, timeout=TIMEOUT)
        try:
            next(it, None)
        finally:
            it.cancel()
    elif cstream and sstream:
        list(channel.stream_stream(method, **kw)(iter([payload]), timeout=TIMEOUT))
    else:
        channel.stream_unary(method, **kw)(iter([payload]), timeout=TIMEOUT)


def test_garbage_to_every_method_changes_nothing(make_rig, form, figures, timed) -> None:
    shutdowns = threading.Event()
    shutdown_calls = []

    def on_shutdown() -> None:
        shutdown_calls.append(1)
        shutdowns.set()

    plugin = PluginServices(on_shutdown)

    def add_plugin(server) -> None:
        server.add_service(
            lambda s: s.add_generic_rpc_handlers(plugin.handlers()),
            ["plugin.GRPCController", "plugin.GRPCStdio"],
        )

    rig = make_rig(before_start=add_plugin)
    rig.seed()
    before = rig.snapshot()
    channel = rig.channel()
    tried: dict[str, int] = dict.fromkeys(METHODS, 0)
    outcomes: dict[str, int] = {}
    shutdown_sent = 0

    @hypothesis_settings(form, scale=4)
    @given(payload=payloads, method=st.sampled_from(sorted(METHODS)))
    def attack(payload: bytes, method: str) -> None:
        nonlocal shutdown_sent
        tried[method] += 1
        shutdown_sent += method.endswith("/Shutdown")
        try:
            call(channel, method, payload, plugin)
            outcome = "OK"
        except grpc.RpcError as err:
            code = err.code()
            outcome = code.name
            assert code not in NEVER, (method, payload, err.details())
            if not parses(method, payload):
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, payload, err.details())
                assert method in (err.details() or ""), err.details()
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    attack()
    # Exhaustive floor: every method gets unparseable bytes at least once.
    for method in METHODS:
        for payload in (b"\xff" * 16, b"\x0a\xff\xff\xff\xff\x0f", b"\x08"):
            tried[method] += 1
            shutdown_sent += method.endswith("/Shutdown")
            try:
                call(channel, method, payload, plugin)
            except grpc.RpcError as err:
                assert err.code() not in NEVER
                if not parses(method, payload):
                    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT

    assert rig.snapshot() == before
    assert rig.server.wait_streams_closed(TIMEOUT)
    assert len(shutdown_calls) == shutdown_sent  # go-plugin's Shutdown ignores its body
    health = rig.health_stub().Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    resp = rig.pull_stub().Pull(pull_pb2.PullRequest(consumer="after"), timeout=TIMEOUT)
    assert resp.last_sequence == 3 and resp.data_points == before.appended_points
    d = rig.profiler_stub().DeclareProcesses(
        ppb.DeclareProcessesRequest(processes=[ppb.ProcessDeclaration(pid=GOOD_PIDS[0] + 100)]),
        timeout=TIMEOUT,
    )
    assert d.accepted == 1
    for method, n in tried.items():
        figures.add("garbage_rpc", f"inputs.{method.lstrip('/')}", n)
    for outcome, n in outcomes.items():
        figures.add("garbage_rpc", f"status.{outcome}", n)
