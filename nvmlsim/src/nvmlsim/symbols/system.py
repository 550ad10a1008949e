"""Library lifecycle, system queries and device enumeration.

Init keeps NVML's reference count: every successful ``nvmlInitWithFlags`` adds one, every
``nvmlShutdown`` removes one, and at zero every other call answers UNINITIALIZED. After a
``reload_driver`` event every call answers UNINITIALIZED until the count is back to 0 and a
new ``nvmlInit`` starts a session on the reloaded module.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING

from nvmlsim import codes
from nvmlsim.faults import pick
from nvmlsim.memio import put_i32, put_pointer, put_string, put_u32
from nvmlsim.symbols.base import I32, U32, Call, P, Symbol
from nvmlsim.world import DeviceState, MigState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS", "lookup_process_name"]


def _init(drv: SimDriver, call: Call, target: None, flags: int = 0) -> int:
    if drv.revoked:
        return codes.UNKNOWN
    if drv.upgraded_code is not None:
        return codes.LIB_RM_VERSION_MISMATCH
    drv.init_count += 1
    return codes.SUCCESS


def _init_v2(drv: SimDriver, call: Call, target: None) -> int:
    return _init(drv, call, target, 0)


def _shutdown(drv: SimDriver, call: Call, target: None) -> int:
    if drv.strict and drv.in_flight > 1:
        drv.violation(
            "shutdown_during_call",
            call.name,
            f"{drv.in_flight - 1} other call(s) were inside the driver",
        )
    drv.init_count -= 1
    if drv.init_count == 0:
        drv.reloaded = False  # a reloaded driver answers again after the next nvmlInit
        left = drv.event_sets.open_sets()
        if left and drv.strict:
            drv.violation("event_set_not_freed", call.name, f"{left} event set(s) never freed")
        drv.event_sets.forget_all()  # nothing survives the last shutdown
        drv.event_wakeup.notify_all()  # a wait in flight answers UNINITIALIZED
    return codes.SUCCESS


def _error_string(drv: SimDriver, call: None, target: None, code: int) -> int:
    buf = drv.error_strings.get(code)
    if buf is None:
        buf = ctypes.create_string_buffer(codes.error_string(code))
        drv.error_strings[code] = buf
    return ctypes.addressof(buf)


def _driver_version(drv: SimDriver, call: Call, target: None, buf: int, length: int) -> int:
    return put_string(buf, length, drv.driver_version)


def _nvml_version(drv: SimDriver, call: Call, target: None, buf: int, length: int) -> int:
    return put_string(buf, length, drv.nvml_version)


def _cuda_version(drv: SimDriver, call: Call, target: None, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    put_i32(out, int(pick(call.overrides, "value", drv.cuda_version)))
    return codes.SUCCESS


def _read_proc_name(pid: int) -> bytes | None:
    base = Path("/proc") / str(pid)
    try:
        argv0 = (base / "cmdline").read_bytes().split(b"\0", 1)[0]
        return argv0 or (base / "comm").read_bytes().rstrip(b"\n")
    except OSError:
        return None


def lookup_process_name(drv: SimDriver, pid: int, now_us: int) -> tuple[int, bytes]:
    """Return what ``nvmlSystemGetProcessName(pid)`` answers: (code, name bytes).

    Order: ``extra_process_names``; an alive scenario process with that pid (its name, or
    /proc for ``self``/``parent`` pids, or its ``name_error``); this machine's /proc if
    ``driver.local_process_names``; otherwise NOT_FOUND.
    """
    extra = drv.scenario.extra_process_names.get(pid)
    if extra is not None:
        return codes.SUCCESS, extra
    alive = [p for p in drv.world.by_pid.get(pid, ()) if p.alive(now_us)]
    if alive:
        proc = alive[-1]
        if proc.name is not None:
            return codes.SUCCESS, proc.name
        if not proc.local:
            return proc.name_error, b""
    elif not drv.scenario.driver.local_process_names:
        return codes.NOT_FOUND, b""
    name = _read_proc_name(pid)
    return (codes.SUCCESS, name) if name is not None else (codes.NOT_FOUND, b"")


def _process_name(drv: SimDriver, call: Call, target: None, pid: int, buf: int, length: int) -> int:
    code, name = lookup_process_name(drv, pid, call.now_us)
    if code != codes.SUCCESS:
        return code
    return put_string(buf, length, name, truncate=True)


def _count(drv: SimDriver, call: Call, target: None, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    put_u32(out, int(pick(call.overrides, "value", len(drv.world.devices))))
    return codes.SUCCESS


def _by_index(drv: SimDriver, call: Call, target: DeviceState | None, index: int, out: int) -> int:
    if target is None or not out:
        return codes.INVALID_ARGUMENT
    if target.lost:
        return codes.GPU_IS_LOST
    put_pointer(out, target.handle)
    return codes.SUCCESS


def _by_uuid(
    drv: SimDriver, call: Call, target: DeviceState | MigState | None, uuid: bytes, out: int
) -> int:
    if not uuid or not out:
        return codes.INVALID_ARGUMENT
    if target is None:
        return codes.NOT_FOUND
    parent = target.parent if isinstance(target, MigState) else target
    if parent.lost:
        return codes.GPU_IS_LOST
    put_pointer(out, target.handle)
    return codes.SUCCESS


SYMBOLS = [
    Symbol("nvmlInitWithFlags", (U32,), _init, target="none", needs_init=False),
    Symbol("nvmlInit_v2", (), _init_v2, target="none", needs_init=False),
    Symbol("nvmlShutdown", (), _shutdown, target="none"),
    Symbol(
        "nvmlErrorString",
        (I32,),
        _error_string,
        target="none",
        needs_init=False,
        restype=ctypes.c_void_p,
        direct=True,
    ),
    Symbol("nvmlSystemGetDriverVersion", (P, U32), _driver_version, target="none"),
    Symbol("nvmlSystemGetNVMLVersion", (P, U32), _nvml_version, target="none"),
    Symbol("nvmlSystemGetCudaDriverVersion", (P,), _cuda_version, target="none"),
    Symbol("nvmlSystemGetCudaDriverVersion_v2", (P,), _cuda_version, target="none"),
    Symbol("nvmlSystemGetProcessName", (U32, P, U32), _process_name, target="none", arg=0),
    Symbol("nvmlDeviceGetCount_v2", (P,), _count, target="none"),
    Symbol("nvmlDeviceGetHandleByIndex_v2", (U32, P), _by_index, target="index", arg=0),
    Symbol("nvmlDeviceGetHandleByUUID", (ctypes.c_char_p, P), _by_uuid, target="uuid"),
]
