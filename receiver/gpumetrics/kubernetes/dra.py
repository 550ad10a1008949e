"""GPUs allocated through Dynamic Resource Allocation (DRA): claim devices → GPU UUIDs; pure.

Since Kubernetes 1.34 (DRA GA) a pod can get its GPUs through a ResourceClaim instead of a
device plugin's extended resource. The kubelet's pod-resources ``List`` then names them in each
container's ``dynamic_resources``: per claim, the devices as ``driver_name`` / ``pool_name`` /
``device_name`` triples (``gpu.nvidia.com`` / ``<node>`` / ``gpu-0``), which say nothing about
*which* GPU ``gpu-0`` is. The DRA driver says so in the ResourceSlices it publishes
(``resource.k8s.io``): each device of a slice carries attributes, and NVIDIA's DRA driver
(``gpu.nvidia.com``, NVIDIA/k8s-dra-driver-gpu ``cmd/gpu-kubelet-plugin/deviceinfo.go``) gives
every GPU and MIG device a ``uuid`` string attribute: the NVML UUID (``GPU-…``, ``MIG-…``).

:func:`claim_devices` reads the triples of a container; :func:`index_resource_slices` turns a
``ResourceSliceList`` (the API server's JSON, read by :mod:`.apiserver`) into a
:data:`SliceIndex` (triple → UUID). Without an index (``kubernetes.dra.resource_slices`` off,
the default, or the read failing) claim devices stay *unattributed*: counted and logged, never
guessed from the device name.

Slice shapes (Kubernetes API reference, ``ResourceSlice``): ``resource.k8s.io/v1`` and
``v1beta2`` list ``spec.devices[].attributes``; ``v1beta1`` nests them in
``spec.devices[].basic.attributes``. An attribute name without a domain belongs to the driver's
domain, so ``uuid`` and ``gpu.nvidia.com/uuid`` are the same attribute. Its value is a one-key
object (``{"string": "GPU-…"}``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ClaimDevice", "SliceIndex", "claim_devices", "index_resource_slices"]

UUID_ATTRIBUTE = "uuid"
"""The attribute NVIDIA's DRA driver gives each GPU and MIG device (its NVML UUID)."""

_MAX_NAME = 253  # a DNS subdomain: driver and pool names; device names are DNS labels (63)


@dataclass(frozen=True, order=True)
class ClaimDevice:
    """One device of a DRA claim: the triple that names it uniquely in the cluster."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True, order=True)
class Claim:
    """A ResourceClaim a container uses (``claim_namespace``/``claim_name``)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


SliceIndex = Mapping[ClaimDevice, str]
"""The NVML UUID of every device a ResourceSlice of a GPU driver names with a ``uuid``."""


def _valid(*names: str) -> bool:
    return all(0 < len(n) <= _MAX_NAME for n in names)


def claim_devices(container: Any, drivers: Iterable[str]) -> Iterator[tuple[Claim, ClaimDevice]]:
    """Yield ``(claim, device)`` for each claim device of ``drivers`` a container holds.

    Args:
        container: a pod-resources ``ContainerResources`` (its ``dynamic_resources``).
        drivers: the DRA drivers whose devices are GPUs (``kubernetes.dra.drivers``).

    Claim resources of other drivers (a NIC, ``compute-domain.nvidia.com`` channels) and
    entries without a device name (DRA kinds other than devices) are skipped.

    """
    wanted = frozenset(drivers)
    for dynamic in container.dynamic_resources:
        claim = Claim(dynamic.claim_namespace, dynamic.claim_name)
        for resource in dynamic.claim_resources:
            if resource.driver_name not in wanted:
                continue
            if _valid(resource.driver_name, resource.pool_name, resource.device_name):
                yield (
                    claim,
                    ClaimDevice(resource.driver_name, resource.pool_name, resource.device_name),
                )


def _attribute(attributes: Mapping[str, Any], driver: str, name: str) -> str | None:
    value = attributes.get(name)
    if value is None:
        value = attributes.get(f"{driver}/{name}")
    if not isinstance(value, Mapping):
        return None
    text = value.get("string")
    return text if isinstance(text, str) and text else None


def index_resource_slices(payload: Any, drivers: Iterable[str]) -> dict[ClaimDevice, str]:
    """Index the ``uuid`` attribute of every device in a ``ResourceSliceList``.

    Args:
        payload: the decoded JSON of a ``ResourceSliceList`` (``items``: ResourceSlices), of
            ``resource.k8s.io`` v1, v1beta2 or v1beta1.
        drivers: the DRA drivers whose devices are GPUs; slices of other drivers are skipped.

    Returns:
        ``ClaimDevice(spec.driver, spec.pool.name, device.name)`` → UUID.

    Raises:
        ValueError: ``payload`` is not a ``ResourceSliceList`` (no ``items`` list).

    """
    if not isinstance(payload, Mapping) or not isinstance(payload.get("items"), list):
        raise ValueError("not a ResourceSliceList: no 'items' list")
    wanted = frozenset(drivers)
    index: dict[ClaimDevice, str] = {}
    for item in payload["items"]:
        spec = item.get("spec") if isinstance(item, Mapping) else None
        if not isinstance(spec, Mapping) or spec.get("driver") not in wanted:
            continue
        driver = str(spec["driver"])
        pool = spec.get("pool")
        pool_name = pool.get("name") if isinstance(pool, Mapping) else None
        if not isinstance(pool_name, str):
            continue
        for device in spec.get("devices") or ():
            if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
                continue
            attributes = device.get("attributes")
            if attributes is None and isinstance(device.get("basic"), Mapping):
                attributes = device["basic"].get("attributes")  # v1beta1
            uuid = _attribute(attributes or {}, driver, UUID_ATTRIBUTE)
            if uuid is not None:
                index[ClaimDevice(driver, pool_name, device["name"])] = uuid
    return index
