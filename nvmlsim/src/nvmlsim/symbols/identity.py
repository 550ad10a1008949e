"""Device identity: UUID, name, serial, part number, VBIOS, PCI info, minor number, index.

Strings are copied raw (a non-UTF-8 ``name_bytes`` reaches nvidia-ml-py's strict decode,
F26); a buffer too small for the string answers INSUFFICIENT_SIZE as the C library does.
MIG handles answer their own UUID and name; the board-level calls answer NOT_SUPPORTED.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from nvmlsim import codes
from nvmlsim.faults import pick
from nvmlsim.memio import put_string, put_u32, view
from nvmlsim.symbols.base import U32, Call, Handler, P, Symbol
from nvmlsim.world import DeviceState, MigState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS", "PCI_INFO", "pci_fields"]

# nvmlPciInfo_t (nvml.h): char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId,
# pciSubSystemId; char busId[32] -- 68 bytes.
PCI_INFO = struct.Struct("<16sIIIII32s")


def _uuid(
    drv: SimDriver, call: Call, target: DeviceState | MigState, h: int, buf: int, length: int
) -> int:
    return put_string(buf, length, target.uuid.encode())


def _name(
    drv: SimDriver, call: Call, target: DeviceState | MigState, h: int, buf: int, length: int
) -> int:
    if isinstance(target, MigState):
        return put_string(buf, length, target.spec.name.encode())
    return put_string(buf, length, target.name_bytes)


def _text(attribute: str) -> Handler:
    def handler(
        drv: SimDriver, call: Call, target: DeviceState, h: int, buf: int, length: int
    ) -> int:
        value = getattr(target.spec, attribute)
        if value is None:
            return codes.NOT_SUPPORTED
        return put_string(buf, length, value.encode())

    return handler


def pci_fields(dev: DeviceState) -> tuple[str, int, int]:
    """(bus id ``DDDDDDDD:BB:DD.F``, PCI device id, subsystem id) of ``dev``."""
    pci = dev.spec.pci
    if pci is not None:
        return pci.bus_id.upper(), pci.device_id, pci.subsystem_id
    bus = (0x18 + 0x10 * dev.index) % 0x100
    return f"00000000:{bus:02X}:00.0", 0x233010DE, 0


def _pci(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    bus_id, device_id, subsystem = pci_fields(target)
    domain = int(bus_id[0:8], 16)
    bus = int(bus_id[9:11], 16)
    device = int(bus_id[12:14], 16)
    legacy = f"{domain:04X}:{bus:02X}:{device:02X}.{bus_id[15]}"
    ov = call.overrides
    PCI_INFO.pack_into(
        view(out, PCI_INFO.size),
        0,
        legacy.encode(),
        int(pick(ov, "domain", domain)),
        int(pick(ov, "bus", bus)),
        int(pick(ov, "device", device)),
        int(pick(ov, "pciDeviceId", device_id)),
        int(pick(ov, "pciSubSystemId", subsystem)),
        bus_id.encode(),
    )
    return codes.SUCCESS


def _minor(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    minor = target.spec.minor_number
    put_u32(out, int(pick(call.overrides, "value", target.index if minor is None else minor)))
    return codes.SUCCESS


def _index(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    put_u32(out, int(pick(call.overrides, "value", target.index)))
    return codes.SUCCESS


SYMBOLS = [
    Symbol("nvmlDeviceGetUUID", (P, P, U32), _uuid, target="any"),
    Symbol("nvmlDeviceGetName", (P, P, U32), _name, target="any"),
    Symbol("nvmlDeviceGetSerial", (P, P, U32), _text("serial")),
    Symbol("nvmlDeviceGetBoardPartNumber", (P, P, U32), _text("board_part_number")),
    Symbol("nvmlDeviceGetVbiosVersion", (P, P, U32), _text("vbios_version")),
    Symbol("nvmlDeviceGetPciInfo_v3", (P, P), _pci),
    Symbol("nvmlDeviceGetMinorNumber", (P, P), _minor),
    Symbol("nvmlDeviceGetIndex", (P, P), _index),
]
