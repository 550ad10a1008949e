"""Who holds each GPU, from the kubelet's pod-resources answer: pure functions, no I/O.

:func:`build_allocations` turns a ``List`` answer (and optionally a ``GetAllocatableResources``
answer) into an immutable :class:`Allocations`; :meth:`Allocations.annotate` matches it to the
GPUs NVML sees and applies the attribute rule.

**Device ids.** Only devices of resources named with one of
``kubernetes.resource_name_prefixes`` (``nvidia.com/``) count. Their ids come in two formats
(:class:`~gpumetrics.kubernetes.settings.GPUIdType`):

* the NVIDIA device plugin: the NVML UUID, ``GPU-…`` or ``MIG-…``; time-sliced and MPS shares
  append ``::<replica>`` (``GPU-…::3``), which is removed to find the GPU. Older device plugins
  and drivers (R450/R460, where MIG devices had no UUID of their own) name a MIG device
  ``MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>``: that is its parent GPU and the
  (GPU instance, compute instance) pair, matched to the MIG device NVML reports there;
* GKE's device plugin: ``nvidia<minor>`` (the GPU whose ``nvmlDeviceGetMinorNumber`` is
  ``<minor>``), ``nvidia<minor>/gi<id>`` (its MIG GPU instance ``<id>``), with ``/vgpu<n>``
  appended for shares.

Devices allocated through DRA claims (``dynamic_resources``, :mod:`.dra`) are GPUs when their
driver is one of ``kubernetes.dra.drivers``; a ResourceSlice index (triple → UUID) makes each
one a grant of the GPU with that UUID, under the driver's name as ``resource_name``. Without
one, or when no slice names the device, they are counted as unattributed, never guessed.

**Stale allocations.** A device plugin hands each of its device ids to one container at a time,
so an id the answer lists for two containers means the kubelet still reports the allocation of
a pod that has ended (``Succeeded``/``Failed``, kubernetes/kubernetes#119423) beside the one that
reuses the device. Both stay holders (the API cannot tell which one ended); the id is reported
in :attr:`Allocations.stale` so that it is logged.

**The attribute rule** (:func:`device_attributes`). Device points of a GPU carry the holder's
``k8s.namespace.name``, ``k8s.pod.name`` and ``k8s.container.name`` (semantic conventions
``registry.k8s``) when exactly one container holds it. When several containers hold it (time
slicing, MPS, several replicas), the points say so with ``nvidia.gpu.k8s.shared`` = true and
keep only the values every holder has in common (all in one namespace: ``k8s.namespace.name``;
all in one pod: also ``k8s.pod.name``); no holder is picked over another. Every holder is
listed, with the number of the GPU's device ids it holds, by the points of
``nvidia.gpu.k8s.allocation``. A MIG GPU's own points (board power, temperature, clocks) follow
the same rule over the holders of all its instances; its allocation points are its instances'.
The v1 API carries no pod UID, so ``k8s.pod.uid`` is never set.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpumetrics.kubernetes.dra import Claim, ClaimDevice, SliceIndex, claim_devices
from gpumetrics.kubernetes.settings import GPUIdType, KubernetesSettings
from gpumetrics.metrics import names
from gpumetrics.metrics.attribution import DeviceAnnotation
from gpumetrics.metrics.buffer import Attributes
from gpumetrics.metrics.gpu import GPU

DeviceKey = tuple[Any, ...]
"""``("uuid", "GPU-…")``, ``("minor", 0)``, ``("gi", minor, gpu_instance_id)`` or
``("mig", "GPU-…", gpu_instance_id, compute_instance_id)``."""

_LEGACY_MIG = re.compile(r"MIG-(GPU-[0-9A-Za-z][0-9A-Za-z-]{0,99})/([0-9]{1,2})/([0-9]{1,2})\Z")
_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]{0,99}\Z")
_REPLICA = re.compile(r"::[0-9]{1,9}\Z")
_DEVICE_NAME = re.compile(r"nvidia([0-9]{1,3})(?:/gi([0-9]{1,2}))?(?:/vgpu[0-9]{1,9})?\Z")

# Kubernetes name limits (DNS label: 63, DNS subdomain: 253); anything longer is not a name.
_MAX_NAMESPACE = 63
_MAX_POD = 253
_MAX_CONTAINER = 63
_MAX_RESOURCE = 317  # a qualified name: 253-character prefix, '/', 63-character name


def parse_device_id(device_id: str, id_type: GPUIdType) -> DeviceKey | None:
    """Return the key of the GPU a device-plugin id names, or None for another format.

    Examples:
        >>> parse_device_id("GPU-8a1b::2", GPUIdType.AUTO)
        ('uuid', 'GPU-8a1b')
        >>> parse_device_id("nvidia1/gi3/vgpu0", GPUIdType.AUTO)
        ('gi', 1, 3)
        >>> parse_device_id("MIG-GPU-8a1b/3/0", GPUIdType.AUTO)
        ('mig', 'GPU-8a1b', 3, 0)
        >>> parse_device_id("nvidia1", GPUIdType.UUID) is None
        True

    """
    if id_type is not GPUIdType.DEVICE_NAME:
        base = _REPLICA.sub("", device_id)
        legacy = _LEGACY_MIG.match(base)
        if legacy is not None:
            return ("mig", legacy.group(1), int(legacy.group(2)), int(legacy.group(3)))
        if _UUID.match(base):
            return ("uuid", base)
    if id_type is not GPUIdType.UUID:
        m = _DEVICE_NAME.match(device_id)
        if m is not None:
            minor = int(m.group(1))
            return ("minor", minor) if m.group(2) is None else ("gi", minor, int(m.group(2)))
    return None


def device_id(key: DeviceKey) -> str:
    """Spell ``key`` as a device plugin would (``GPU-…``, ``nvidia3``, ``nvidia3/gi1``)."""
    if key[0] == "uuid":
        return str(key[1])
    if key[0] == "minor":
        return f"nvidia{key[1]}"
    if key[0] == "mig":
        return f"MIG-{key[1]}/{key[2]}/{key[3]}"
    return f"nvidia{key[1]}/gi{key[2]}"


@dataclass(frozen=True, order=True)
class Holder:
    """One container of one pod (the v1 API names pods by namespace and name only)."""

    namespace: str
    pod: str
    container: str

    def attributes(self) -> Attributes:
        """``k8s.namespace.name``, ``k8s.pod.name``, ``k8s.container.name``."""
        return (
            (names.AttrK8sNamespaceName, self.namespace),
            (names.AttrK8sPodName, self.pod),
            (names.AttrK8sContainerName, self.container),
        )


@dataclass(frozen=True, order=True)
class Grant:
    """A container's hold on one GPU: under which resource, and how many of its device ids."""

    holder: Holder
    resource_name: str
    ids: int = 1


