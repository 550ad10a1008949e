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

from gpumetrics.metrics.encode import encode_attributes

AttrValue: TypeAlias = str | bool | int | float | bytes | list["AttrValue"] | dict[str, "AttrValue"]
"""A resource attribute value: ``str | bool | int | float | bytes | list[AttrValue] |
dict[str, AttrValue]`` (the OTLP ``AnyValue`` variants)."""


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


def to_key_values(target: object, attrs: Mapping[str, AttrValue]) -> None:
    """Append one ``KeyValue`` per item of ``attrs`` to the repeated field ``target``.

    The inverse of :func:`from_key_values`; the encoding is the metrics encoder's
    (:func:`gpumetrics.metrics.encode.encode_attributes`), so resources and data points write
    attribute values the same way.

    Raises:
        gpumetrics.metrics.encode.EncodingError: naming the key, for a value with no ``AnyValue``
            form (e.g. an int outside int64) or an empty key.

    """
    encode_attributes(target, attrs.items())
