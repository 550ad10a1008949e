"""What the listener hands on: one :class:`GpuEvent` per event (NVML's, or one the sidecar derives).

The listener (``gpumetrics.nvml.events``) fills it from ``nvmlEventData_t`` and the device's
identity; :class:`~gpumetrics.events.producer.EventProducer` counts it, applies the storm limit
and renders it as an OTLP LogRecord (:mod:`gpumetrics.events.render`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpumetrics.metrics.buffer import Attributes

__all__ = ["EventSink", "EventTotal", "GpuEvent", "INSTANCE_ID_ANY"]

INSTANCE_ID_ANY = 0xFFFFFFFF
"""``NVML_GPU_INSTANCE_ID_ANY`` / ``NVML_COMPUTE_INSTANCE_ID_ANY``: no instance named."""


@dataclass(frozen=True)
class GpuEvent:
    """One event of one GPU (or MIG instance).

    Attributes:
        type: the catalogue's event type (``xid``, ``double_bit_ecc``, ``gpu_lost``...).
        data: NVML's ``eventData`` (the Xid for ``xid``), verbatim; 0 for derived events.
        device_id: ``hw.id`` of the device the event is attributed to: the MIG instance's UUID
            when NVML's instance ids name a known instance, else the GPU's UUID.
        attributes: that device's identity attributes (``hw.id``, ``hw.name``, ``hw.model``...,
            MIG ids), as its metric points carry them.
        observed_ns: when the listener received it, Unix-epoch ns (the wall clock).
        time_ns: when it happened according to NVML, Unix-epoch ns; 0 when NVML gave no time
            (``nvmlEventSetWait_v2`` gives none).
        gpu_instance_id: NVML's ``gpuInstanceId`` when it names an instance, else None.
        compute_instance_id: NVML's ``computeInstanceId`` likewise.
        nvml_type: the NVML event type bit as delivered (0 for derived events).
        reason: for ``gpu_lost``, the NVML return code name (``GPU_IS_LOST``); for
            ``gpu_recovery_action``, what reading the action answered when it failed.
        recovery_action: for ``gpu_recovery_action``, the ``nvmlDeviceGpuRecoveryAction_t``
            value read with ``nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)``
            when the event arrived (the event's own ``eventData`` is 0, nvml.h); None when
            that read failed (the action is unknown).

    """

    type: str
    data: int
    device_id: str
    attributes: Attributes
    observed_ns: int
    time_ns: int = 0
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    nvml_type: int = 0
    reason: str = ""
    recovery_action: int | None = None

    @property
    def label(self) -> str:
        """How a person names the device: ``hw.name`` (``gpu0``) or, without one, ``hw.id``."""
        name = dict(self.attributes).get("hw.name")
        return str(name) if name else self.device_id


@dataclass(frozen=True)
class EventTotal:
    """One series of the ``nvidia.gpu.events`` counter of a device.

    Attributes:
        attributes: the series' own attributes (``nvidia.gpu.event.type``, and
            ``nvidia.gpu.xid.code`` for xid events).
        value: events counted since ``start_ns``.
        start_ns: when counting started for the device (its first registration), Unix-epoch ns.

    """

    attributes: Attributes
    value: int
    start_ns: int


class EventSink(Protocol):
    """Where the listener puts events (implemented by ``EventProducer``)."""

    def record(self, event: GpuEvent) -> None:
        """Count ``event`` and queue its log record (unless the storm limit holds it back)."""

    def listening(self, device_id: str, now_ns: int) -> None:
        """Say that events of ``device_id`` are counted from ``now_ns`` (its first registration)."""

    def totals(self, device_id: str) -> list[EventTotal]:
        """Return the counter series of ``device_id`` (none before :meth:`listening`)."""
