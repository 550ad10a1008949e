"""Conversion between OTLP ``AnyValue``/``KeyValue`` messages and Python attribute values.

Shapes (``opentelemetry/proto/common/v1/common.proto``): ``string_value`` → ``str``,
``bool_value`` → ``bool``, ``int_value`` → ``int``, ``double_value`` → ``float``,
``bytes_value`` → ``bytes``, ``array_value`` → ``list``, ``kvlist_value`` → ``dict``.

An ``AnyValue`` with no variant set, or one that only carries a dictionary index
(``string_value_strindex``/``key_strindex``, which need a dictionary that a resource does not
have), was not a value: the key is left out (never replaced by ``""`` or 0). Duplicate keys keep
the last value (what the profilers' ``pcommon.Map.Put*`` does).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import TypeAlias

from opentelemetry.proto.common.v1 import common_pb2

AttrValue: TypeAlias = str | bool | int | float | bytes | list["AttrValue"] | dict[str, "AttrValue"]
"""A resource attribute value: ``str | bool | int | float | bytes | list[AttrValue] |
dict[str, AttrValue]`` (the OTLP ``AnyValue`` variants)."""

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class AttrEncodeError(ValueError):
    """A Python value that has no OTLP ``AnyValue`` form; the message names the key."""


def from_any_value(value: common_pb2.AnyValue) -> AttrValue | None:
    """Return the Python form of ``value``, or None when no variant is set.

    Array elements and kvlist entries without a value are left out.
    """
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    if kind == "bytes_value":
        return value.bytes_value
    if kind == "array_value":
        items = (from_any_value(v) for v in value.array_value.values)
        return [v for v in items if v is not None]
    if kind == "kvlist_value":
        return from_key_values(value.kvlist_value.values)
    return None  # unset, or string_value_strindex without a dictionary


def from_key_values(kvs: Iterable[common_pb2.KeyValue]) -> dict[str, AttrValue]:
    """Return ``{key: value}`` for ``kvs``; empty keys and unset values are left out, last wins."""
    out: dict[str, AttrValue] = {}
    for kv in kvs:
        if not kv.key:
            continue
        converted = from_any_value(kv.value)
        if converted is not None:
            # Keys repeat across processes (service.name, k8s.pod.name, ...): share one copy.
            out[sys.intern(kv.key)] = converted
    return out


def to_any_value(target: common_pb2.AnyValue, value: AttrValue, key: str = "") -> None:
    """Write ``value`` into ``target`` (the inverse of :func:`from_any_value`).

    Raises:
        AttrEncodeError: naming ``key`` for an unsupported type or an int outside int64.

    """
    if isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise AttrEncodeError(f"attribute {key!r}: int {value} outside int64")
        target.int_value = value
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, str):
        target.string_value = value
    elif isinstance(value, bytes):
        target.bytes_value = value
    elif isinstance(value, list):
        arr = target.array_value
        arr.SetInParent()
        for item in value:
            to_any_value(arr.values.add(), item, key)
    elif isinstance(value, dict):
        kvl = target.kvlist_value
        kvl.SetInParent()
        to_key_values(kvl.values, value)
    else:
        raise AttrEncodeError(f"attribute {key!r}: unsupported type {type(value).__name__}")


def to_key_values(target: object, attrs: Mapping[str, AttrValue]) -> None:
    """Append one ``KeyValue`` per item of ``attrs`` to the repeated field ``target``.

    Raises:
        AttrEncodeError: see :func:`to_any_value`.

    """
    for key, value in attrs.items():
        kv = target.add()  # type: ignore[attr-defined]
        kv.key = key
        to_any_value(kv.value, value, key)
