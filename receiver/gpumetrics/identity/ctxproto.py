"""The OTEP 4719 ``ProcessContext`` payload, decoded and encoded with generated protobuf code.

The message (``resource = 1``, ``repeated attributes = 2``) is declared in
``proto/gpumetrics/processcontext/v1/process_context.proto`` from the field numbers of OTEP 4719
(https://github.com/open-telemetry/opentelemetry-specification/blob/main/oteps/profiles/4719-process-ctx.md,
"Payload Format") and of open-telemetry/opentelemetry-proto#783, which added it upstream in
v1.11.0; the ``opentelemetry-proto`` wheel is generated from v1.10.0 and has no
``processcontext`` module. The nested ``Resource``/``KeyValue`` messages are the wheel's.

Protobuf's rules apply as in any reader, the eBPF profiler's included: unknown fields are
skipped (a field 1 or 2 with another wire type is an unknown field too), repeated occurrences of
the singular ``resource`` field are merged, and strings must be valid UTF-8.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from gpumetrics.identity.attrs import AttrValue, from_key_values, to_key_values
from gpumetrics.processcontext.v1.process_context_pb2 import ProcessContext


class ProcessContextDecodeError(ValueError):
    """The bytes are not a valid ``ProcessContext``; the message says why (protobuf's reason)."""


@dataclass(frozen=True, slots=True)
class ProcessContextPayload:
    """A decoded ``ProcessContext``: the published resource and the extra attributes (field 2)."""

    resource: dict[str, AttrValue]
    attributes: dict[str, AttrValue]


def decode_process_context(payload: bytes) -> ProcessContextPayload:
    """Decode a serialized ``ProcessContext``.

    Returns:
        The resource attributes (field 1) and extra attributes (field 2), as Python values
        (:mod:`gpumetrics.identity.attrs`); empty dicts for an empty payload.

    Raises:
        ProcessContextDecodeError: malformed wire data (truncated, field number 0, a group wire
            type) or a string that is not UTF-8, with protobuf's reason.

    """
    try:
        ctx = ProcessContext.FromString(payload)
    except DecodeError as exc:
        raise ProcessContextDecodeError(f"not a ProcessContext: {exc}") from None
    return ProcessContextPayload(
        from_key_values(ctx.resource.attributes), from_key_values(ctx.attributes)
    )


def encode_process_context(
    resource: Mapping[str, AttrValue], attributes: Mapping[str, AttrValue] | None = None
) -> bytes:
    """Serialize a ``ProcessContext`` the way the reference C publisher lays it out.

    Field 1 (``Resource``, always present, as the publisher always writes one) first, then one
    field-2 entry per extra attribute.

    Raises:
        gpumetrics.metrics.encode.EncodingError: an attribute value with no ``AnyValue`` form.

    """
    ctx = ProcessContext()
    ctx.resource.SetInParent()
    to_key_values(ctx.resource.attributes, resource)
    to_key_values(ctx.attributes, attributes or {})
    return ctx.SerializeToString()
