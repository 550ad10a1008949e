"""How many objects a request would become once parsed, counted on the wire before it is parsed.

gRPC's receive limit (``server.max_receive_message_bytes``) bounds a request's wire size, not its
parsed size, and the two can differ by far: an empty element of a repeated message field is two
bytes on the wire (its tag and a zero length) and a message object once parsed. Measured with
upb (protobuf 5/6, the Python runtime grpcio uses): a 3.8 MiB ``DeclareProcessesRequest`` made
of two million empty ``environment`` entries parsed into 108 MiB, 28 times its size.

So the :class:`~gpumetrics.service.gate.Gatekeeper` counts, before parsing a request whose type
can hold repeated fields, its **elements**: every element of a repeated field (a packed run
counts one per byte, its upper bound), and every occurrence of a message field that leads to
one (the walk enters it; counting it also bounds the walk's own work, as a singular field sent
a million times is merged by the parser but walked a million times here). It walks tags and
lengths only (payloads are skipped, never copied), and stops at the first element over the
limit; a request over it is refused without being parsed. The walk follows the protobuf
encoding (https://protobuf.dev/programming-guides/encoding/); what it cannot read (a truncated
field, a group, a wire type that does not exist) ends the count, and the parser that comes next
rejects the request as malformed.

Types that hold no repeated field at any depth (``PullRequest``: its one message field is
singular, and a singular field sent many times is merged, not repeated) have no
:class:`Shape` and are never walked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpumetrics.wire import WIRE_I32, WIRE_I64, WIRE_LEN, WIRE_VARINT

__all__ = ["MAX_DEPTH", "Shape", "TooManyElements", "count_elements", "shape_of"]

MAX_DEPTH = 100
"""Nesting followed at most (protobuf's default recursion limit); deeper, the parser refuses."""


class TooManyElements(ValueError):
    """A request holds more elements than the limit (:func:`count_elements`).

    Attributes:
        limit: the limit that was passed.

    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"more than {limit} repeated elements")


@dataclass
class Shape:
    """What the walk needs of one message type: which fields count, which it enters.

    Attributes:
        counted: field numbers each occurrence of which is an element (repeated fields, and
            message fields whose type has a shape).
        packed: repeated scalar field numbers (a length-delimited occurrence is a packed run).
        children: message field number → the shape of its type, or None when that type holds
            no repeated field (an element of a repeated field of that type is counted, not
            entered).

    """

    counted: frozenset[int] = frozenset()
    packed: frozenset[int] = frozenset()
    children: dict[int, Shape | None] = field(default_factory=dict)


def _is_repeated(fd: Any) -> bool:
    repeated = getattr(fd, "is_repeated", None)  # protobuf >= 6.31
    if repeated is not None:
        return bool(repeated)
    return bool(fd.label == fd.LABEL_REPEATED)


def shape_of(descriptor: Any) -> Shape | None:
    """Return the :class:`Shape` of a message type, or None when it holds nothing to count.

    Args:
        descriptor: a ``google.protobuf.descriptor.Descriptor`` (``Message.DESCRIPTOR``).

    """
    return _shape(descriptor, {})


def _shape(descriptor: Any, memo: dict[str, Shape | None]) -> Shape | None:
    name = descriptor.full_name
    if name in memo:
        return memo[name]
    shape = Shape()
    memo[name] = shape  # before the fields: a recursive type refers to itself
    counted: set[int] = set()
    packed: set[int] = set()
    for fd in descriptor.fields:
        if fd.message_type is not None:
            child = _shape(fd.message_type, memo)
            if child is not None or _is_repeated(fd):
                counted.add(fd.number)
                shape.children[fd.number] = child
        elif _is_repeated(fd):
            counted.add(fd.number)
            if fd.type not in (fd.TYPE_STRING, fd.TYPE_BYTES):
                packed.add(fd.number)
    if not counted:
        memo[name] = None
        return None
    shape.counted, shape.packed = frozenset(counted), frozenset(packed)
    return shape


class _Unreadable(Exception):
    """The wire format ends or breaks here: the parser will say how."""


def count_elements(data: bytes, shape: Shape, limit: int) -> int:
    """Count the elements (see the module docstring) of one encoded message of ``shape``.

    Args:
        data: the encoded message.
        shape: its type's :func:`shape_of`.
        limit: the most elements allowed.

    Returns:
        The elements counted (up to where the encoding could be read).

    Raises:
        TooManyElements: as soon as the count passes ``limit``.

    """
    counter = [0]
    try:
        _walk(data, 0, len(data), shape, limit, counter, 0)
    except _Unreadable:
        pass
    return counter[0]


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Unreadable
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _walk(
    data: bytes, pos: int, end: int, shape: Shape, limit: int, counter: list[int], depth: int
) -> None:
    if depth >= MAX_DEPTH:
        raise _Unreadable
    counted, packed, children = shape.counted, shape.packed, shape.children
    while pos < end:
        key, pos = _varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if wire == WIRE_VARINT:
            _, pos = _varint(data, pos, end)
            size = 0
        elif wire == WIRE_LEN:
            size, pos = _varint(data, pos, end)
            if pos + size > end:
                raise _Unreadable
        elif wire == WIRE_I64:
            size = 8
        elif wire == WIRE_I32:
            size = 4
        else:  # groups (3, 4) and wire types 6, 7: nothing our requests use
            raise _Unreadable
        if number in counted:
            counter[0] += size if (wire == WIRE_LEN and number in packed) else 1
            if counter[0] > limit:
                raise TooManyElements(limit)
            child = children.get(number)
            if child is not None and wire == WIRE_LEN:
                _walk(data, pos, pos + size, child, limit, counter, depth + 1)
        if wire != WIRE_VARINT:
            pos += size
    if pos > end:
        raise _Unreadable
