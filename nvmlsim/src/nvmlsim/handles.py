"""Opaque device handles, as ``nvmlDeviceGetHandleBy*`` hands them out, and their validation.

A handle is a non-NULL pointer value that nvidia-ml-py stores in a ``c_nvmlDevice_t`` and
never dereferences (the C type is an opaque struct). Each table draws a random base address
in user space and hands out ``base + 16*k``, so handles are unique within a driver and a handle
kept from an earlier install is (with overwhelming probability) unknown to the next one.
A handle of a GPU that was reset, or of a destroyed MIG instance, is *retired*: it still
resolves, to the code it must answer (``driver.stale_handle_code``). Anything else, NULL
included, is unknown: the driver answers INVALID_ARGUMENT and records a violation, because the
real library would crash or misbehave.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["HandleTable", "HandleEntry"]

T = TypeVar("T")

_REGION = 0x5000_0000_0000  # inside the x86-64/aarch64 user address range, 16-byte aligned
_STRIDE = 16


@dataclass
class HandleEntry(Generic[T]):
    """What a handle stands for; ``stale_code`` is set once the handle was retired."""

    target: T
    stale_code: int | None = None


class HandleTable(Generic[T]):
    """Issues, resolves and retires handles for one simulated driver instance."""

    def __init__(self) -> None:
        self._entries: dict[int, HandleEntry[T]] = {}
        self._base = _REGION + (secrets.randbelow(1 << 24) << 20)
        self._next = 0

    def issue(self, target: T) -> int:
        """Return a new handle (a pointer value) that resolves to ``target``."""
        self._next += 1
        handle = self._base + self._next * _STRIDE
        self._entries[handle] = HandleEntry(target)
        return handle

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
