"""Garbage and oversized requests: a clean status, nothing held lost, the server still serving."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf.message_factory import GetMessageClass
from gpumetrics.store import StoreStats
from gpumetrics.v1 import profiler_pb2 as pb
from gpumetrics.v1 import pull_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from .conftest import TIMEOUT, MakeSidecar, Sidecar, assert_held, declared

SERVICES = [
    pull_pb2.DESCRIPTOR.services_by_name["MetricsPullService"],
    pb.DESCRIPTOR.services_by_name["ProfilerIntegrationService"],
    health_pb2.DESCRIPTOR.services_by_name["Health"],
    reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
]
METHODS = [
    (f"/{svc.full_name}/{m.name}", m.client_streaming, m.server_streaming)
    for svc in SERVICES
    for m in svc.methods
]
INPUT_TYPES = {
    f"/{svc.full_name}/{m.name}": GetMessageClass(m.input_type)
    for svc in SERVICES
    for m in svc.methods
}


def parses(method: str, payload: bytes) -> bool:
    try:
        INPUT_TYPES[method].FromString(payload)
    except Exception:  # noqa: BLE001 - any parse error
        return False
    return True


GARBAGE = [
    b"\xff" * 16,  # field number 0 / overlong varint
    b"\x0a\xff\xff\xff\xff\x0f",  # length prefix far beyond the message
    b"\x08",  # truncated varint
    b"\x0a\x02\xc3\x28",  # string field 1 with invalid UTF-8
]


def call_raw(
    channel: grpc.Channel, method: str, cstream: bool, sstream: bool, payload: bytes
) -> Any:
    kw = {"request_serializer": None, "response_deserializer": None}
    if not cstream and not sstream:
        return channel.unary_unary(method, **kw)(payload, timeout=TIMEOUT)
    if not cstream:
        return list(channel.unary_stream(method, **kw)(payload, timeout=TIMEOUT))
    if not sstream:
        return channel.stream_unary(method, **kw)(iter([payload]), timeout=TIMEOUT)
    return list(channel.stream_stream(method, **kw)(iter([payload]), timeout=TIMEOUT))


def seeded(sidecar: MakeSidecar, **settings: Any) -> Sidecar:
    sc = sidecar(append=3, **settings)
    sc.declared.declare(1, 10, b"", [("OTEL_SERVICE_NAME", b"a")], b"")
    sc.declared.declare(2, 20, b"", [], b"")
    return sc


def assert_intact_and_serving(sc: Sidecar, before: StoreStats) -> None:
    assert sc.store.stats() == before
    assert_held(sc.declared, 1, 2)
    r = sc.pull_stub().Pull(pull_pb2.PullRequest(consumer="after"), timeout=TIMEOUT)
    assert r.last_sequence == 3
    status = sc.health_stub().Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT).status
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_every_method_is_covered() -> None:
    names = {m for m, _, _ in METHODS}
    assert "/gpumetrics.v1.ProfilerIntegrationService/StreamDeclarations" in names
    assert "/grpc.health.v1.Health/Watch" in names
    assert len(names) == 8


@pytest.mark.parametrize(("method", "cstream", "sstream"), METHODS)
def test_garbage_bytes_get_invalid_argument(
    sidecar: MakeSidecar, method: str, cstream: bool, sstream: bool
) -> None:
    sc = seeded(sidecar)
    channel = sc.channel()
    before = sc.store.stats()
    garbage = [p for p in GARBAGE if not parses(method, p)]
    assert len(garbage) >= 3
    for payload in garbage:
        with pytest.raises(grpc.RpcError) as err:
            call_raw(channel, method, cstream, sstream, payload)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (payload, err.value.details())
        assert method in err.value.details()
    assert_intact_and_serving(sc, before)
    assert sc.telemetry.value(
        "gpumetrics.server.rejected_calls",
        {"rpc.method": method.lstrip("/"), "reason": "malformed_request"},
    ) == len(garbage)


def test_random_bytes_never_crash_a_method(sidecar: MakeSidecar) -> None:
    sc = sidecar(append=1)
    channel = sc.channel()
    health = sc.health_stub()

    @settings(max_examples=80, deadline=None, derandomize=True)
    @given(payload=st.binary(max_size=64), which=st.sampled_from(METHODS))
    def run(payload: bytes, which: tuple[str, bool, bool]) -> None:
        method, cstream, sstream = which
        kw = {"request_serializer": None, "response_deserializer": None}
        try:
            if sstream:  # take the first answer, then hang up (Watch would stream forever)
                make = channel.stream_stream if cstream else channel.unary_stream
                call = make(method, **kw)(iter([payload]) if cstream else payload, timeout=TIMEOUT)
                next(call, None)
                call.cancel()
            else:
                call_raw(channel, method, cstream, sstream, payload)
        except grpc.RpcError as err:
            assert err.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), err
            assert (
                err.code() != grpc.StatusCode.INVALID_ARGUMENT or parses(method, payload) is False
            )
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT).status
        assert status == health_pb2.HealthCheckResponse.SERVING

    run()


def test_oversized_unary_requests_are_resource_exhausted_and_change_nothing(
    sidecar: MakeSidecar,
) -> None:
    sc = seeded(sidecar, max_receive_message_bytes=64 * 1024)
    before = sc.store.stats()
    big = pb.ProcessDeclaration(pid=1, process_context=b"x" * (70 * 1024))
    with pytest.raises(grpc.RpcError) as err:
        sc.profiler_stub().DeclareProcesses(
            pb.DeclareProcessesRequest(processes=[big]), timeout=TIMEOUT
        )
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.RpcError) as err:
        sc.pull_stub().Pull(
            pull_pb2.PullRequest(
                consumer="big",
                ack_sequence=3,
                ack_epoch=sc.store.epoch,
                previous_outcome=pull_pb2.PreviousOutcome(error_message="e" * 70_000),
            ),
            timeout=TIMEOUT,
        )
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not declared(sc.declared, 1).has_process_context
    assert_intact_and_serving(sc, before)


def test_an_oversized_stream_message_ends_the_stream_after_applying_the_earlier_ones(
    sidecar: MakeSidecar,
) -> None:
    sc = seeded(sidecar, max_receive_message_bytes=64 * 1024)
    before = sc.store.stats()
    events = [
        pb.StreamDeclarationsRequest(declare=pb.ProcessDeclaration(pid=3)),
        pb.StreamDeclarationsRequest(
            declare=pb.ProcessDeclaration(pid=4, process_context=b"x" * (70 * 1024))
        ),
    ]
    answers = []
    with pytest.raises(grpc.RpcError) as err:
        for resp in sc.profiler_stub().StreamDeclarations(iter(events), timeout=TIMEOUT):
            answers.append(resp.accepted)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert answers == [True]
    assert_held(sc.declared, 1, 2, 3)
    assert sc.declared.exit(3) == 1
    assert sc.server.wait_streams_closed(TIMEOUT)
    assert_intact_and_serving(sc, before)
