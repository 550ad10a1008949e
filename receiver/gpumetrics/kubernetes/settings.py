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


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where the kubelet mounts a pod's service account token and the cluster's CA bundle."""


class DRASettings(SettingsModel):
    """GPUs allocated through Dynamic Resource Allocation claims (``kubernetes.dra``).

    The kubelet names a claim's devices by DRA driver, pool and device name (``gpu.nvidia.com``,
    ``<node>``, ``gpu-0``); which GPU that is, only the driver's ResourceSlices say (each
    device's ``uuid`` attribute). Reading them is a call to the API server, off by default.

    Attributes:
        drivers: DRA drivers whose claim devices are GPUs (NVIDIA's DRA driver:
            ``gpu.nvidia.com``; its ``compute-domain.nvidia.com`` devices are IMEX channels).
        resource_slices: read this node's ResourceSlices from the API server (``list`` on
            ``resourceslices``, group ``resource.k8s.io``; needs RBAC and the service account
            token) to map claim devices to GPUs. Off: claim devices are counted and logged as
            unattributed.
        api_server: the API server's base URL; None = ``https://$KUBERNETES_SERVICE_HOST:
            $KUBERNETES_SERVICE_PORT`` (in a pod).
        token_file: the bearer token (read at every request: projected tokens rotate).
        ca_file: the CA bundle the API server's certificate is checked against.
        refresh_interval_s: seconds between reads of the ResourceSlices (s); a claim device no
            slice names triggers a read sooner, at most once per ``kubernetes.refresh_interval_s``.

    """

    drivers: tuple[str, ...] = ("gpu.nvidia.com",)
    resource_slices: bool = False
    api_server: str | None = None
    token_file: str = SERVICE_ACCOUNT_DIR + "/token"
    ca_file: str = SERVICE_ACCOUNT_DIR + "/ca.crt"
    refresh_interval_s: float = Field(default=300.0, gt=0, le=86400)

    @field_validator("api_server")
    @classmethod
    def _https(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("https://"):
            raise ValueError(f"must be an https:// URL, got {value!r}")
        return value

    @field_validator("drivers")
    @classmethod
    def _drivers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not d.strip() for d in value):
            raise ValueError("driver names must not be empty")
        return value


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
        max_device_ids: most GPU device ids (device-plugin ids and DRA claim devices) kept
            from one answer; the rest are counted
            (``gpumetrics.kubernetes.device_ids{state=over_limit}``) and logged.
        allocation_interval_s: ``nvidia.gpu.k8s.allocation`` (an info-style series) is recorded
            when the allocations change and again every this many seconds (s) while they do
            not, so that a series stays fresh in Prometheus (5 min lookback) and in the
            Collector's Prometheus exporter (``metric_expiration``, 5 min) without a point per
            holder per collection cycle; 0 = every cycle.
        max_allocation_points: most ``nvidia.gpu.k8s.allocation`` points recorded at once;
            beyond, the rest are cut (spread over the GPUs), counted
            (``gpumetrics.kubernetes.allocation_points{outcome=cut}``) and logged.
        dra: GPUs allocated through DRA claims (:class:`DRASettings`).

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
    allocation_interval_s: float = Field(default=60.0, ge=0, le=3600)
    max_allocation_points: int = Field(default=1024, ge=1, le=1 << 20)
    dra: DRASettings = Field(default_factory=DRASettings)

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
