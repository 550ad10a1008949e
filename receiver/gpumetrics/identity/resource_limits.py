"""Limits on one per-process resource: value length, attribute count and encoded bytes.

A per-process resource is built from what a profiler declared and what a process says about
itself (``OTEL_RESOURCE_ATTRIBUTES``, captured environment variables, its OTEP 4719 context), and
it is copied into **every** batch the process has points in: a 64 KiB attribute value on each of
1 000 GPU processes is 64 MiB per batch (issue 23). So every resource is cut to
:class:`ResourceLimits` once, when the resourcer builds it, with the semantics of the
OpenTelemetry SDK's attribute limits (specification, "Common: Attribute Limits",
https://opentelemetry.io/docs/specs/otel/common/#attribute-limits, the limits
``AttributeValueLengthLimit`` / ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` and ``AttributeCountLimit``
/ ``OTEL_ATTRIBUTE_COUNT_LIMIT``):

* **value length**: a string longer than ``attribute_value_length_limit`` characters (code
  points) is truncated to that many; a byte array likewise, counting bytes; an array or a map
  has the rule applied to each of its values, recursively; other values are never truncated;
* **count**: at most ``attribute_count_limit`` top-level attributes; an attribute whose addition
  would exceed it is discarded (nested map entries do not count);
* **bytes** (ours; the specification has no such limit): the resource's attributes, as OTLP
  encodes them (``KeyValue`` entries of ``Resource.attributes``), take at most ``max_bytes``; an
  attribute whose addition would exceed it is discarded.

The specification exempts resources from these limits ("Exempt Entities") because an SDK's
resource is the application's own and is sent once per batch; here neither holds: the resource
is another process's say and is repeated in every batch, so it is limited.

Attributes are admitted in the resource's order, except that the keys the sidecar observes
(:func:`~gpumetrics.identity.modes.is_observed_key`: host, pid, executable, owner, container...)
and ``service.name`` come first: a process cannot push its observed identity out of its resource
by declaring many or large attributes of its own. What is kept stays in the original order, so a
resource within the limits is returned unchanged (the same object).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.common.v1 import common_pb2

from gpumetrics.identity.attrs import AttrValue
from gpumetrics.identity.envparse import SERVICE_NAME
from gpumetrics.identity.modes import is_observed_key
from gpumetrics.metrics.encode import EncodingError, set_any_value
from gpumetrics.wire import varint

__all__ = [
    "DEFAULT_ATTRIBUTE_COUNT_LIMIT",
    "DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "DEFAULT_MAX_RESOURCE_BYTES",
    "LIMIT_REASONS",
    "Limited",
    "ResourceLimits",
    "limit_resource",
]

DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT = 4096
"""Default ``attribute_value_length_limit`` (characters): ``PATH_MAX``, so an executable path is
never cut (the specification's default is no limit)."""

DEFAULT_ATTRIBUTE_COUNT_LIMIT = 128
"""Default ``attribute_count_limit``: the specification's default ``AttributeCountLimit``."""

DEFAULT_MAX_RESOURCE_BYTES = 8 * 1024
"""Default ``max_bytes`` of one resource (By, as encoded): room for a ``PATH_MAX`` executable
path and dozens of typical attributes (a resource with service, container and Kubernetes
attributes takes under 1 KiB)."""

LIMIT_REASONS = ("value_length", "count", "max_bytes", "unencodable")
"""How an attribute was limited: truncated (``value_length``) or discarded by the count limit,
the byte limit, or because OTLP cannot encode its value (e.g. an int outside int64), which would
otherwise fail the whole batch."""

_KEYVALUE_TAG = 1
"""``Resource.attributes`` is field 1: each entry costs a tag byte and its length's varint."""


@dataclass(frozen=True)
class ResourceLimits:
    """Bounds of one per-process resource (``identity.resource_limits``; module docstring).

    Attributes:
        attribute_value_length_limit: longest string value (characters) or byte array (bytes),
            also inside arrays and maps.
        attribute_count_limit: most top-level attributes.
        max_bytes: most encoded bytes of the resource's attributes (By).

    Raises:
        ValueError: naming the field, when a limit is not an int >= 1.

    """

    attribute_value_length_limit: int = DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT
    attribute_count_limit: int = DEFAULT_ATTRIBUTE_COUNT_LIMIT
    max_bytes: int = DEFAULT_MAX_RESOURCE_BYTES

    def __post_init__(self) -> None:
        for name in ("attribute_value_length_limit", "attribute_count_limit", "max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"'{name}': must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class Limited:
    """What :func:`limit_resource` made of one resource.

    Attributes:
        attributes: the resource within the limits (the input object itself when nothing was cut).
        encoded_bytes: its attributes' encoded size (By), at most ``max_bytes``.
        cut: ``(key, reason)`` for every attribute truncated or discarded, reasons from
            :data:`LIMIT_REASONS`, in the resource's order.

    """

    attributes: dict[str, AttrValue]
    encoded_bytes: int
    cut: tuple[tuple[str, str], ...] = field(default=())


def _truncate(value: Any, limit: int) -> Any:
    """``value`` with every string and byte array in it cut to ``limit`` (specification rules)."""
    if isinstance(value, str | bytes):
        return value[:limit] if len(value) > limit else value
    if isinstance(value, list):
        items = [_truncate(v, limit) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if isinstance(value, dict):
        out = {k: _truncate(v, limit) for k, v in value.items()}
        return out if any(out[k] is not v for k, v in value.items()) else value
    return value


def _encoded_size(key: str, value: Any) -> int:
    """Bytes of one ``Resource.attributes`` entry as the producer encodes it (tag and length too).

    Raises:
        EncodingError: OTLP cannot hold ``value``.

    """
    kv = common_pb2.KeyValue(key=key)
    set_any_value(kv.value, value, key)
    n = kv.ByteSize()
    return len(varint(_KEYVALUE_TAG << 3 | 2)) + len(varint(n)) + n


def _admission_order(attrs: Mapping[str, Any]) -> list[str]:
    first = [k for k in attrs if k == SERVICE_NAME or is_observed_key(k)]
    return first + [k for k in attrs if k != SERVICE_NAME and not is_observed_key(k)]


def limit_resource(attrs: dict[str, AttrValue], limits: ResourceLimits) -> Limited:
    """Cut one resource to ``limits`` (see the module docstring for the rules and the order).

    Args:
        attrs: the resource's attributes (not modified).
        limits: the bounds.

    Returns:
        The resource within the limits and what was cut; ``attributes`` is ``attrs`` itself
        when nothing was.

    """
    kept: dict[str, Any] = {}
    truncated: set[str] = set()
    dropped: dict[str, str] = {}
    size = 0
    for key in _admission_order(attrs):
        value = _truncate(attrs[key], limits.attribute_value_length_limit)
        if len(kept) >= limits.attribute_count_limit:
            dropped[key] = "count"
            continue
        try:
            n = _encoded_size(key, value)
        except EncodingError:
            dropped[key] = "unencodable"
            continue
        if size + n > limits.max_bytes:
            dropped[key] = "max_bytes"
            continue
        kept[key] = value
        size += n
        if value is not attrs[key]:
            truncated.add(key)
    if not dropped and not truncated:
        return Limited(attrs, size)
    cut = tuple(
        (k, dropped.get(k) or "value_length") for k in attrs if k in dropped or k in truncated
    )
    return Limited({k: kept[k] for k in attrs if k in kept}, size, cut)
