"""Device attribution: attributes for device points that come from outside NVML.

NVML knows a GPU; it does not know which workload holds it. A :class:`DeviceAttribution` (in
this project the kubelet's pod allocations, :mod:`gpumetrics.kubernetes`) says so per device, as
a :class:`DeviceAnnotation`: attributes added to every device point of that GPU (after its
``hw.*`` attributes), plus the points of ``nvidia.gpu.k8s.allocation``, one per holder.

Like :class:`~gpumetrics.metrics.producer.ProcessResourcer` for process resources, the
producer holds the attribution (``Producer.set_device_attribution``); the collector applies it
when it builds each device's attributes, once per collection cycle. Per-process points and
resources are never annotated: a process's identity is its own (``docs/identity.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpumetrics.metrics.buffer import Attributes
from gpumetrics.metrics.gpu import GPU


@dataclass(frozen=True)
class DeviceAnnotation:
    """What a device's points get from a :class:`DeviceAttribution`.

    Attributes:
        attributes: added to every device point of the GPU (e.g. ``k8s.pod.name``); keys never
            collide with the GPU's own attributes.
        allocations: ``(attributes, value)`` of each ``nvidia.gpu.k8s.allocation`` point of
            the GPU: the holder's attributes (added to the GPU's identity attributes) and the
            number of device-plugin ids of this GPU it holds ({device}).

    """

    attributes: Attributes = ()
    allocations: tuple[tuple[Attributes, int], ...] = ()


NO_ANNOTATION = DeviceAnnotation()
"""The annotation of a device nobody holds."""


class DeviceAttribution(Protocol):
    """Gives device points attributes NVML cannot know (implemented by ``gpumetrics.kubernetes``).

    Called on the collector's scheduler thread once per cycle, so it must answer from memory
    (no I/O, no waiting on another thread).
    """

    def annotate(self, gpus: Sequence[GPU]) -> Mapping[str, DeviceAnnotation]:
        """Return the annotation of each GPU in ``gpus`` that has one, keyed by ``GPU.uuid``.

        ``gpus`` holds every physical GPU and every MIG instance the collector sees (a MIG
        instance has ``parent_uuid``). GPUs left out of the answer get :data:`NO_ANNOTATION`.
        """
