"""gRPC server reflection: ``grpc.reflection.v1`` and ``v1alpha``, descriptors with ``json_name``.

grpcio-reflection (1.85) serves only ``grpc.reflection.v1alpha.ServerReflection``; current
clients (grpcurl, ``buf curl``, grpc-go's ``grpc_reflection_v1``) ask for ``grpc.reflection.v1``
first. The v1 protocol is v1alpha with its package renamed (``grpc/reflection/v1/reflection.proto``
in grpc/grpc-proto; checked field by field against grpc-go's ``grpc_reflection_v1`` descriptor), so
the library's servicer answers both: v1 is registered as a generic handler with the same
messages, and its file descriptor is v1alpha's with the package renamed.

The served ``FileDescriptorProto`` s carry every field's ``json_name``. Python's descriptors drop it
(``CopyToProto`` writes only what a ``.proto`` file set explicitly), and clients built on
jhump/protoreflect, grpcurl among them, then print snake_case field names from reflection but
lowerCamelCase ones with ``-proto`` files; protobuf's JSON mapping says lowerCamelCase.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from gpumetrics.service.names import REFLECTION_SERVICE as REFLECTION_V1ALPHA
from gpumetrics.service.names import REFLECTION_V1_SERVICE as REFLECTION_V1

__all__ = ["enable_reflection", "reflection_pool"]

_V1ALPHA_PREFIX = ".grpc.reflection.v1alpha."
_V1_PREFIX = ".grpc.reflection.v1."


def _fill_json_names(protos: Iterable[Any], descriptors: Any) -> None:
    """Set ``json_name`` on every field and extension of ``protos`` from their descriptors."""
    for proto in protos:
        desc = descriptors[proto.name]
        for field in proto.field:
            field.json_name = desc.fields_by_name[field.name].json_name
        for ext in proto.extension:
            ext.json_name = desc.extensions_by_name[ext.name].json_name
        _fill_json_names(proto.nested_type, desc.nested_types_by_name)


def _file_proto(file: Any) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    _fill_json_names(proto.message_type, file.message_types_by_name)
    for ext in proto.extension:
        ext.json_name = file.extensions_by_name[ext.name].json_name
    return proto


def _v1_from_v1alpha(
    v1alpha: descriptor_pb2.FileDescriptorProto,
) -> descriptor_pb2.FileDescriptorProto:
    """Return the v1 reflection file: v1alpha's with the package renamed, options dropped."""
    v1 = descriptor_pb2.FileDescriptorProto()
    v1.CopyFrom(v1alpha)
    v1.ClearField("options")
    v1.name = "grpc/reflection/v1/reflection.proto"
    v1.package = "grpc.reflection.v1"
    for message in v1.message_type:
        for field in message.field:
            if field.type_name.startswith(_V1ALPHA_PREFIX):
                field.type_name = _V1_PREFIX + field.type_name[len(_V1ALPHA_PREFIX) :]
    for service in v1.service:
        for method in service.method:
            method.input_type = method.input_type.replace(_V1ALPHA_PREFIX, _V1_PREFIX)
            method.output_type = method.output_type.replace(_V1ALPHA_PREFIX, _V1_PREFIX)
    return v1


def reflection_pool(service_names: Sequence[str]) -> descriptor_pool.DescriptorPool:
    """Return a descriptor pool of the files (and their imports) defining ``service_names``.

    Each file is added with ``json_name`` set on every field; ``grpc.reflection.v1`` is added
    as described in the module docstring. Names without a descriptor in the default pool (the
    go-plugin services, served as generic handlers) are left out: reflection lists them but
    answers NOT_FOUND for their files, as before.
    """
    default = descriptor_pool.Default()
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: Any) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:
            add(dependency)
        pool.Add(_file_proto(file))
        added.add(file.name)

    for name in (*service_names, REFLECTION_V1ALPHA):
        if name == REFLECTION_V1:
            continue
        try:
            add(default.FindFileContainingSymbol(name))
        except KeyError:
            continue
    if REFLECTION_V1 in service_names:
        pool.Add(_v1_from_v1alpha(_file_proto(reflection_pb2.DESCRIPTOR)))
    return pool


def enable_reflection(server: grpc.Server, service_names: Sequence[str]) -> None:
    """Serve reflection v1 and v1alpha on ``server``, listing ``service_names`` and both."""
    names = sorted({*service_names, REFLECTION_V1ALPHA, REFLECTION_V1})
    servicer = reflection.ReflectionServicer(names, pool=reflection_pool(names))
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(
        REFLECTION_V1,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers([v1])
