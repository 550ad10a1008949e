"""Memory (v1 and v2 views) and confidential-computing memory sizes.

v1 (``nvmlDeviceGetMemoryInfo``): total, free, used, where used includes reserved.
v2 (``nvmlDeviceGetMemoryInfo_v2``): the caller's ``version`` word must be
``nvmlMemory_v2`` (0x02000028); anything else answers the profile's bad-version code (13 on
older branches, F03). A MIG-enabled parent needs ``mig.privileged`` (else NO_PERMISSION); a
MIG handle reports its instance's memory.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from nvmlsim import codes
from nvmlsim.faults import pick
from nvmlsim.memio import get_u32, view
from nvmlsim.model.devices import Memory
from nvmlsim.model.values import evaluate
from nvmlsim.symbols.base import Call, P, Symbol
from nvmlsim.world import DeviceState, MigState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS", "MEMORY_V1", "MEMORY_V2", "MEMORY_V2_VERSION", "CONF_COMPUTE"]

# nvmlMemory_t: total, free, used (unsigned long long).
MEMORY_V1 = struct.Struct("<QQQ")
# nvmlMemory_v2_t: unsigned version; total, reserved, free, used (unsigned long long).
MEMORY_V2 = struct.Struct("<I4xQQQQ")
MEMORY_V2_VERSION = MEMORY_V2.size | (2 << 24)  # NVML_STRUCT_VERSION(Memory, 2) = 0x02000028
# nvmlConfComputeMemSizeInfo_t: protectedMemSizeKib, unprotectedMemSizeKib.
CONF_COMPUTE = struct.Struct("<QQ")


def _memory(target: DeviceState | MigState) -> tuple[int, Memory | None]:
    if isinstance(target, MigState):
        mem = target.spec.memory
    elif target.mig_enabled and not (target.spec.mig and target.spec.mig.privileged):
        return codes.NO_PERMISSION, None
    else:
        mem = target.spec.memory
    return (codes.NOT_SUPPORTED, None) if mem is None else (codes.SUCCESS, mem)


def _amounts(mem: Memory, call: Call) -> tuple[int, int, int]:
    used = round(evaluate(mem.used_bytes, call.t, call.cycle))
    return mem.total_bytes, used, mem.reserved_bytes


def _v1(drv: SimDriver, call: Call, target: DeviceState | MigState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    code, mem = _memory(target)
    if mem is None:
        return code
    total, used, reserved = _amounts(mem, call)
    ov = call.overrides
    MEMORY_V1.pack_into(
        view(out, MEMORY_V1.size),
        0,
        int(pick(ov, "total", total)),
        int(pick(ov, "free", total - used - reserved)),
        int(pick(ov, "used", used + reserved)),
    )
    return codes.SUCCESS


def _v2(drv: SimDriver, call: Call, target: DeviceState | MigState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    if get_u32(out) != MEMORY_V2_VERSION:
        return drv.bad_struct_version_code
    code, mem = _memory(target)
    if mem is None:
        return code
    total, used, reserved = _amounts(mem, call)
    ov = call.overrides
    MEMORY_V2.pack_into(
        view(out, MEMORY_V2.size),
        0,
        MEMORY_V2_VERSION,
        int(pick(ov, "total", total)),
        int(pick(ov, "reserved", reserved)),
        int(pick(ov, "free", total - used - reserved)),
        int(pick(ov, "used", used)),
    )
    return codes.SUCCESS


def _conf_compute(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    cc = target.spec.conf_compute
    if cc is None:
        return codes.NOT_SUPPORTED
    ov = call.overrides
    CONF_COMPUTE.pack_into(
        view(out, CONF_COMPUTE.size),
        0,
        int(pick(ov, "protectedMemSizeKib", cc.protected_kib)),
        int(pick(ov, "unprotectedMemSizeKib", cc.unprotected_kib)),
    )
    return codes.SUCCESS


SYMBOLS = [
    Symbol("nvmlDeviceGetMemoryInfo", (P, P), _v1, target="any"),
    Symbol("nvmlDeviceGetMemoryInfo_v2", (P, P), _v2, target="any"),
    Symbol("nvmlDeviceGetConfComputeMemSizeInfo", (P, P), _conf_compute),
]
