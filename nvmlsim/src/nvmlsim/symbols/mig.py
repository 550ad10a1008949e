"""MIG: mode, slots, MIG device handles and their GPU/compute instance ids.

Behaviour for the unverified corners (documented in the README, "MIG"):
``GetMaxMigDeviceCount`` answers 0 when MIG is unsupported or disabled; ``GetMigDeviceHandle
ByIndex`` answers NOT_SUPPORTED without MIG, INVALID_ARGUMENT for an index >= the maximum and
NOT_FOUND for an empty slot; the instance-id calls answer NOT_SUPPORTED for a GPU handle and
``GetDeviceHandleFromMigDeviceHandle`` INVALID_ARGUMENT.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nvmlsim import codes
from nvmlsim.faults import pick
from nvmlsim.memio import put_pointer, put_u32
from nvmlsim.symbols.base import U32, Call, Handler, P, Symbol
from nvmlsim.world import DeviceState, MigState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS"]

_MODE = {"disabled": 0, "enabled": 1}  # NVML_DEVICE_MIG_DISABLE / _ENABLE


def _mode(drv: SimDriver, call: Call, target: DeviceState, h: int, cur: int, pend: int) -> int:
    if not cur or not pend:
        return codes.INVALID_ARGUMENT
    mig = target.spec.mig
    if mig is None:
        return codes.NOT_SUPPORTED
    ov = call.overrides
    put_u32(cur, int(pick(ov, "currentMode", _MODE[mig.current])))
    put_u32(pend, int(pick(ov, "pendingMode", _MODE[mig.pending or mig.current])))
    return codes.SUCCESS


def _max_count(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    mig = target.spec.mig
    count = mig.max_devices if mig is not None and mig.current == "enabled" else 0
    put_u32(out, int(pick(call.overrides, "value", count)))
    return codes.SUCCESS


def _by_index(drv: SimDriver, call: Call, target: DeviceState, h: int, index: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    mig = target.spec.mig
    if mig is None or not target.mig_enabled:
        return codes.NOT_SUPPORTED
    if index >= mig.max_devices:
        return codes.INVALID_ARGUMENT
    inst = target.mig.get(index)
    if inst is None:
        return codes.NOT_FOUND
    put_pointer(out, inst.handle)
    return codes.SUCCESS


def _is_mig(drv: SimDriver, call: Call, target: DeviceState | MigState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    put_u32(out, int(pick(call.overrides, "value", int(isinstance(target, MigState)))))
    return codes.SUCCESS


def _instance_id(attribute: str) -> Handler:
    def handler(
        drv: SimDriver, call: Call, target: DeviceState | MigState, h: int, out: int
    ) -> int:
        if not out:
            return codes.INVALID_ARGUMENT
        if not isinstance(target, MigState):
            return codes.NOT_SUPPORTED
        put_u32(out, int(pick(call.overrides, "value", getattr(target.spec, attribute))))
        return codes.SUCCESS

    return handler


def _parent(drv: SimDriver, call: Call, target: DeviceState | MigState, h: int, out: int) -> int:
    if not out or not isinstance(target, MigState):
        return codes.INVALID_ARGUMENT
    put_pointer(out, target.parent.handle)
    return codes.SUCCESS


SYMBOLS = [
    Symbol("nvmlDeviceGetMigMode", (P, P, P), _mode),
    Symbol("nvmlDeviceGetMaxMigDeviceCount", (P, P), _max_count),
    Symbol("nvmlDeviceGetMigDeviceHandleByIndex", (P, U32, P), _by_index, arg=1),
    Symbol("nvmlDeviceIsMigDeviceHandle", (P, P), _is_mig, target="any"),
    Symbol(
        "nvmlDeviceGetGpuInstanceId",
        (P, P),
        _instance_id("gpu_instance_id"),
        target="any",
    ),
    Symbol(
        "nvmlDeviceGetComputeInstanceId", (P, P), _instance_id("compute_instance_id"), target="any"
    ),
    Symbol("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", (P, P), _parent, target="any"),
]
