"""The path of every simulated call: from a ctypes callback to a handler and back.

Order of checks, as the real library behaves (NVML API reference: initialisation and error
codes; nvidia-ml-py's ``pynvml.py`` for how each code surfaces):

1. after ``uninstall``: UNINITIALIZED; due scenario events are applied and due NVML events
   delivered to the event sets registered for them;
2. the call is counted per (symbol, device index);
3. library state: access revoked (UNKNOWN; ``nvmlShutdown`` still releases the caller's
   reference), upgraded driver (its code), reloaded driver (UNINITIALIZED until the reference
   count is back to 0; ``nvmlShutdown`` still counts), not initialised (UNINITIALIZED) --
   except for the calls allowed before init;
4. faults: latency (PCIe's built-in window included) and hangs pass *outside* the lock,
   then an injected code is returned (and the symbol's ``on_fault`` sees it: a registration
   answering UNKNOWN leaves its event set undefined, as nvml.h says);
5. the handle: unknown/NULL (INVALID_ARGUMENT and a violation; with ``driver.invalid_handle:
   abort`` the process aborts, as the real library crashes), stale (its code), lost GPU
   (GPU_IS_LOST), MIG handle where only a GPU is accepted (the symbol's ``mig_code``);
6. the handler writes the outputs under the lock.

Any exception inside is recorded as an ``internal_error`` violation and answered UNKNOWN, so a
bug can never turn into a silent SUCCESS.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from nvmlsim import codes
from nvmlsim.clock import ManualClock
from nvmlsim.symbols.base import Call, Symbol
from nvmlsim.world import DeviceState, MigState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["make_callback"]

_PCIE = "nvmlDeviceGetPcieThroughput"


def _resolve(drv: SimDriver, sym: Symbol, args: tuple[Any, ...]) -> tuple[Any, Any]:
    """Return (target, handle entry or None) without judging validity."""
    kind = sym.target
    if kind == "none":
        return None, None
    if kind == "index":
        index = args[0]
        devices = drv.world.devices
        return (devices[index] if 0 <= index < len(devices) else None), None
    if kind == "uuid":
        raw = args[0] or b""
        return drv.world.by_uuid.get(raw.decode("utf-8", "replace")), None
    entry = drv.world.handles.lookup(args[0])
    return (entry.target if entry is not None else None), entry


def _handle_error(drv: SimDriver, sym: Symbol, target: Any, entry: Any) -> int | None:
    if sym.target not in ("device", "any"):
        return None
    if entry is None:
        drv.violation("invalid_handle", sym.name, "NULL or unknown device handle")
        if drv.scenario.driver.invalid_handle == "abort":
            _abort(sym.name)
        return codes.INVALID_ARGUMENT
    if entry.stale_code is not None:
        return int(entry.stale_code)
    parent = target.parent if isinstance(target, MigState) else target
    if parent.lost:
        return codes.GPU_IS_LOST
    if sym.target == "device" and isinstance(target, MigState):
        return sym.mig_code
    return None


def _abort(name: str) -> None:
    """End the process as the real library does when it dereferences a bad handle."""
    sys.stderr.write(
        f"nvmlsim: {name} called with a NULL or never-issued device handle; aborting, as "
        "libnvidia-ml would crash (driver.invalid_handle: abort)\n"
    )
    sys.stderr.flush()
    os.abort()


def _hold(drv: SimDriver, delta: int) -> None:
    with drv.activity:
        drv.held += delta
        drv.activity.notify_all()


def _wait(drv: SimDriver, seconds: float, hang: bool, name: str) -> int | None:
    """Pass injected latency, then a hang; returns TIMEOUT if a hang was never released."""
    if seconds > 0 and drv.latency != "off":
        clock = drv.clock
        if drv.latency == "block" and isinstance(clock, ManualClock):
            end = clock.now_us() + round(seconds * 1e6)
            _hold(drv, 1)
            try:
                reached = clock.wait_until(end, drv.max_hang_s)
            finally:
                _hold(drv, -1)
            if not reached:
                drv.violation(
                    "hang_not_released",
                    name,
                    f"clock never reached the end of a {seconds} s call within {drv.max_hang_s} s",
                )
        else:
            clock.sleep(seconds)
    if hang and not drv.closed:
        with drv.activity:
            release = drv.hang_event
            drv.held += 1
            drv.activity.notify_all()
        try:
            if not release.wait(drv.max_hang_s):
                drv.violation("hang_not_released", name, f"not released within {drv.max_hang_s} s")
                return codes.TIMEOUT
        finally:
            _hold(drv, -1)
    return None


class _Trace:
    """Per-call bookkeeping: real time spent waiting, and the counter key once known."""

    __slots__ = ("waited_ns", "key")

    def __init__(self) -> None:
        self.waited_ns = 0
        self.key: tuple[str, int | None] | None = None


def _timed_wait(drv: SimDriver, trace: _Trace, seconds: float, hang: bool, name: str) -> int | None:
    started = time.perf_counter_ns()
    try:
        return _wait(drv, seconds, hang, name)
    finally:
        trace.waited_ns += time.perf_counter_ns() - started


def _run(drv: SimDriver, sym: Symbol, args: tuple[Any, ...], trace: _Trace) -> int:
    name = sym.name
    with drv.lock:
        if drv.closed:
            return codes.UNINITIALIZED
        now = drv.clock.now_us()
        drv.apply_due(now)
        target, entry = _resolve(drv, sym, args)
        parent = target.parent if isinstance(target, MigState) else target
        trace.key = (name, parent.index if isinstance(parent, DeviceState) else None)
        drv.counts[trace.key] += 1
        if sym.needs_init:
            if drv.revoked and name != "nvmlShutdown":
                return codes.UNKNOWN
            if drv.upgraded_code is not None:
                return drv.upgraded_code
            if drv.reloaded and name != "nvmlShutdown":
                return codes.UNINITIALIZED  # the session died with the old module
            if drv.init_count == 0:
                if drv.strict:
                    drv.violation("call_while_uninitialized", name, "no nvmlInit in force")
                return codes.UNINITIALIZED
        sizing = sym.sizing(args) if sym.sizing is not None else None
        arg = args[sym.arg] if sym.arg is not None else None
        action = drv.faults.match(name, target, arg, sizing, now)
    if action is not None:
        if action.latency_s > 0 or action.hang:
            timed_out = _timed_wait(drv, trace, action.latency_s, action.hang, name)
            if timed_out is not None:
                return timed_out
        if action.code is not None:
            if sym.on_fault is not None:
                with drv.lock:
                    sym.on_fault(drv, args, action.code)
            return action.code
    with drv.lock:
        if drv.closed or (sym.needs_init and drv.init_count == 0):
            return codes.UNINITIALIZED  # shut down while this call waited (F22)
        error = _handle_error(drv, sym, target, entry)
        if error is not None:
            return error
        now = drv.clock.now_us()
        timeline = drv.timeline
        overrides = drv.overrides.active(name, target, arg, now)
        call = Call(name, now, timeline.seconds(now), timeline.cycle(now), overrides, sizing)
        code = sym.handler(drv, call, target, *args)
    if name == _PCIE and code == codes.SUCCESS and drv.pcie_window_s > 0:
        _timed_wait(drv, trace, drv.pcie_window_s, False, name)  # the 20 ms sampling window
    return code


def make_callback(drv: SimDriver, sym: Symbol) -> Any:
    """Build the ``CFUNCTYPE`` function pointer that nvidia-ml-py will call for ``sym``."""
    prototype = ctypes.CFUNCTYPE(sym.restype, *sym.argtypes)
    on_error = codes.UNKNOWN
    if sym.direct:  # nvmlErrorString: returns a pointer, never fails, needs no init

        def direct(*args: Any) -> Any:
            with drv.lock:
                drv.counts[(sym.name, None)] += 1
            return sym.handler(drv, None, None, *args)

        return prototype(direct)

    def callback(*args: Any) -> Any:
        started = time.perf_counter_ns()
        cpu_started = time.thread_time_ns()
        trace = _Trace()
        with drv.activity:
            drv.in_flight += 1
            if drv.watchers:
                drv.activity.notify_all()
        try:
            return _run(drv, sym, args, trace)
        except Exception as exc:  # noqa: BLE001 - a simulator bug must not become SUCCESS
            drv.violation("internal_error", sym.name, f"{type(exc).__name__}: {exc}")
            return on_error
        finally:
            with drv.activity:
                drv.in_flight -= 1
                if drv.watchers:
                    drv.activity.notify_all()
                drv.driver_ns += time.perf_counter_ns() - started - trace.waited_ns
                drv.driver_cpu_ns += time.thread_time_ns() - cpu_started
                drv.wait_ns += trace.waited_ns

    return prototype(callback)
