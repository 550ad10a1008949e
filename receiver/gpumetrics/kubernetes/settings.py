"""Pod attribution settings (the ``kubernetes`` section of the sidecar's configuration)."""

from __future__ import annotations

import enum

from pydantic import Field, field_validator, model_validator

from gpumetrics.settingsbase import SettingsModel

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""Where the kubelet serves its pod-resources API (Kubernetes documentation, "Monitoring device
plugin resources")."""

DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""The kubelet's own send limit for pod-resources answers (16 MiB)."""


class GPUIdType(enum.StrEnum):
    """Which device-plugin id formats name a GPU (dcgm-exporter's ``--kubernetes-gpu-id-type``).

    ``uuid``: the NVIDIA device plugin's ids, the NVML UUID (``GPU-…``, ``MIG-…``), with
    ``::<replica>`` appended for time-sliced or MPS shares. ``device-name``: GKE's device
    plugin's ids, ``nvidia<minor>`` (``/dev/nvidia<minor>``), ``nvidia<minor>/gi<id>`` for a MIG
    GPU instance, ``/vgpu<n>`` appended for shares. ``auto``: both; the two formats cannot be
    mistaken for each other.
    """

    AUTO = "auto"
    UUID = "uuid"
    DEVICE_NAME = "device-name"


class KubernetesSettings(SettingsModel):
    """GPU → pod attribution from the kubelet's pod-resources API (``kubernetes``).

    Attributes:
        pod_attribution: put the pod holding a GPU on that GPU's device points; None (auto) =
            on when running in Kubernetes (``identity.in_kubernetes``, else
            ``KUBERNETES_SERVICE_HOST`` is set).
        pod_resources_socket: the kubelet's pod-resources unix socket (mount its directory,
            ``/var/lib/kubelet/pod-resources``, so a kubelet restart's new socket is seen).
        gpu_id_type: which device-id formats name GPUs (:class:`GPUIdType`).
        resource_name_prefixes: extended resources whose devices are GPUs (``nvidia.com/gpu``,
            ``nvidia.com/gpu.shared``, ``nvidia.com/mig-1g.10gb`` all start with ``nvidia.com/``).
        refresh_interval_s: seconds between reads of the kubelet's answer (s).
        timeout_s: deadline of one pod-resources call (s).
        stale_after_s: an answer older than this (s) is no longer used: device points then carry
            no pod until the kubelet answers again (a GPU may have changed hands meanwhile).
        max_response_bytes: largest answer accepted (By); larger answers are refused.
        max_device_ids: most GPU device ids kept from one answer; the rest are counted
            (``gpumetrics.kubernetes.device_ids{state=over_limit}``) and logged.

    """

    pod_attribution: bool | None = None
    pod_resources_socket: str = DEFAULT_SOCKET
    gpu_id_type: GPUIdType = GPUIdType.AUTO
    resource_name_prefixes: tuple[str, ...] = ("nvidia.com/",)
    refresh_interval_s: float = Field(default=10.0, gt=0, le=3600)
    timeout_s: float = Field(default=5.0, gt=0, le=60)
    stale_after_s: float = Field(default=60.0, gt=0, le=86400)
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, ge=1024, le=1 << 30)
    max_device_ids: int = Field(default=4096, ge=1, le=1 << 20)

    @field_validator("pod_resources_socket")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must be an absolute path, got {value!r}")
        return value

    @field_validator("resource_name_prefixes")
    @classmethod
    def _prefixes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or any(not p.strip() for p in value):
            raise ValueError("must list at least one non-empty resource name prefix")
        return value

    @model_validator(mode="after")
    def _stale_after_refresh(self) -> KubernetesSettings:
        if self.stale_after_s < self.refresh_interval_s:
            raise ValueError(
                f"stale_after_s ({self.stale_after_s:g}) must be at least refresh_interval_s "
                f"({self.refresh_interval_s:g}), or every answer would be stale before the next"
            )
        return self

    def enabled(self, in_kubernetes: bool) -> bool:
        """Return whether pod attribution runs (``pod_attribution``, or auto)."""
        return in_kubernetes if self.pod_attribution is None else self.pod_attribution
