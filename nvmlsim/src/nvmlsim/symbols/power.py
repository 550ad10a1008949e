"""Power (mW), power limits (mW) and the energy counter (mJ).

``nvmlDeviceGetPowerManagementLimitConstraints(device, unsigned *min, unsigned *max)`` answers
NOT_SUPPORTED unless the scenario gives both bounds.

The energy counter is the scenario's ``energy_mj`` minus what it was at the last reset
(``restore_gpu``/``reset_energy`` events, ``request_reset``), so it restarts from 0 like a
driver reload (F23). A reading left out of the scenario answers NOT_SUPPORTED.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nvmlsim import codes
from nvmlsim.faults import pick
from nvmlsim.memio import put_u32, put_u64
from nvmlsim.model.values import Dyn, evaluate
from nvmlsim.symbols.base import Call, P, Symbol, reading
from nvmlsim.world import DeviceState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS"]


def _energy(dev: DeviceState, call: Call) -> Dyn | None:
    if dev.spec.energy_mj is None:
        return None
    value = evaluate(dev.spec.energy_mj, call.t, call.cycle) - dev.energy_offset_mj
    return max(0.0, value)


def _attr(name: str) -> Any:
    return lambda dev, call: getattr(dev.spec.power, name)


def _constraints(
    drv: SimDriver, call: Call, target: DeviceState, h: int, low: int, high: int
) -> int:
    if not low or not high:
        return codes.INVALID_ARGUMENT
    power = target.spec.power
    if power.min_limit_mw is None or power.max_limit_mw is None:
        return codes.NOT_SUPPORTED
    put_u32(low, int(pick(call.overrides, "minLimit", power.min_limit_mw)))
    put_u32(high, int(pick(call.overrides, "maxLimit", power.max_limit_mw)))
    return codes.SUCCESS


SYMBOLS = [
    Symbol("nvmlDeviceGetPowerUsage", (P, P), reading(_attr("usage_mw"), put_u32)),
    Symbol(
        "nvmlDeviceGetPowerManagementLimit", (P, P), reading(_attr("management_limit_mw"), put_u32)
    ),
    Symbol("nvmlDeviceGetEnforcedPowerLimit", (P, P), reading(_attr("enforced_limit_mw"), put_u32)),
    Symbol(
        "nvmlDeviceGetPowerManagementDefaultLimit",
        (P, P),
        reading(_attr("default_limit_mw"), put_u32),
    ),
    Symbol("nvmlDeviceGetPowerManagementLimitConstraints", (P, P, P), _constraints),
    Symbol("nvmlDeviceGetTotalEnergyConsumption", (P, P), reading(_energy, put_u64)),
]
