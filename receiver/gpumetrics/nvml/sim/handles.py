"""Opaque device handles, as ``nvmlDeviceGetHandleBy*`` hands them out, and their validation.

A handle is the address of a small block of memory owned by the table, so it is non-NULL and
unique for as long as the driver lives, like the real library's pointers; nvidia-ml-py never
dereferences it. A handle of a GPU that was reset, or of a destroyed MIG instance, is
*retired*: it still resolves, to the code it must answer (``driver.stale_handle_code``).
Anything else, NULL included, is unknown: the driver answers INVALID_ARGUMENT and records a
violation, because the real library would crash or misbehave.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["HandleTable", "HandleEntry"]

T = TypeVar("T")


@dataclass
class HandleEntry(Generic[T]):
    """What a handle stands for; ``stale_code`` is set once the handle was retired."""

    target: T
    stale_code: int | None = None


class HandleTable(Generic[T]):
    """Issues, resolves and retires handles for one simulated driver instance."""

    def __init__(self) -> None:
        self._entries: dict[int, HandleEntry[T]] = {}
        self._blocks: list[ctypes.Array[ctypes.c_char]] = []

    def issue(self, target: T) -> int:
        """Return a new handle (an address) that resolves to ``target``."""
        block = ctypes.create_string_buffer(16)
        self._blocks.append(block)
        addr = ctypes.addressof(block)
        self._entries[addr] = HandleEntry(target)
        return addr

    def retire(self, handle: int, code: int) -> None:
        """Make ``handle`` answer ``code`` from now on (a stale handle)."""
        entry = self._entries.get(handle)
        if entry is not None:
            entry.stale_code = code

    def lookup(self, handle: int | None) -> HandleEntry[T] | None:
        """Return the entry of ``handle``, or None for NULL and unknown handles."""
        if not handle:
            return None
        return self._entries.get(handle)
