from opentelemetry.proto.common.v1 import common_pb2 as _common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2 as _resource_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProcessContext(_message.Message):
    __slots__ = ("resource", "attributes")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    resource: _resource_pb2.Resource
    attributes: _containers.RepeatedCompositeFieldContainer[_common_pb2.KeyValue]
    def __init__(self, resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., attributes: _Optional[_Iterable[_Union[_common_pb2.KeyValue, _Mapping]]] = ...) -> None: ...
