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

from importlib import import_module
from typing import Any

_EXPORTS = {
    "EMPTY": "allocations",
    "Allocations": "allocations",
    "Grant": "allocations",
    "Holder": "allocations",
    "build_allocations": "allocations",
    "device_attributes": "allocations",
    "parse_device_id": "allocations",
    "PodAttribution": "attribution",
    "Failure": "client",
    "PodResourcesClient": "client",
    "PodResourcesError": "client",
    "DRASettings": "settings",
    "GPUIdType": "settings",
    "KubernetesSettings": "settings",
}
"""Name → the module of this package that defines it. Loaded on first use (PEP 562): the
configuration imports :mod:`.settings` on every node, the client and its generated gRPC stubs
are loaded only where attribution runs (docs/performance.md, memory)."""


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)


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
