"""The OTEP 4719 ``ProcessContext`` payload, decoded and encoded by hand.

``opentelemetry/proto/processcontext/v1development/process_context.proto`` (opentelemetry-proto
v1.11.0) is::

    message ProcessContext {
      opentelemetry.proto.resource.v1.Resource resource = 1;
      repeated opentelemetry.proto.common.v1.KeyValue attributes = 2;
    }

The ``opentelemetry-proto`` wheel is generated from v1.10.0 and has no ``processcontext``
module, so (``shared/reference/process-identity.md`` §3.7) we walk the two top-level fields
ourselves and hand their bytes to the generated ``Resource``/``KeyValue`` classes, which do the
real decoding (including UTF-8 validation of strings). Protobuf rules kept: unknown fields are
skipped; repeated occurrences of the singular ``resource`` field are merged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from gpumetrics.identity.attrs import AttrValue, from_key_values, to_key_values
from gpumetrics.wire import WIRE_LEN, len_field


class ProcessContextDecodeError(ValueError):
    """The bytes are not a valid ``ProcessContext``; the message says where and why."""


@dataclass(frozen=True, slots=True)
class ProcessContextPayload:
    """A decoded ``ProcessContext``: the published resource and the extra attributes (field 2)."""

    resource: dict[str, AttrValue]
    attributes: dict[str, AttrValue]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ProcessContextDecodeError(f"truncated varint at byte {pos}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise ProcessContextDecodeError(f"varint too long at byte {pos}")


def _skip(buf: bytes, pos: int, wire_type: int) -> int:
    if wire_type == 0:
        return _varint(buf, pos)[1]
    if wire_type == 1:
        end = pos + 8
    elif wire_type == 5:
        end = pos + 4
    elif wire_type == WIRE_LEN:
        size, pos = _varint(buf, pos)
        end = pos + size
    else:
        raise ProcessContextDecodeError(f"unsupported wire type {wire_type} at byte {pos}")
    if end > len(buf):
        raise ProcessContextDecodeError(f"truncated field at byte {pos}")
    return end


def decode_process_context(payload: bytes) -> ProcessContextPayload:
    """Decode a serialized ``ProcessContext``.

    Returns:
        The resource attributes (field 1) and extra attributes (field 2), as Python values
        (:mod:`gpumetrics.identity.attrs`); empty dicts for an empty payload.

    Raises:
        ProcessContextDecodeError: malformed wire data, a wrong wire type for field 1 or 2, or a
            nested message the generated classes reject (e.g. a string that is not UTF-8).

    """
    resource = resource_pb2.Resource()
    extra: list[common_pb2.KeyValue] = []
    pos = 0
    while pos < len(payload):
        tag_at = pos
        key, pos = _varint(payload, pos)
        field, wire_type = key >> 3, key & 7
        if field == 0:
            raise ProcessContextDecodeError(f"field number 0 at byte {tag_at}")
        if field in (1, 2) and wire_type != WIRE_LEN:
            raise ProcessContextDecodeError(
                f"field {field} at byte {tag_at} has wire type {wire_type}, want 2"
            )
        end = _skip(payload, pos, wire_type)
        if field in (1, 2):
            size, start = _varint(payload, pos)
            chunk = payload[start:end]
            try:
                if field == 1:
                    resource.MergeFromString(chunk)
                else:
                    extra.append(common_pb2.KeyValue.FromString(chunk))
            except DecodeError as exc:
                name = "resource" if field == 1 else f"attributes[{len(extra)}]"
                raise ProcessContextDecodeError(f"{name}: {exc}") from None
        pos = end
    return ProcessContextPayload(from_key_values(resource.attributes), from_key_values(extra))


def encode_process_context(
    resource: Mapping[str, AttrValue], attributes: Mapping[str, AttrValue] | None = None
) -> bytes:
    """Serialize a ``ProcessContext`` the way the reference C publisher lays it out.

    Field 1 (``Resource``) first, then one field-2 entry per extra attribute.

    Raises:
        gpumetrics.metrics.encode.EncodingError: an attribute value with no ``AnyValue`` form.

    """
    res = resource_pb2.Resource()
    to_key_values(res.attributes, resource)
    out = bytearray(len_field(1, res.SerializeToString()))
    for key, value in (attributes or {}).items():
        holder = resource_pb2.Resource()
        to_key_values(holder.attributes, {key: value})
        out += len_field(2, holder.attributes[0].SerializeToString())
    return bytes(out)