def device_attributes(grants: Iterable[Grant]) -> Attributes:
    """Apply the attribute rule (module docstring) to the grants of one GPU.

    Examples:
        >>> one = Grant(Holder("ml", "train-0", "main"), "nvidia.com/gpu")
        >>> [k for k, _ in device_attributes([one])]
        ['k8s.namespace.name', 'k8s.pod.name', 'k8s.container.name']
        >>> two = Grant(Holder("ml", "infer-1", "main"), "nvidia.com/gpu")
        >>> device_attributes([one, two])
        (('k8s.namespace.name', 'ml'), ('nvidia.gpu.k8s.shared', True))

    """
    holders = {g.holder for g in grants}
    if not holders:
        return ()
    namespaces = {h.namespace for h in holders}
    pods = {(h.namespace, h.pod) for h in holders}
    out: list[tuple[str, Any]] = []
    if len(namespaces) == 1:
        out.append((names.AttrK8sNamespaceName, next(iter(namespaces))))
    if len(pods) == 1:
        out.append((names.AttrK8sPodName, next(iter(pods))[1]))
    if len(holders) == 1:
        out.append((names.AttrK8sContainerName, next(iter(holders)).container))
    else:
        out.append((names.AttrK8sShared, True))
    return tuple(out)


def allocation_attributes(grants: Iterable[Grant]) -> tuple[tuple[Attributes, int], ...]:
    """``(attributes, value)`` of each ``nvidia.gpu.k8s.allocation`` point, in a stable order."""
    return tuple(
        (g.holder.attributes() + ((names.AttrK8sResourceName, g.resource_name),), g.ids)
        for g in sorted(grants)
    )


