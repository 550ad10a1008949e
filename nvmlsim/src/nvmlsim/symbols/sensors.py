"""Temperature, P-state, clocks, clock-event reasons, PCIe throughput and ECC counters.

Units as NVML: °C, percent, MHz, KB/s, counts (NVML API reference). An enum argument
outside the documented range answers INVALID_ARGUMENT (``NVML_PCIE_UTIL_COUNT`` = 2 is not a
counter, F25); a reading missing from the scenario answers NOT_SUPPORTED. ``nvmlDevice
GetPcieThroughput`` takes ``driver.pcie_window_ms`` (20 ms) inside the dispatcher (F21).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nvmlsim import codes
from nvmlsim.faults import pick
from nvmlsim.memio import get_u32, put_i32, put_u32, put_u64
from nvmlsim.model.values import Dyn, evaluate
from nvmlsim.symbols.base import U32, Call, Handler, P, Symbol, reading
from nvmlsim.world import DeviceState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS", "TEMPERATURE_V1", "TEMPERATURE_V1_VERSION"]

# nvmlTemperature_v1_t: unsigned version; nvmlTemperatureSensors_t sensorType; int temperature.
TEMPERATURE_V1 = struct.Struct("<IIi")
TEMPERATURE_V1_VERSION = TEMPERATURE_V1.size | (1 << 24)  # 0x0100000C
_CLOCKS = ("graphics", "sm", "mem", "video")  # NVML_CLOCK_GRAPHICS=0, SM=1, MEM=2, VIDEO=3
_PCIE = ("tx_kbps", "rx_kbps")  # NVML_PCIE_UTIL_TX_BYTES=0, RX_BYTES=1
_ECC = {  # (nvmlMemoryErrorType_t, nvmlEccCounterType_t) -> scenario field
    (0, 0): "volatile_corrected",
    (1, 0): "volatile_uncorrected",
    (0, 1): "aggregate_corrected",
    (1, 1): "aggregate_uncorrected",
}


def _indexed(
    lookup: Callable[[DeviceState, int], tuple[int, Dyn | None]],
    put: Callable[[int, int], None],
) -> Handler:
    """Build a handler for ``f(handle, enum, T *out)``: ``lookup`` gives (code, value)."""

    def handler(
        drv: SimDriver, call: Call, target: DeviceState, h: int, which: int, out: int
    ) -> int:
        if not out:
            return codes.INVALID_ARGUMENT
        code, value = lookup(target, which)
        if code != codes.SUCCESS:
            return code
        if value is None:
            return codes.NOT_SUPPORTED
        number = round(evaluate(value, call.t, call.cycle))
        put(out, int(pick(call.overrides, "value", number)))
        return codes.SUCCESS

    return handler


def _temperature(dev: DeviceState, sensor: int) -> tuple[int, Dyn | None]:
    if sensor != 0:  # NVML_TEMPERATURE_GPU is the only sensor
        return codes.INVALID_ARGUMENT, None
    return codes.SUCCESS, dev.spec.temperature_c


def _clock(dev: DeviceState, clock_type: int) -> tuple[int, Dyn | None]:
    if not 0 <= clock_type < len(_CLOCKS):
        return codes.INVALID_ARGUMENT, None
    return codes.SUCCESS, getattr(dev.spec.clocks_mhz, _CLOCKS[clock_type])


def _pcie(dev: DeviceState, counter: int) -> tuple[int, Dyn | None]:
    if not 0 <= counter < len(_PCIE):
        return codes.INVALID_ARGUMENT, None
    return codes.SUCCESS, getattr(dev.spec.pcie_kbps, _PCIE[counter])


def _temperature_v(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    if get_u32(out) != TEMPERATURE_V1_VERSION:
        return drv.bad_struct_version_code
    code, value = _temperature(target, get_u32(out + 4))
    if code != codes.SUCCESS:
        return code
    if value is None:
        return codes.NOT_SUPPORTED
    number = round(evaluate(value, call.t, call.cycle))
    put_i32(out + 8, int(pick(call.overrides, "temperature", number)))
    return codes.SUCCESS


def _ecc(
    drv: SimDriver, call: Call, target: DeviceState, h: int, error: int, counter: int, out: int
) -> int:
    if not out or (error, counter) not in _ECC:
        return codes.INVALID_ARGUMENT
    ecc = target.spec.ecc
    if ecc is None:
        return codes.NOT_SUPPORTED
    number = round(evaluate(getattr(ecc, _ECC[(error, counter)]), call.t, call.cycle))
    put_u64(out, int(pick(call.overrides, "value", number)))
    return codes.SUCCESS


def _spec(name: str) -> Callable[[DeviceState, Any], Any]:
    return lambda dev, call: getattr(dev.spec, name)


SYMBOLS = [
    Symbol("nvmlDeviceGetTemperature", (P, U32, P), _indexed(_temperature, put_u32), arg=1),
    Symbol("nvmlDeviceGetTemperatureV", (P, P), _temperature_v),
    Symbol("nvmlDeviceGetPerformanceState", (P, P), reading(_spec("pstate"), put_u32)),
    Symbol("nvmlDeviceGetClockInfo", (P, U32, P), _indexed(_clock, put_u32), arg=1),
    Symbol(
        "nvmlDeviceGetCurrentClocksEventReasons",
        (P, P),
        reading(_spec("clocks_event_reasons"), put_u64),
    ),
    Symbol(
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        (P, P),
        reading(_spec("clocks_event_reasons"), put_u64),
    ),
    Symbol("nvmlDeviceGetPcieThroughput", (P, U32, P), _indexed(_pcie, put_u32), arg=1),
    Symbol("nvmlDeviceGetTotalEccErrors", (P, U32, U32, P), _ecc, arg=1),
]
