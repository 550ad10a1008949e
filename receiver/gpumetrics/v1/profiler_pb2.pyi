from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EnvironmentVariable(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class ProcessDeclaration(_message.Message):
    __slots__ = ("pid", "start_time_ticks", "process_context", "environment", "profiler_resource", "profiler_resource_schema_url")
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_TICKS_FIELD_NUMBER: _ClassVar[int]
    PROCESS_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    PROFILER_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    PROFILER_RESOURCE_SCHEMA_URL_FIELD_NUMBER: _ClassVar[int]
    pid: int
    start_time_ticks: int
    process_context: bytes
    environment: _containers.RepeatedCompositeFieldContainer[EnvironmentVariable]
    profiler_resource: bytes
    profiler_resource_schema_url: str
    def __init__(self, pid: _Optional[int] = ..., start_time_ticks: _Optional[int] = ..., process_context: _Optional[bytes] = ..., environment: _Optional[_Iterable[_Union[EnvironmentVariable, _Mapping]]] = ..., profiler_resource: _Optional[bytes] = ..., profiler_resource_schema_url: _Optional[str] = ...) -> None: ...

class DeclareProcessesRequest(_message.Message):
    __slots__ = ("processes", "replace_all")
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    REPLACE_ALL_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[ProcessDeclaration]
    replace_all: bool
    def __init__(self, processes: _Optional[_Iterable[_Union[ProcessDeclaration, _Mapping]]] = ..., replace_all: _Optional[bool] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("index", "pid", "field", "reason")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    pid: int
    field: str
    reason: str
    def __init__(self, index: _Optional[int] = ..., pid: _Optional[int] = ..., field: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DeclareProcessesResponse(_message.Message):
    __slots__ = ("accepted", "rejected", "released")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    rejected: _containers.RepeatedCompositeFieldContainer[Rejection]
    released: int
    def __init__(self, accepted: _Optional[int] = ..., rejected: _Optional[_Iterable[_Union[Rejection, _Mapping]]] = ..., released: _Optional[int] = ...) -> None: ...

class ProcessExit(_message.Message):
    __slots__ = ("pid", "start_time_ticks")
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_TICKS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    start_time_ticks: int
    def __init__(self, pid: _Optional[int] = ..., start_time_ticks: _Optional[int] = ...) -> None: ...

class ReportExitsRequest(_message.Message):
    __slots__ = ("exits",)
    EXITS_FIELD_NUMBER: _ClassVar[int]
    exits: _containers.RepeatedCompositeFieldContainer[ProcessExit]
    def __init__(self, exits: _Optional[_Iterable[_Union[ProcessExit, _Mapping]]] = ...) -> None: ...

class ReportExitsResponse(_message.Message):
    __slots__ = ("released", "rejected")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    released: int
    rejected: _containers.RepeatedCompositeFieldContainer[Rejection]
    def __init__(self, released: _Optional[int] = ..., rejected: _Optional[_Iterable[_Union[Rejection, _Mapping]]] = ...) -> None: ...

class ResyncBegin(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResyncEnd(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeclareBatch(_message.Message):
    __slots__ = ("processes",)
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[ProcessDeclaration]
    def __init__(self, processes: _Optional[_Iterable[_Union[ProcessDeclaration, _Mapping]]] = ...) -> None: ...

class StreamDeclarationsRequest(_message.Message):
    __slots__ = ("declare", "exit", "resync_begin", "resync_end", "declare_batch")
    DECLARE_FIELD_NUMBER: _ClassVar[int]
    EXIT_FIELD_NUMBER: _ClassVar[int]
    RESYNC_BEGIN_FIELD_NUMBER: _ClassVar[int]
    RESYNC_END_FIELD_NUMBER: _ClassVar[int]
    DECLARE_BATCH_FIELD_NUMBER: _ClassVar[int]
    declare: ProcessDeclaration
    exit: ProcessExit
    resync_begin: ResyncBegin
    resync_end: ResyncEnd
    declare_batch: DeclareBatch
    def __init__(self, declare: _Optional[_Union[ProcessDeclaration, _Mapping]] = ..., exit: _Optional[_Union[ProcessExit, _Mapping]] = ..., resync_begin: _Optional[_Union[ResyncBegin, _Mapping]] = ..., resync_end: _Optional[_Union[ResyncEnd, _Mapping]] = ..., declare_batch: _Optional[_Union[DeclareBatch, _Mapping]] = ...) -> None: ...

class StreamDeclarationsResponse(_message.Message):
    __slots__ = ("accepted", "rejection", "released", "declared", "rejections")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTION_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    DECLARED_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    rejection: Rejection
    released: int
    declared: int
    rejections: _containers.RepeatedCompositeFieldContainer[Rejection]
    def __init__(self, accepted: _Optional[bool] = ..., rejection: _Optional[_Union[Rejection, _Mapping]] = ..., released: _Optional[int] = ..., declared: _Optional[int] = ..., rejections: _Optional[_Iterable[_Union[Rejection, _Mapping]]] = ...) -> None: ...