def _merge(grants: Iterable[Grant]) -> tuple[Grant, ...]:
    """Sum the ids of grants of one holder under one resource name."""
    counts: dict[tuple[Holder, str], int] = {}
    for g in grants:
        counts[(g.holder, g.resource_name)] = counts.get((g.holder, g.resource_name), 0) + g.ids
    return tuple(Grant(h, r, n) for (h, r), n in sorted(counts.items()))


def _keys(gpu: GPU, by_uuid: Mapping[str, GPU]) -> list[DeviceKey]:
    keys: list[DeviceKey] = [("uuid", gpu.uuid)]
    if gpu.parent_uuid is None:
        if gpu.minor_number is not None:
            keys.append(("minor", gpu.minor_number))
    else:
        parent = by_uuid.get(gpu.parent_uuid)
        gi, ci = gpu.gpu_instance_id, gpu.compute_instance_id
        if parent is not None and parent.minor_number is not None and gi is not None:
            keys.append(("gi", parent.minor_number, gi))
        if gi is not None and ci is not None:
            keys.append(("mig", gpu.parent_uuid, gi, ci))
    return keys


@dataclass(frozen=True)
class Match:
    """What :meth:`Allocations.annotate` found.

    Attributes:
        annotations: by GPU UUID, for every GPU somebody holds (directly or, for a MIG GPU,
            through its instances).
        unmatched: held device keys no GPU in the list answers to.
        unmatched_allocatable: allocatable device keys no GPU answers to (None: unknown).

    """

    annotations: Mapping[str, DeviceAnnotation]
    unmatched: frozenset[DeviceKey]
    unmatched_allocatable: frozenset[DeviceKey] | None


@dataclass(frozen=True)
class Allocations:
    """An immutable reading of the kubelet's GPU allocations.

    Attributes:
        grants: by device key, every container's grant on that device.
        allocatable: device keys the kubelet can allocate, or None when unknown.
        unrecognised: GPU-resource device ids of an unknown format, or of a holder whose names
            are not Kubernetes names.
        over_limit: device ids (and DRA claim devices) left out past
            ``kubernetes.max_device_ids``.
        stale: device-plugin ids the answer lists for more than one container, with those
            containers, sorted (see the module docstring).
        dra_unattributed: DRA claim devices of a GPU driver that no ResourceSlice maps to a
            GPU (slices not read, or none names the device with a ``uuid``).

    """

    grants: Mapping[DeviceKey, tuple[Grant, ...]] = field(default_factory=dict)
    allocatable: frozenset[DeviceKey] | None = None
    unrecognised: int = 0
    over_limit: int = 0
    stale: tuple[tuple[str, tuple[Holder, ...]], ...] = ()
    dra_unattributed: frozenset[tuple[Claim, ClaimDevice]] = frozenset()

    @property
    def held_ids(self) -> int:
        """Device ids held, summed over grants."""
        return sum(g.ids for gs in self.grants.values() for g in gs)

    def annotate(self, gpus: Sequence[GPU]) -> Match:
        """Match the grants to ``gpus`` (physical GPUs and MIG instances) and apply the rule."""
        by_uuid = {g.uuid: g for g in gpus}
        matched: set[DeviceKey] = set()
        direct: dict[str, tuple[Grant, ...]] = {}
        for gpu in gpus:
            found: list[Grant] = []
            for key in _keys(gpu, by_uuid):
                if key in self.grants:
                    matched.add(key)
                    found.extend(self.grants[key])
            if found:
                direct[gpu.uuid] = _merge(found)
        out: dict[str, DeviceAnnotation] = {}
        for gpu in gpus:
            own = direct.get(gpu.uuid, ())
            children = (c for c in gpus if c.parent_uuid == gpu.uuid)
            everyone = own + tuple(g for c in children for g in direct.get(c.uuid, ()))
            if everyone:
                out[gpu.uuid] = DeviceAnnotation(
                    device_attributes(everyone), allocation_attributes(own)
                )
        known = {k for gpu in gpus for k in _keys(gpu, by_uuid)}
        return Match(
            out,
            frozenset(self.grants) - matched,
            None if self.allocatable is None else frozenset(self.allocatable - known),
        )


