"""Device identity: :class:`GPU` and the attributes it puts on data points.

Device metrics carry ``hw.id`` (the NVML UUID), ``hw.name``, ``hw.vendor``, ``hw.model``,
``hw.serial_number``, ``hw.driver_version`` and ``hw.firmware_version`` where known
(``metric_attributes.hw.gpu``, semantic conventions v1.44.0 ``model/hardware/gpu-metrics.yaml``);
per-process metrics carry only the identity attributes (``hw.id``, and ``hw.parent`` for a MIG
instance). A MIG instance is its own component: its ``hw.id`` is the MIG UUID and ``hw.parent``
the physical GPU's UUID.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gpumetrics.metrics import names


@dataclass(frozen=True)
class GPU:
    """Static identity of one GPU or MIG instance, read once per device lifetime.

    Attributes:
        uuid: NVML UUID (``GPU-…`` or ``MIG-…``); the key of everything, since indexes are not
            stable across reboots (NVML API reference, ``nvmlDeviceGetHandleByIndex``).
        index: NVML index at discovery, or None for a MIG instance.
        name: human-friendly name written to ``hw.name`` (``gpu0``; ``gpu0/mig3`` for a MIG
            instance), or None.
        model: product name from ``nvmlDeviceGetName`` (``NVIDIA H100 80GB HBM3``), or None when
            unreadable (e.g. non-UTF-8 bytes, field case F26).
        vendor: ``NVIDIA``.
        serial_number: ``nvmlDeviceGetSerial``, or None when unsupported.
        driver_version: ``nvmlSystemGetDriverVersion``, or None.
        firmware_version: VBIOS version from ``nvmlDeviceGetVbiosVersion``, or None.
        parent_uuid: the physical GPU's UUID for a MIG instance, else None.
        gpu_instance_id: MIG GPU-instance id, or None.
        compute_instance_id: MIG compute-instance id, or None.
        minor_number: the ``/dev/nvidia<minor>`` device node of a physical GPU
            (``nvmlDeviceGetMinorNumber``), or None when unread; not emitted, it matches the
            ``nvidia<minor>`` device ids of GKE's device plugin (``gpumetrics.kubernetes``).

    """

    uuid: str
    index: int | None = None
    name: str | None = None
    model: str | None = None
    vendor: str = "NVIDIA"
    serial_number: str | None = None
    driver_version: str | None = None
    firmware_version: str | None = None
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    minor_number: int | None = None

    def put_id_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Add ``hw.id`` (and ``hw.parent`` for a MIG instance) to ``attrs``; return ``attrs``."""
        attrs[names.AttrHwID] = self.uuid
        if self.parent_uuid is not None:
            attrs[names.AttrHwParent] = self.parent_uuid
        return attrs

    def put_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Add every known device attribute (identity, ``hw.name``, …) to ``attrs``; return it.

        Unknown (None) fields are left out: a missing value is never written as an empty string.
        """
        self.put_id_attrs(attrs)
        for key, value in (
            (names.AttrHwName, self.name),
            (names.AttrHwVendor, self.vendor),
            (names.AttrHwModel, self.model),
            (names.AttrHwSerialNumber, self.serial_number),
            (names.AttrHwDriverVersion, self.driver_version),
            (names.AttrHwFirmwareVersion, self.firmware_version),
        ):
            if value is not None:
                attrs[key] = value
        return attrs

    def id_attributes(self) -> tuple[tuple[str, Any], ...]:
        """Return the identity attributes as a hashable tuple, for per-process points."""
        return tuple(self.put_id_attrs({}).items())

    def attributes(self) -> tuple[tuple[str, Any], ...]:
        """Return every known device attribute as a hashable tuple, for device points."""
        return tuple(self.put_attrs({}).items())


def CountNVIDIAGPUs(proc_root: str = "/proc") -> int:  # noqa: N802 - the seed's name
    """Count the GPUs the NVIDIA kernel driver has bound, without NVML.

    Counts the entries of ``<proc_root>/driver/nvidia/gpus/`` (one directory per PCI bus id,
    created by the kernel module). Returns 0 when the directory does not exist (no driver loaded).

    Raises:
        OSError: when the directory exists but cannot be listed (e.g. EACCES).

    """
    path = os.path.join(proc_root, "driver", "nvidia", "gpus")
    try:
        return len(os.listdir(path))
    except FileNotFoundError:
        return 0
