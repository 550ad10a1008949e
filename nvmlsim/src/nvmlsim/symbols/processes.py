"""Running-process lists and ``nvmlDeviceGetRunningProcessDetailList``.

Strides: unversioned 16 bytes, ``_v2`` 24, ``_v3`` 24 (32 on the 535.54 profile), detail 32.

Two-call protocol: a NULL buffer answers SUCCESS with count 0 when nothing runs, else
INSUFFICIENT_SIZE with the count; the data call answers INSUFFICIENT_SIZE (and the new count)
if more processes run than the caller's count allows (F20), else fills the records. Records
are written raw at the symbol's stride with ``struct.pack_into``, so a parser using the wrong
layout sees exactly the garbage it would see on hardware (F01, F02). A MIG-enabled parent
answers NO_PERMISSION unless ``mig.privileged``; a MIG handle lists its instance's processes.
A device with ``process_lists: false`` (Jetson) answers NOT_SUPPORTED to all of them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from nvmlsim import codes
from nvmlsim.faults import pick
from nvmlsim.memio import (
    NOT_AVAILABLE_U64,
    RECORD_DETAIL,
    RECORD_V1,
    RECORD_V2,
    RECORD_V3_32,
    get_pointer,
    get_u32,
    put_u32,
    view,
)
from nvmlsim.model.values import evaluate
from nvmlsim.symbols.base import Call, Handler, P, Symbol, null_at
from nvmlsim.world import DeviceState, MigState, ProcState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS", "DETAIL_LIST", "DETAIL_LIST_VERSION"]

# nvmlProcessDetailList_v1_t: unsigned version, mode, numProcArrayEntries; pointer procArray.
DETAIL_LIST = struct.Struct("<III4xQ")
DETAIL_LIST_VERSION = DETAIL_LIST.size | (1 << 24)  # nvmlProcessDetailList_v1 = 0x1000018
_MODES = ("compute", "graphics", "mps")  # NVML_PROCESS_MODE_COMPUTE=0, GRAPHICS=1, MPS=2
_LAYOUT_24 = 24  # what callers of the _v2/_v3 symbols allocate per record


def running(
    drv: SimDriver, call: Call, target: DeviceState | MigState, kind: str
) -> tuple[int, list[ProcState]]:
    """(code, processes of ``kind`` alive and visible on ``target`` now)."""
    gpu = target.parent if isinstance(target, MigState) else target
    if not gpu.spec.process_lists:
        return codes.NOT_SUPPORTED, []
    if isinstance(target, DeviceState) and target.mig_enabled:
        mig = target.spec.mig
        if mig is None or not mig.privileged:
            return codes.NO_PERMISSION, []
    procs = drv.world.processes(target, call.now_us, drv.seen)
    return codes.SUCCESS, [p for p in procs if kind in p.types]


def _fields(p: ProcState, call: Call) -> tuple[int, int, int, int, int]:
    if p.used_memory is None:
        used = NOT_AVAILABLE_U64
    else:
        used = round(evaluate(p.used_memory, call.t, call.cycle))
    fields = (p.pid, used, p.gpu_instance_id, p.compute_instance_id, p.cc_memory)
    ov = call.overrides
    if not ov:
        return fields
    names = (
        "pid",
        "usedGpuMemory",
        "gpuInstanceId",
        "computeInstanceId",
        "usedGpuCcProtectedMemory",
    )
    a, b, c, d, e = (int(pick(ov, n, v, p.pid)) for n, v in zip(names, fields, strict=True))
    return a, b, c, d, e


def _write(
    record: struct.Struct, buf: int, capacity_bytes: int, procs: list[ProcState], call: Call
) -> None:
    fitting = min(len(procs), capacity_bytes // record.size)  # never write past the buffer
    memory = view(buf, fitting * record.size)
    nfields = len(record.unpack(bytes(record.size)))
    for i in range(fitting):
        values = _fields(procs[i], call)
        record.pack_into(memory, i * record.size, *values[:nfields])


def _list_handler(
    kind: str, record: Callable[[SimDriver], struct.Struct], caller_bytes: int
) -> Handler:
    def handler(
        drv: SimDriver, call: Call, target: DeviceState | MigState, h: int, p_count: int, buf: int
    ) -> int:
        if not p_count:
            return codes.INVALID_ARGUMENT
        code, procs = running(drv, call, target, kind)
        if code != codes.SUCCESS:
            return code
        n = len(procs)
        if not buf:
            put_u32(p_count, n)
            return codes.SUCCESS if n == 0 else codes.INSUFFICIENT_SIZE
        capacity = get_u32(p_count)
        if n > capacity:
            put_u32(p_count, n)
            return codes.INSUFFICIENT_SIZE
        stride = record(drv)
        _write(stride, buf, capacity * (caller_bytes or stride.size), procs, call)
        put_u32(p_count, n)
        return codes.SUCCESS

    return handler


def _v3_record(drv: SimDriver) -> struct.Struct:
    return RECORD_V3_32 if drv.v3_record_bytes == 32 else RECORD_V2


def _detail_sizing(args: tuple[object, ...]) -> bool:
    out = args[1]
    return not (isinstance(out, int) and out and get_pointer(out + 16))


def _detail(drv: SimDriver, call: Call, target: DeviceState | MigState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    version, mode, capacity, array = DETAIL_LIST.unpack_from(view(out, DETAIL_LIST.size))
    if version != DETAIL_LIST_VERSION:
        return drv.bad_struct_version_code
    if mode >= len(_MODES):
        return codes.INVALID_ARGUMENT
    code, procs = running(drv, call, target, _MODES[mode])
    if code != codes.SUCCESS:
        return code
    n = len(procs)
    if not array:
        put_u32(out + 8, n)
        return codes.SUCCESS if n == 0 else codes.INSUFFICIENT_SIZE
    if n > capacity:
        put_u32(out + 8, n)
        return codes.INSUFFICIENT_SIZE
    _write(RECORD_DETAIL, array, capacity * RECORD_DETAIL.size, procs, call)
    put_u32(out + 8, n)
    return codes.SUCCESS


def _symbols() -> list[Symbol]:
    out = []
    for kind, prefix in (("compute", "Compute"), ("graphics", "Graphics"), ("mps", "MPSCompute")):
        base = f"nvmlDeviceGet{prefix}RunningProcesses"
        for suffix, record, caller in (
            ("", lambda d: RECORD_V1, 0),
            ("_v2", lambda d: RECORD_V2, _LAYOUT_24),
            ("_v3", _v3_record, _LAYOUT_24),
        ):
            handler = _list_handler(kind, record, caller)
            out.append(Symbol(base + suffix, (P, P, P), handler, target="any", sizing=null_at(2)))
    out.append(
        Symbol(
            "nvmlDeviceGetRunningProcessDetailList",
            (P, P),
            _detail,
            target="any",
            sizing=_detail_sizing,
        )
    )
    return out


SYMBOLS = _symbols()
