"""Requests are counted on the wire before they are parsed (``gpumetrics.service.wirecount``).

Issue 23 follow-up: the receive limit bounds a request's wire size only. A 3.8 MiB
DeclareProcessesRequest of two million empty ``environment`` entries parsed into 108 MiB (upb),
on the polling thread, before any limit of the declared store could see it; four such
requests in flight would take a sidecar past its documented ceiling.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import message as pbmessage
from gpumetrics.service import ServerSettings
from gpumetrics.service.wirecount import TooManyElements, count_elements, shape_of
from gpumetrics.v1 import logs_pull_pb2, pull_pb2
from gpumetrics.v1 import profiler_pb2 as pb
from gpumetrics.wire import len_field
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from .conftest import TIMEOUT, MakeSidecar

LIMIT = ServerSettings().max_request_elements  # with the default receive limit


def parsed_elements(msg: pbmessage.Message) -> int:
    """The oracle: elements of the parsed message, by protobuf's own reflection.

    Every element of a repeated field, and each message field whose type holds a repeated one.
    """
    n = 0
    for fd, value in msg.ListFields():
        if fd.is_repeated:
            n += len(value)
            if fd.message_type is not None:
                n += sum(parsed_elements(v) for v in value)
        elif fd.message_type is not None:
            n += int(shape_of(fd.message_type) is not None) + parsed_elements(value)
    return n


env = st.builds(pb.EnvironmentVariable, name=st.text(max_size=8), value=st.binary(max_size=8))
declaration = st.builds(
    pb.ProcessDeclaration,
    pid=st.integers(0, 2**31 - 1),
    start_time_ticks=st.integers(0, 2**63 - 1),
    process_context=st.binary(max_size=32),
    environment=st.lists(env, max_size=6),
    profiler_resource=st.binary(max_size=32),
)
requests = st.one_of(
    st.builds(pb.DeclareProcessesRequest, processes=st.lists(declaration, max_size=8)),
    st.builds(
        pb.ReportExitsRequest,
        exits=st.lists(st.builds(pb.ProcessExit, pid=st.integers(0, 2**31 - 1)), max_size=8),
    ),
    st.builds(pb.StreamDeclarationsRequest, declare=declaration),
    st.builds(
        pb.StreamDeclarationsRequest,
        declare_batch=st.builds(pb.DeclareBatch, processes=st.lists(declaration, max_size=8)),
    ),
    st.builds(pb.StreamDeclarationsRequest, exit=st.builds(pb.ProcessExit, pid=st.integers(0, 9))),
    st.just(pb.StreamDeclarationsRequest(resync_begin=pb.ResyncBegin())),
)


@settings(max_examples=150, deadline=None)
@given(requests)
def test_the_wire_count_is_the_parsed_count(request: Any) -> None:
    shape = shape_of(type(request).DESCRIPTOR)
    assert shape is not None
    assert count_elements(request.SerializeToString(), shape, LIMIT) == parsed_elements(request)


@settings(max_examples=150, deadline=None)
@given(requests, st.data())
def test_truncated_or_corrupt_requests_are_left_to_the_parser(request: Any, data: Any) -> None:
    wire = bytearray(request.SerializeToString())
    if wire:
        cut = data.draw(st.integers(0, len(wire) - 1))
        wire = wire[:cut] + bytes(data.draw(st.binary(max_size=8)))
    shape = shape_of(type(request).DESCRIPTOR)
    assert shape is not None
    assert 0 <= count_elements(bytes(wire), shape, LIMIT)  # never anything but a count


def test_types_that_cannot_grow_when_parsed_are_not_walked() -> None:
    for kind in (
        pull_pb2.PullRequest,
        logs_pull_pb2.PullLogsRequest,
        health_pb2.HealthCheckRequest,
        reflection_pb2.ServerReflectionRequest,
    ):
        assert shape_of(kind.DESCRIPTOR) is None, kind


def empty_environment(entries: int) -> bytes:
    """A DeclareProcessesRequest of one declaration with ``entries`` empty environment variables:
    2 bytes each on the wire, a message each once parsed (about 54 bytes in upb)."""
    return len_field(1, b"\x08\x01" + b"\x22\x00" * entries)  # processes[0]: pid 1, env (4)


def test_the_count_stops_at_the_limit() -> None:
    shape = shape_of(pb.DeclareProcessesRequest.DESCRIPTOR)
    assert shape is not None
    wire = empty_environment(2_000_000)  # 3.8 MiB: 108 MiB once parsed (over the limit anyway)
    with pytest.raises(TooManyElements) as err:
        count_elements(wire, shape, LIMIT)
    assert err.value.limit == LIMIT
    assert count_elements(empty_environment(LIMIT - 1), shape, LIMIT) == LIMIT  # with its entry


def test_a_request_of_too_many_elements_is_refused_unparsed(sidecar: MakeSidecar) -> None:
    sc = sidecar()
    method = "/gpumetrics.v1.ProfilerIntegrationService/DeclareProcesses"
    call = sc.channel().unary_unary(method, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as err:
        call(empty_environment(LIMIT + 1), timeout=TIMEOUT)
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"more than {LIMIT} repeated elements" in (err.value.details() or "")
    assert "server.max_receive_message_bytes" in (err.value.details() or "")
    assert len(sc.declared) == 0
    reason = {"rpc.method": method.lstrip("/"), "reason": "too_many_elements"}
    assert sc.telemetry.value("gpumetrics.server.rejected_calls", reason) == 1
    # one at the limit is parsed and answered (its entry rejected by the declared store)
    answer = pb.DeclareProcessesResponse.FromString(call(empty_environment(LIMIT - 1)))
    assert answer.accepted == 0 and len(answer.rejected) == 1
    # and the limit follows the receive limit
    large = sidecar(max_receive_message_bytes=4 * ServerSettings().max_receive_message_bytes)
    call = large.channel().unary_unary(method, request_serializer=None, response_deserializer=None)
    answer = pb.DeclareProcessesResponse.FromString(call(empty_environment(4 * LIMIT - 1)))
    assert len(answer.rejected) == 1
    with pytest.raises(grpc.RpcError) as err:
        call(empty_environment(4 * LIMIT + 1), timeout=TIMEOUT)
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def empty_batch(entries: int) -> bytes:
    """A StreamDeclarationsRequest whose DeclareBatch holds ``entries`` empty declarations."""
    return len_field(5, b"\x0a\x00" * entries)  # declare_batch (5): processes (1), empty


def test_a_declare_batch_of_too_many_elements_is_refused_unparsed(sidecar: MakeSidecar) -> None:
    """Issue 24's DeclareBatch must not open a way around max_request_elements: the entries of
    one stream event are counted before it is parsed, as a unary request's are."""
    sc = sidecar()
    method = "/gpumetrics.v1.ProfilerIntegrationService/StreamDeclarations"
    call = sc.channel().stream_stream(method, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as err:
        list(call(iter([empty_batch(LIMIT)]), timeout=TIMEOUT))  # with its declare_batch: over
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"more than {LIMIT} repeated elements" in (err.value.details() or "")
    assert len(sc.declared) == 0
    reason = {"rpc.method": method.lstrip("/"), "reason": "too_many_elements"}
    assert sc.telemetry.value("gpumetrics.server.rejected_calls", reason) == 1
    # one element fewer is parsed and answered: refused whole by the entry limit
    (answer,) = call(iter([empty_batch(LIMIT - 1)]), timeout=TIMEOUT)
    resp = pb.StreamDeclarationsResponse.FromString(answer)
    assert resp.rejection.field == "declare_batch.processes" and len(sc.declared) == 0
