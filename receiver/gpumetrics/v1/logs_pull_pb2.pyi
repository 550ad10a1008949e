from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PullLogsRequest(_message.Message):
    __slots__ = ("consumer", "ack_sequence", "ack_epoch", "max_log_records", "max_bytes", "previous_outcome", "ack_only", "read_after_sequence")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    ACK_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ACK_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_LOG_RECORDS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ACK_ONLY_FIELD_NUMBER: _ClassVar[int]
    READ_AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    ack_sequence: int
    ack_epoch: str
    max_log_records: int
    max_bytes: int
    previous_outcome: LogsPreviousOutcome
    ack_only: bool
    read_after_sequence: int
    def __init__(self, consumer: _Optional[str] = ..., ack_sequence: _Optional[int] = ..., ack_epoch: _Optional[str] = ..., max_log_records: _Optional[int] = ..., max_bytes: _Optional[int] = ..., previous_outcome: _Optional[_Union[LogsPreviousOutcome, _Mapping]] = ..., ack_only: _Optional[bool] = ..., read_after_sequence: _Optional[int] = ...) -> None: ...

class LogsPreviousOutcome(_message.Message):
    __slots__ = ("last_sequence", "rejected_log_records", "error_message")
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REJECTED_LOG_RECORDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    last_sequence: int
    rejected_log_records: int
    error_message: str
    def __init__(self, last_sequence: _Optional[int] = ..., rejected_log_records: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class PullLogsResponse(_message.Message):
    __slots__ = ("export_logs_service_request", "epoch", "first_sequence", "last_sequence", "more", "log_records", "dropped_log_records", "dropped_log_records_total", "drop_reasons")
    EXPORT_LOGS_SERVICE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    LOG_RECORDS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_LOG_RECORDS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_LOG_RECORDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DROP_REASONS_FIELD_NUMBER: _ClassVar[int]
    export_logs_service_request: bytes
    epoch: str
    first_sequence: int
    last_sequence: int
    more: bool
    log_records: int
    dropped_log_records: int
    dropped_log_records_total: int
    drop_reasons: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, export_logs_service_request: _Optional[bytes] = ..., epoch: _Optional[str] = ..., first_sequence: _Optional[int] = ..., last_sequence: _Optional[int] = ..., more: _Optional[bool] = ..., log_records: _Optional[int] = ..., dropped_log_records: _Optional[int] = ..., dropped_log_records_total: _Optional[int] = ..., drop_reasons: _Optional[_Iterable[str]] = ...) -> None: ...
