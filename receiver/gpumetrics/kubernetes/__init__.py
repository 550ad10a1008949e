"""GPU → pod attribution from the kubelet's pod-resources API (``docs/kubernetes.md``).

Modules: :mod:`.settings` (the ``kubernetes`` configuration section), :mod:`.client` (the
pod-resources v1 client over the kubelet's unix socket; messages in :mod:`.podresources.v1`,
generated from ``proto/gpumetrics/kubernetes/podresources/v1/podresources.proto``),
:mod:`.allocations` (device ids → holders, and the attribute rule; pure), :mod:`.dra` (DRA
claim devices → GPU UUIDs through ResourceSlices; pure), :mod:`.apiserver` (the optional read of
this node's ResourceSlices), :mod:`.emission` (when ``nvidia.gpu.k8s.allocation`` is recorded),
:mod:`.reporting` (what is counted and logged, once per change) and :mod:`.attribution`
(:class:`PodAttribution`: the refresher thread and the snapshot the collector reads).
"""

from gpumetrics.kubernetes.allocations import (
    EMPTY,
    Allocations,
    Grant,
    Holder,
    build_allocations,
    device_attributes,
    parse_device_id,
)
from gpumetrics.kubernetes.attribution import PodAttribution
from gpumetrics.kubernetes.client import Failure, PodResourcesClient, PodResourcesError
from gpumetrics.kubernetes.settings import DRASettings, GPUIdType, KubernetesSettings

__all__ = [
    "EMPTY",
    "Allocations",
    "DRASettings",
    "Failure",
    "GPUIdType",
    "Grant",
    "Holder",
    "KubernetesSettings",
    "PodAttribution",
    "PodResourcesClient",
    "PodResourcesError",
    "build_allocations",
    "device_attributes",
    "parse_device_id",
]
