"""Protobuf wire-format helpers for the few messages encoded by hand.

Used where generated code is unavailable (go-plugin's ``StdioData``, whose ``.proto`` we do not
copy; the OTEP 4719 ``ProcessContext``, which opentelemetry-proto does not ship) or too slow (the
OTLP data-point fast path in :mod:`gpumetrics.metrics.encode`). Encoding rules: protobuf
"Encoding" guide — varints are little-endian base-128; a tag is ``field << 3 | wire type``;
wire type 2 (LEN) is a varint length followed by the bytes.
"""

from __future__ import annotations

WIRE_VARINT = 0
WIRE_I64 = 1
WIRE_LEN = 2
WIRE_I32 = 5


def varint(n: int) -> bytes:
    r"""Encode a non-negative int as a base-128 varint.

    Raises:
        ValueError: ``n`` is negative (negative int64 fields are not encoded by hand here).

    >>> varint(1), varint(300)
    (b'\x01', b'\xac\x02')

    """
    if n < 0x80:
        if n < 0:
            raise ValueError(f"varint: {n} is negative")
        return bytes((n,))
    if n < 0x4000:  # the common case for lengths: two bytes
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def len_field(field: int, body: bytes) -> bytes:
    """Encode ``body`` as field number ``field`` with wire type LEN (tag, length, bytes)."""
    return varint(field << 3 | WIRE_LEN) + varint(len(body)) + body


def varint_field(field: int, value: int) -> bytes:
    """Encode ``value`` as field number ``field`` with wire type VARINT."""
    return varint(field << 3 | WIRE_VARINT) + varint(value)
