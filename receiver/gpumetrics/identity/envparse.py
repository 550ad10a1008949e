"""Strict parsing of a process's ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``.

Rules: the OpenTelemetry specification, "Specifying resource information via an environment
variable" (https://opentelemetry.io/docs/specs/otel/resource/sdk/), and the OpenTelemetry eBPF
profiler's strict parser (open-telemetry/opentelemetry-ebpf-profiler PRs #1343 and #1771):

* An empty ``OTEL_RESOURCE_ATTRIBUTES`` is unset (no attributes, no error).
* The value is split on ``,``; each item on its first ``=``. An item without ``=`` (including the
  empty item of ``a=b,,c=d`` or of a trailing comma, and a whitespace-only value) is an error.
* Key and value are trimmed (Go ``strings.TrimSpace``: Unicode White_Space) **before**
  percent-decoding; both keys and values are decoded (``url.PathUnescape``: ``%XX`` only, ``+``
  stays ``+``); a ``%`` not followed by two hex digits is an error.
* Any error discards the **whole** value (nothing from it is used) and is reported.
* Decoded bytes that are not valid UTF-8 (``k=%FF``) are an error too, so the whole value is
  discarded: OTLP/protobuf strings must be UTF-8, and "discard everything on a decoding error" is
  the spec's rule. (The Go-based profiler keeps the raw byte; the Python SDK writes U+FFFD. Neither
  can be reproduced in a valid protobuf string, so we discard.)
* An item whose decoded key is empty (``=v``) is left out; the rest of the value is kept. The
  profiler keeps ``{"": "v"}``, which is not a valid attribute; the Go and Python SDKs drop just
  that key, as we do.
* Duplicate keys: the last one wins. All values are strings (``process.pid=42`` gives ``"42"``).
* ``OTEL_SERVICE_NAME`` overrides ``service.name``. It is used as found (no trimming, no
  percent-decoding). An empty value is unset (the spec's rule); the profiler PRs apply ``""``
  instead, available with ``empty_service_name_is_set=True``. A value that is not UTF-8 is ignored
  and reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

OTEL_RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
"""Name of the variable holding ``key=value,...`` resource attributes (all values strings)."""

OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
"""Name of the variable that sets ``service.name`` (wins over ``OTEL_RESOURCE_ATTRIBUTES``)."""

SERVICE_NAME = "service.name"

# Unicode White_Space, the set Go's unicode.IsSpace (hence strings.TrimSpace) uses. Python's
# str.strip() would also strip U+001C..U+001F, which Go keeps.
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)
_HEX = frozenset(b"0123456789abcdefABCDEF")


class ResourceAttributesError(ValueError):
    """``OTEL_RESOURCE_ATTRIBUTES`` is malformed; the message names the item (0-based) and why."""


@dataclass(frozen=True, slots=True)
class EnvResource:
    """The resource a process declared through its environment.

    Attributes:
        attributes: ``OTEL_RESOURCE_ATTRIBUTES`` (or nothing if it was discarded), then
            ``service.name`` from ``OTEL_SERVICE_NAME``; all values are ``str``.
        errors: one message per discarded variable, e.g.
            ``"OTEL_RESOURCE_ATTRIBUTES: item 1: no '='"``; empty when everything parsed.

    """

    attributes: dict[str, str]
    errors: tuple[str, ...] = ()


def _trim(raw: bytes) -> bytes:
    """Trim Unicode White_Space from both ends, leaving invalid UTF-8 bytes in place."""
    text = raw.decode("utf-8", "surrogateescape")
    return text.strip(_GO_SPACE).encode("utf-8", "surrogateescape")


def _path_unescape(raw: bytes) -> bytes:
    """Decode ``%XX`` escapes (Go ``url.PathUnescape``); ``+`` stays ``+``.

    Raises:
        ValueError: a ``%`` not followed by two hex digits.

    """
    if b"%" not in raw:
        return raw
    out = bytearray()
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == 0x25:  # '%'
            pair = raw[i + 1 : i + 3]
            if len(pair) != 2 or pair[0] not in _HEX or pair[1] not in _HEX:
                raise ValueError(f"invalid percent escape {raw[i : i + 3]!r}")
            out.append(int(pair, 16))
            i += 3
        else:
            out.append(c)
            i += 1
    return bytes(out)


def _decode_part(raw: bytes, index: int, part: str) -> str:
    try:
        decoded = _path_unescape(_trim(raw))
    except ValueError as exc:
        raise ResourceAttributesError(f"item {index} {part}: {exc}") from None
    try:
        return decoded.decode("utf-8")
    except UnicodeDecodeError:
        raise ResourceAttributesError(
            f"item {index} {part}: not valid UTF-8 once percent-decoded"
        ) from None


def parse_resource_attributes(raw: bytes | str) -> dict[str, str]:
    """Parse one ``OTEL_RESOURCE_ATTRIBUTES`` value strictly (see the module docstring).

    Args:
        raw: the value as found in ``/proc/<pid>/environ`` (bytes, possibly invalid UTF-8), or a
            ``str``.

    Returns:
        ``{key: value}``; ``{}`` for an empty value.

    Raises:
        ResourceAttributesError: the value is malformed; nothing of it may be used.

    """
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else bytes(raw)
    if not data:
        return {}
    out: dict[str, str] = {}
    for index, item in enumerate(data.split(b",")):
        key_raw, sep, value_raw = item.partition(b"=")
        if not sep:
            raise ResourceAttributesError(f"item {index}: no '='")
        key = _decode_part(key_raw, index, "key")
        value = _decode_part(value_raw, index, "value")
        if key:
            out[key] = value
    return out


def env_resource(
    environment: Mapping[str, bytes], *, empty_service_name_is_set: bool = False
) -> EnvResource:
    """Build the environment-declared resource of a process.

    Args:
        environment: the process's ``OTEL_*`` variables, name → raw value bytes.
        empty_service_name_is_set: apply an empty ``OTEL_SERVICE_NAME`` as ``service.name=""``
            (the eBPF profiler PRs' behaviour) instead of treating it as unset (the spec's rule).

    Returns:
        The attributes and the reasons any variable was discarded.

    """
    errors: list[str] = []
    attributes: dict[str, str] = {}
    ra = environment.get(OTEL_RESOURCE_ATTRIBUTES)
    if ra is not None:
        try:
            attributes = parse_resource_attributes(ra)
        except ResourceAttributesError as exc:
            errors.append(f"{OTEL_RESOURCE_ATTRIBUTES}: {exc}")
    sn = environment.get(OTEL_SERVICE_NAME)
    if sn is not None and (sn or empty_service_name_is_set):
        try:
            attributes[SERVICE_NAME] = bytes(sn).decode("utf-8")
        except UnicodeDecodeError:
            errors.append(f"{OTEL_SERVICE_NAME}: not valid UTF-8")
    return EnvResource(attributes, tuple(errors))
