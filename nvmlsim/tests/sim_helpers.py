"""Scenario builders shared by the simulated-driver tests."""

from __future__ import annotations

import copy
from typing import Any

import pynvml

UUID0 = "GPU-00000000-0000-4000-8000-000000000000"
UUID1 = "GPU-00000000-0000-4000-8000-000000000001"
MIG_UUID = "MIG-00000000-0000-5000-8000-000000000010"

#: A device with a known constant value for every reading.
FULL_DEVICE: dict[str, Any] = {
    "uuid": UUID0,
    "name": "NVIDIA H100 80GB HBM3",
    "serial": "1654123001234",
    "board_part_number": "692-2G520-0200-000",
    "vbios_version": "96.00.99.00.01",
    "pci": {"bus_id": "00000000:18:00.0", "device_id": 0x233010DE, "subsystem_id": 0x16C110DE},
    "minor_number": 4,
    "memory": {"total_bytes": 85520809984, "used_bytes": 1000, "reserved_bytes": 24},
    "power": {"usage_mw": 123456, "management_limit_mw": 700000, "enforced_limit_mw": 650000},
    "energy_mj": 987654321,
    "temperature_c": 47,
    "fan_percent": 33,
    "pstate": 2,
    "clocks_mhz": {"graphics": 1111, "sm": 1222, "mem": 2619, "video": 1555},
    "clocks_event_reasons": 0x44,
    "pcie_kbps": {"tx_kbps": 1200, "rx_kbps": 34000},
    "utilization": {"gpu": 57, "memory": 21},
    "encoder": {"percent": 7, "sampling_period_us": 167000},
    "decoder": {"percent": 9, "sampling_period_us": 200000},
    "ecc": {
        "volatile_corrected": 1,
        "volatile_uncorrected": 2,
        "aggregate_corrected": 3,
        "aggregate_uncorrected": 4,
    },
    "samples": {"gpu_utilization": {}, "total_power": {}},
    "process_utilization": {},
    "mig": {"current": "disabled"},
    "conf_compute": {"protected_kib": 1, "unprotected_kib": 2},
    "field_values": {"POWER_INSTANT": {"value": 120000, "value_type": "UNSIGNED_INT"}},
    "processes": [
        {"pid": 101, "name": "python", "used_memory_bytes": 1000, "utilization": {"sm": 40}},
        {"pid": 102, "name": "Xorg", "types": ["graphics"], "used_memory_bytes": "n/a"},
        {"pid": 103, "name": "mps-server", "types": ["mps"], "used_memory_bytes": 3000},
    ],
}

#: A MIG-enabled A100 with one instance in slot 0 (slots 1..6 empty).
MIG_DEVICE: dict[str, Any] = {
    "uuid": UUID1,
    "name": "NVIDIA A100-SXM4-40GB",
    "memory": {"total_bytes": 42949672960, "used_bytes": 1073741824},
    "power": {"usage_mw": 100000},
    "utilization": {"gpu": 50, "memory": 10},
    "samples": {"gpu_utilization": {}},
    "process_utilization": {},
    "mig": {
        "current": "enabled",
        "max_devices": 7,
        "instances": [
            {
                "slot": 0,
                "gpu_instance_id": 1,
                "compute_instance_id": 0,
                "uuid": MIG_UUID,
                "name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                "memory": {"total_bytes": 20937965568, "used_bytes": 1073741824},
                "processes": [{"pid": 201, "name": "python", "used_memory_bytes": 1048576}],
            }
        ],
    },
}


def full_scenario(**top: Any) -> dict[str, Any]:
    """Both devices above on driver profile 570, plus ``top``-level scenario keys."""
    data: dict[str, Any] = {
        "driver": {"profile": "570"},
        "devices": [copy.deepcopy(FULL_DEVICE), copy.deepcopy(MIG_DEVICE)],
    }
    data.update(top)
    return data


def one_gpu(driver: dict[str, Any] | None = None, **device: Any) -> dict[str, Any]:
    """A one-GPU scenario: ``device`` fields on top of a bare UUID."""
    return {"driver": driver or {}, "devices": [{"uuid": UUID0, **device}]}


def handle_value(handle: Any) -> int:
    """The address a pynvml device handle holds."""
    import ctypes

    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def h0() -> Any:
    """Handle of GPU 0 through the real binding."""
    return pynvml.nvmlDeviceGetHandleByIndex(0)
