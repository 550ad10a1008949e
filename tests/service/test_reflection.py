"""Server reflection: v1 and v1alpha answer alike; served descriptors carry ``json_name``.

The client side is grpcio-reflection's own ``ProtoReflectionDescriptorDatabase`` (v1alpha) and a
raw v1 stream with the same messages (v1 is v1alpha renamed, as grpc-go's descriptors show).
grpcurl itself is exercised in tests/e2e/test_grpcurl.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from gpumetrics.service import PROFILER_SERVICE, PULL_SERVICE
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from .conftest import TIMEOUT, MakeSidecar

V1 = "grpc.reflection.v1.ServerReflection"
V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"


def ask(
    channel: grpc.Channel, service: str, **request: Any
) -> reflection_pb2.ServerReflectionResponse:
    """One request on ``service``'s ServerReflectionInfo stream (v1 and v1alpha share messages)."""
    call = channel.stream_stream(
        f"/{service}/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    (response,) = list(
        call(iter([reflection_pb2.ServerReflectionRequest(**request)]), timeout=TIMEOUT)
    )
    return response


def lower_camel(name: str) -> str:
    """protobuf's JSON name rule (``ToJsonName`` in protoc): drop ``_``, capitalise what follows."""
    return re.sub(r"_(.)", lambda m: m.group(1).upper(), name).replace("_", "")


def fields(file: descriptor_pb2.FileDescriptorProto) -> Iterator[Any]:
    def walk(messages: Any) -> Iterator[Any]:
        for message in messages:
            yield from message.field
            yield from message.extension
            yield from walk(message.nested_type)

    yield from walk(file.message_type)
    yield from file.extension


@pytest.mark.parametrize("service", [V1, V1ALPHA])
def test_both_versions_list_the_same_services(sidecar: MakeSidecar, service: str) -> None:
    sc = sidecar()
    with sc.channel() as channel:
        listed = ask(channel, service, list_services="").list_services_response.service
    names = {s.name for s in listed}
    assert {PULL_SERVICE, PROFILER_SERVICE, "grpc.health.v1.Health", V1, V1ALPHA} <= names


@pytest.mark.parametrize("service", [V1, V1ALPHA])
def test_every_served_field_has_its_json_name(sidecar: MakeSidecar, service: str) -> None:
    sc = sidecar()
    with sc.channel() as channel:
        response = ask(channel, service, file_containing_symbol=PULL_SERVICE)
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in response.file_descriptor_response.file_descriptor_proto
    ]
    assert "gpumetrics/v1/pull.proto" in {f.name for f in files}
    served = [(f.name, field.name, field.json_name) for f in files for field in fields(f)]
    assert served, "no fields served"
    assert [s for s in served if s[2] != lower_camel(s[1])] == []
    assert ("gpumetrics/v1/pull.proto", "ack_sequence", "ackSequence") in served
    assert (
        "gpumetrics/v1/pull.proto",
        "export_metrics_service_request",
        "exportMetricsServiceRequest",
    ) in served


def test_the_v1_service_is_described_in_its_own_package(sidecar: MakeSidecar) -> None:
    sc = sidecar()
    with sc.channel() as channel:
        response = ask(channel, V1, file_containing_symbol=V1)
    (file,) = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in response.file_descriptor_response.file_descriptor_proto
    ]
    assert (file.name, file.package) == (
        "grpc/reflection/v1/reflection.proto",
        "grpc.reflection.v1",
    )
    (svc,) = file.service
    (method,) = svc.method
    assert (svc.name, method.name) == ("ServerReflection", "ServerReflectionInfo")
    assert method.input_type == ".grpc.reflection.v1.ServerReflectionRequest"
    assert method.client_streaming and method.server_streaming
    types = {f.type_name for m in file.message_type for f in m.field if f.type_name}
    assert types and all(t.startswith(".grpc.reflection.v1.") for t in types)


def test_grpcio_reflection_client_builds_a_pool_with_json_names(sidecar: MakeSidecar) -> None:
    """The library's own client (v1alpha) resolves our services from what the server serves."""
    sc = sidecar()
    with sc.channel() as channel:
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        service = pool.FindServiceByName(PULL_SERVICE)
        request = service.methods_by_name["Pull"].input_type
    assert request.full_name == "gpumetrics.v1.PullRequest"
    proto = descriptor_pb2.DescriptorProto()
    request.CopyToProto(proto)
    assert {f.name: f.json_name for f in proto.field}["read_after_sequence"] == "readAfterSequence"


def test_reflection_is_off_when_disabled(sidecar: MakeSidecar) -> None:
    sc = sidecar(reflection=False)
    with sc.channel() as channel:
        for service in (V1, V1ALPHA):
            with pytest.raises(grpc.RpcError) as info:
                ask(channel, service, list_services="")
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_the_reflection_service_name_is_grpcio_reflections() -> None:
    from gpumetrics.service import names
    from grpc_reflection.v1alpha import reflection

    assert names.REFLECTION_SERVICE == reflection.SERVICE_NAME
