"""One process declaration from a profiler: its validated form :class:`Declared` and its errors.

Field names in :class:`DeclarationError` are relative to one ``ProcessDeclaration`` message of
``proto/gpumetrics/v1/profiler.proto`` (``pid``, ``start_time_ticks``, ``process_context``,
``environment[2].name``, ``profiler_resource``, ``profiler_resource_schema_url``); the gRPC
servicer prefixes them with ``processes[i].``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from google.protobuf.message import DecodeError
from opentelemetry.proto.resource.v1 import resource_pb2

from gpumetrics.identity.attrs import AttrValue, from_key_values
from gpumetrics.identity.ctxproto import ProcessContextDecodeError, decode_process_context

PID_MAX_LIMIT = 4_194_304
"""Largest possible ``pid_max`` on 64-bit Linux (``PID_MAX_LIMIT`` = 2^22,
``include/linux/threads.h``)."""

_U64_MAX = 2**64 - 1

MAX_SCHEMA_URL_BYTES = 2048
"""Longest ``profiler_resource_schema_url`` accepted (UTF-8 bytes); schema URLs are short
(``https://opentelemetry.io/schemas/1.37.0``)."""


class DeclarationError(ValueError):
    """A declaration (or exit/resync event) was rejected.

    Attributes:
        field: the offending field relative to one ``ProcessDeclaration`` (e.g.
            ``environment[2].name``), or ``resync_end`` for a resync protocol error.
        reason: why, in words.

    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class DeclarationInput(NamedTuple):
    """The raw fields of one ``ProcessDeclaration`` (for :meth:`DeclaredStore.replace_all`)."""

    pid: int
    start_time_ticks: int
    process_context: bytes = b""
    environment: Sequence[tuple[str, bytes]] = ()
    profiler_resource: bytes = b""
    profiler_resource_schema_url: str = ""


@dataclass(frozen=True, slots=True)
class DeclarationLimits:
    """Bounds every declaration must respect (all sizes in bytes)."""

    pid_max: int = PID_MAX_LIMIT
    max_process_context_bytes: int = 65536
    max_environment_bytes: int = 65536
    """Sum of name and value lengths of all variables of one declaration."""
    max_environment_entries: int = 256
    max_profiler_resource_bytes: int = 65536


@dataclass(frozen=True, slots=True, eq=False)
class Declared:
    """What a profiler declared about one process (validated and decoded).

    Shared between threads and caches: treat it, and its dicts, as read-only.

    Attributes:
        pid: host-namespace pid.
        start_time_ticks: field 22 of ``/proc/<pid>/stat`` (clock ticks since boot); 0 = unknown,
            matched on pid alone.
        context_resource: the OTEP 4719 process context's resource attributes.
        context_attributes: the process context's extra attributes (field 2; not resource).
        has_process_context: whether a (non-empty) process context was declared.
        environment: captured variables, name → raw value bytes: the ``OTEL_*`` ones a profiler
            read, and every ``process.environment_variable.<NAME>`` of its resource (any name
            without ``=`` or NUL; only ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES`` are
            parsed, in enriched mode).
        profiler_attributes: the attributes the profiler itself puts on the process's profiles
            (``container.id``, ``k8s.*``, APM ``service.name``, ...).
        declared_at_ns: when the store accepted it, ns since the Unix epoch.
        declarer: id of the declaring profiler connection ("" if unnamed).
        schema_url: the schema URL of ``profiler_attributes`` (the ``schema_url`` of the
            ``ResourceProfiles`` they came from; "" when none was declared).

    """

    pid: int
    start_time_ticks: int
    context_resource: dict[str, AttrValue]
    context_attributes: dict[str, AttrValue]
    has_process_context: bool
    environment: dict[str, bytes]
    profiler_attributes: dict[str, AttrValue]
    declared_at_ns: int
    declarer: str
    schema_url: str = ""


def _as_bytes(value: object, field: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise DeclarationError(field, f"must be bytes, got {type(value).__name__}")


def validate_pid(pid: object, pid_max: int = PID_MAX_LIMIT) -> int:
    """Return ``pid`` if it is an int in 1..``pid_max``.

    Raises:
        DeclarationError: field ``pid``.

    """
    if isinstance(pid, bool) or not isinstance(pid, int) or not 1 <= pid <= pid_max:
        raise DeclarationError("pid", f"must be an integer in 1..{pid_max}, got {pid!r}")
    return pid


def validate_start_time(start_time_ticks: object) -> int:
    """Return ``start_time_ticks`` if it is an int in 0..2^64-1.

    Raises:
        DeclarationError: field ``start_time_ticks``.

    """
    if (
        isinstance(start_time_ticks, bool)
        or not isinstance(start_time_ticks, int)
        or not 0 <= start_time_ticks <= _U64_MAX
    ):
        raise DeclarationError(
            "start_time_ticks", f"must be an integer in 0..2^64-1, got {start_time_ticks!r}"
        )
    return start_time_ticks


def validate_schema_url(schema_url: object) -> str:
    """Return ``schema_url`` if it is a string of at most :data:`MAX_SCHEMA_URL_BYTES` bytes.

    Kept verbatim (OTLP gives ``schema_url`` no syntax to check beyond being a string).

    Raises:
        DeclarationError: field ``profiler_resource_schema_url``.

    """
    field = "profiler_resource_schema_url"
    if not isinstance(schema_url, str):
        raise DeclarationError(field, f"must be a string, got {type(schema_url).__name__}")
    size = len(schema_url.encode("utf-8", "surrogatepass"))
    if size > MAX_SCHEMA_URL_BYTES:
        raise DeclarationError(field, f"{size} bytes exceed the limit of {MAX_SCHEMA_URL_BYTES}")
    return sys.intern(schema_url) if schema_url else ""


def _environment(
    environment: Sequence[tuple[str, bytes]], limits: DeclarationLimits
) -> dict[str, bytes]:
    if len(environment) > limits.max_environment_entries:
        raise DeclarationError(
            "environment",
            f"{len(environment)} variables exceed the limit of {limits.max_environment_entries}",
        )
    out: dict[str, bytes] = {}
    first: dict[str, int] = {}
    total = 0
    for i, item in enumerate(environment):
        try:
            name, value = item
        except (TypeError, ValueError):
            raise DeclarationError(f"environment[{i}]", "must be a (name, value) pair") from None
        if not isinstance(name, str) or not name:
            raise DeclarationError(f"environment[{i}].name", "must be a non-empty string")
        if "=" in name or "\x00" in name:
            raise DeclarationError(
                f"environment[{i}].name", f"{name!r}: a variable name cannot contain '=' or NUL"
            )
        if name in first:
            raise DeclarationError(
                f"environment[{i}].name", f"duplicate of environment[{first[name]}].name"
            )
        raw = _as_bytes(value, f"environment[{i}].value")
        if b"\x00" in raw:
            raise DeclarationError(f"environment[{i}].value", "contains a NUL byte")
        total += len(name) + len(raw)
        if total > limits.max_environment_bytes:
            raise DeclarationError(
                "environment",
                f"more than {limits.max_environment_bytes} bytes of names and values "
                "(identity.declared.max_environment_bytes)",
            )
        first[name] = i
        out[sys.intern(name)] = raw
    return out


def validate_declaration(
    pid: object,
    start_time_ticks: object,
    process_context: object,
    environment: Sequence[tuple[str, bytes]],
    profiler_resource: object,
    *,
    declarer: str,
    declared_at_ns: int,
    limits: DeclarationLimits,
    schema_url: object = "",
) -> Declared:
    """Validate and decode one declaration.

    ``process_context`` is a serialized OTEP 4719 ``ProcessContext`` (empty = none);
    ``profiler_resource`` a serialized ``opentelemetry.proto.resource.v1.Resource`` (empty =
    none); ``schema_url`` its schema URL (``profiler_resource_schema_url``, "" = none).

    Raises:
        DeclarationError: naming the first offending field.

    """
    pid_v = validate_pid(pid, limits.pid_max)
    start = validate_start_time(start_time_ticks)
    ctx_raw = _as_bytes(process_context, "process_context")
    if len(ctx_raw) > limits.max_process_context_bytes:
        raise DeclarationError(
            "process_context",
            f"{len(ctx_raw)} bytes exceed the limit of {limits.max_process_context_bytes} "
            "(identity.declared.max_process_context_bytes)",
        )
    ctx_resource: dict[str, AttrValue] = {}
    ctx_attrs: dict[str, AttrValue] = {}
    if ctx_raw:
        try:
            decoded = decode_process_context(ctx_raw)
        except ProcessContextDecodeError as exc:
            raise DeclarationError(
                "process_context", str(exc)
            ) from None  # "not a ProcessContext: …"
        ctx_resource, ctx_attrs = decoded.resource, decoded.attributes
    env = _environment(environment, limits)
    res_raw = _as_bytes(profiler_resource, "profiler_resource")
    if len(res_raw) > limits.max_profiler_resource_bytes:
        raise DeclarationError(
            "profiler_resource",
            f"{len(res_raw)} bytes exceed the limit of {limits.max_profiler_resource_bytes} "
            "(identity.declared.max_profiler_resource_bytes)",
        )
    prof: dict[str, AttrValue] = {}
    if res_raw:
        try:
            prof = from_key_values(resource_pb2.Resource.FromString(res_raw).attributes)
        except DecodeError as exc:
            raise DeclarationError("profiler_resource", f"not a Resource: {exc}") from None
    schema = validate_schema_url(schema_url)
    return Declared(
        pid=pid_v,
        start_time_ticks=start,
        context_resource=ctx_resource,
        context_attributes=ctx_attrs,
        has_process_context=bool(ctx_raw),
        environment=env,
        profiler_attributes=prof,
        declared_at_ns=declared_at_ns,
        declarer=declarer,
        schema_url=schema,
    )
