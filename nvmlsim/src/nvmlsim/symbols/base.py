"""How a simulated C symbol is described: its C signature, handler and call routing.

Each ``symbols/<concern>.py`` module lists :class:`Symbol` entries; the dispatcher turns each
into a ``CFUNCTYPE`` callback on the simulated library object. Pointer arguments are declared
``c_void_p`` so the handler receives plain addresses (``None`` for NULL), exactly what the C
library would get from nvidia-ml-py's ``byref(...)``/arrays/handles.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from nvmlsim import codes
from nvmlsim.faults import pick
from nvmlsim.model.values import evaluate

__all__ = ["Symbol", "Call", "Handler", "P", "U32", "I32", "U64", "null_at", "reading"]

P = ctypes.c_void_p
U32 = ctypes.c_uint
I32 = ctypes.c_int
U64 = ctypes.c_ulonglong


class Call:
    """Per-call facts handed to a handler: the time and the overrides in force."""

    __slots__ = ("name", "now_us", "t", "cycle", "overrides", "sizing")

    def __init__(
        self,
        name: str,
        now_us: int,
        t: float,
        cycle: int,
        overrides: tuple[Any, ...],
        sizing: bool | None,
    ) -> None:
        self.name = name
        self.now_us = now_us
        self.t = t
        self.cycle = cycle
        self.overrides = overrides
        self.sizing = sizing


Handler = Callable[..., int]


@dataclass(frozen=True)
class Symbol:
    """One simulated C function.

    Attributes:
        name: the C symbol nvidia-ml-py looks up.
        argtypes: ctypes types of the C parameters (pointers as ``c_void_p``).
        handler: ``handler(driver, call, target, *args) -> return code``; ``target`` is the
            resolved device / MIG instance (or None), ``args`` the raw C arguments.
        target: how the call names its device: ``device`` (a handle of a physical GPU),
            ``any`` (a GPU or MIG handle), ``index``, ``uuid`` (first argument) or ``none``.
        arg: position of the enum/index/pid argument that ``faults[].arg`` matches.
        sizing: tells a sizing call (NULL buffer) from a data call, for two-call functions.
        needs_init: False for the calls allowed before ``nvmlInit`` (init, error strings).
        mig_code: what a MIG handle gets when ``target`` is ``device``.
        restype: C return type (``c_int`` except ``nvmlErrorString``).
        direct: bypass the checks (only ``nvmlErrorString``: it returns a pointer).
        on_fault: ``on_fault(driver, args, code)``, called under the lock when a fault makes
            the call answer ``code``: the state a real failure leaves behind.

    """

    name: str
    argtypes: tuple[Any, ...]
    handler: Handler
    target: Literal["device", "any", "index", "uuid", "none"] = "device"
    arg: int | None = None
    sizing: Callable[[tuple[Any, ...]], bool] | None = None
    needs_init: bool = True
    mig_code: int = codes.NOT_SUPPORTED
    restype: Any = ctypes.c_int
    direct: bool = False
    on_fault: Callable[[Any, tuple[Any, ...], int], None] | None = None


def null_at(position: int) -> Callable[[tuple[Any, ...]], bool]:
    """Build a ``sizing`` test: the call is a sizing call when argument ``position`` is NULL."""

    def sizing(args: tuple[Any, ...]) -> bool:
        return not args[position]

    return sizing


def reading(
    get: Callable[[Any, Call], Any],
    put: Callable[[int, int], None],
) -> Handler:
    """Build a handler for ``f(handle, T *out)`` functions with one numeric output.

    ``get(target, call)`` returns the scenario value (a number or pattern), or None when the
    device cannot report it (NOT_SUPPORTED). The result is rounded, passed through an override
    of field ``value`` and stored with ``put``; a NULL ``out`` is INVALID_ARGUMENT.
    """

    def handler(drv: Any, call: Call, target: Any, handle: int, out: int) -> int:
        if not out:
            return codes.INVALID_ARGUMENT
        value = get(target, call)
        if value is None:
            return codes.NOT_SUPPORTED
        number = round(evaluate(value, call.t, call.cycle))
        put(out, int(pick(call.overrides, "value", number)))
        return codes.SUCCESS

    return handler