EMPTY = Allocations()
"""Nobody holds anything (no answer yet, or the last one is stale)."""


def _valid_holder(namespace: str, pod: str, container: str) -> bool:
    return (
        0 < len(namespace) <= _MAX_NAMESPACE
        and 0 < len(pod) <= _MAX_POD
        and 0 < len(container) <= _MAX_CONTAINER
    )


def _is_gpu_resource(name: str, settings: KubernetesSettings) -> bool:
    return len(name) <= _MAX_RESOURCE and name.startswith(settings.resource_name_prefixes)


def build_allocations(
    listing: Any,
    allocatable: Any | None,
    settings: KubernetesSettings,
    slices: SliceIndex | None = None,
) -> Allocations:
    """Build :class:`Allocations` from a ``ListPodResourcesResponse``.

    Args:
        listing: the ``List`` answer (``pod_resources`` → ``containers`` → ``devices`` and
            ``dynamic_resources``).
        allocatable: the ``GetAllocatableResources`` answer, or None when not available.
        settings: id formats, resource name prefixes, DRA drivers and ``max_device_ids``.
        slices: DRA claim device → GPU UUID (:func:`~.dra.index_resource_slices`), or None when
            ResourceSlices are not read.

    Returns:
        The grants of every GPU device id and DRA claim device, at most ``max_device_ids`` of
        them (answer order).

    """
    limit = settings.max_device_ids
    grants: dict[DeviceKey, list[Grant]] = {}
    owners: dict[tuple[str, str], list[Holder]] = {}  # (resource, device id) → its holders
    unattributed: set[tuple[Claim, ClaimDevice]] = set()
    taken = unrecognised = over = 0
    for pod in listing.pod_resources:
        for container in pod.containers:
            ok = _valid_holder(pod.namespace, pod.name, container.name)
            holder = Holder(pod.namespace, pod.name, container.name) if ok else None
            for devices in container.devices:
                if not _is_gpu_resource(devices.resource_name, settings):
                    continue
                for device_id in devices.device_ids:
                    key = parse_device_id(device_id, settings.gpu_id_type)
                    if key is None or holder is None:
                        unrecognised += 1
                    elif taken >= limit:
                        over += 1
                    else:
                        taken += 1
                        grants.setdefault(key, []).append(Grant(holder, devices.resource_name))
                        owners.setdefault((devices.resource_name, device_id), []).append(holder)
            for claim, device in claim_devices(container, settings.dra.drivers):
                if holder is None:
                    unrecognised += 1
                elif taken >= limit:
                    over += 1
                else:
                    taken += 1
                    uuid = slices.get(device) if slices is not None else None
                    if uuid is None:
                        unattributed.add((claim, device))
                    else:
                        grants.setdefault(("uuid", uuid), []).append(Grant(holder, device.driver))
    stale = tuple(
        (device_id, tuple(sorted(set(holders))))
        for (_, device_id), holders in sorted(owners.items())
        if len(set(holders)) > 1
    )
    keys: frozenset[DeviceKey] | None = None
    if allocatable is not None:
        found: set[DeviceKey] = set()
        for devices in allocatable.devices:
            if not _is_gpu_resource(devices.resource_name, settings):
                continue
            for device_id in devices.device_ids:
                key = parse_device_id(device_id, settings.gpu_id_type)
                if key is not None and len(found) < limit:
                    found.add(key)
        keys = frozenset(found)
    return Allocations(
        {k: _merge(v) for k, v in grants.items()},
        keys,
        unrecognised,
        over,
        stale,
        frozenset(unattributed),
    )


def listed_claim_devices(listing: Any, settings: KubernetesSettings) -> frozenset[ClaimDevice]:
    """Every DRA claim device of a GPU driver in a ``List`` answer (at most ``max_device_ids``)."""
    found: set[ClaimDevice] = set()
    for pod in listing.pod_resources:
        for container in pod.containers:
            for _, device in claim_devices(container, settings.dra.drivers):
                if len(found) >= settings.max_device_ids:
                    return frozenset(found)
                found.add(device)
    return frozenset(found)
