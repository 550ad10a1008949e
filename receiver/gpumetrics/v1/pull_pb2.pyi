from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PullRequest(_message.Message):
    __slots__ = ("consumer", "ack_sequence", "ack_epoch", "max_data_points", "max_bytes", "previous_outcome", "ack_only", "read_after_sequence")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    ACK_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ACK_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_DATA_POINTS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ACK_ONLY_FIELD_NUMBER: _ClassVar[int]
    READ_AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    ack_sequence: int
    ack_epoch: str
    max_data_points: int
    max_bytes: int
    previous_outcome: PreviousOutcome
    ack_only: bool
    read_after_sequence: int
    def __init__(self, consumer: _Optional[str] = ..., ack_sequence: _Optional[int] = ..., ack_epoch: _Optional[str] = ..., max_data_points: _Optional[int] = ..., max_bytes: _Optional[int] = ..., previous_outcome: _Optional[_Union[PreviousOutcome, _Mapping]] = ..., ack_only: _Optional[bool] = ..., read_after_sequence: _Optional[int] = ...) -> None: ...

class PreviousOutcome(_message.Message):
    __slots__ = ("last_sequence", "rejected_data_points", "error_message")
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REJECTED_DATA_POINTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    last_sequence: int
    rejected_data_points: int
    error_message: str
    def __init__(self, last_sequence: _Optional[int] = ..., rejected_data_points: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("export_metrics_service_request", "epoch", "first_sequence", "last_sequence", "more", "data_points", "dropped_data_points", "dropped_data_points_total", "drop_reasons")
    EXPORT_METRICS_SERVICE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    DATA_POINTS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_DATA_POINTS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_DATA_POINTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DROP_REASONS_FIELD_NUMBER: _ClassVar[int]
    export_metrics_service_request: bytes
    epoch: str
    first_sequence: int
    last_sequence: int
    more: bool
    data_points: int
    dropped_data_points: int
    dropped_data_points_total: int
    drop_reasons: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, export_metrics_service_request: _Optional[bytes] = ..., epoch: _Optional[str] = ..., first_sequence: _Optional[int] = ..., last_sequence: _Optional[int] = ..., more: _Optional[bool] = ..., data_points: _Optional[int] = ..., dropped_data_points: _Optional[int] = ..., dropped_data_points_total: _Optional[int] = ..., drop_reasons: _Optional[_Iterable[str]] = ...) -> None: ...
