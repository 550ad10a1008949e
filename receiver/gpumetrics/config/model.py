"""The sidecar's configuration model: one validated pydantic tree, every default in one place.

Sections and who defines them:

* ``server``: :class:`gpumetrics.service.server.ServerSettings` (listeners, TLS, tokens, limits);
* ``store``: :class:`StoreSettings`, mirroring :class:`gpumetrics.store.StoreLimits`;
* ``collection``: :class:`gpumetrics.nvml.settings.CollectionSettings`;
* ``events``: :class:`gpumetrics.events.EventSettings` (NVML events as OTLP logs, their store);
* ``identity``: :class:`IdentitySettings` (procfs root, node, relabel rules, declared-store limits);
* ``push``: :class:`gpumetrics.service.push.PushSettings`;
* ``kubernetes``: :class:`gpumetrics.kubernetes.settings.KubernetesSettings` (pod attribution);
* ``runtime``, ``plugin``, ``log``: defined here.

Every model forbids unknown keys. :func:`default_config` is the one factory of defaults;
``docs/configuration.md`` lists every setting and ``examples/gpumetrics.yaml`` spells the
defaults out (a test checks the example equals :func:`default_config`).
"""

from __future__ import annotations

import enum
import os

from pydantic import Field, field_validator, model_validator

from gpumetrics.events.settings import EventSettings
from gpumetrics.identity import limits as _declared
from gpumetrics.identity import resource_limits as _resource
from gpumetrics.identity.modes import IdentityMode, validate_env_var_names
from gpumetrics.identity.resource_limits import ResourceLimits
from gpumetrics.kubernetes.settings import KubernetesSettings
from gpumetrics.nvml.settings import CollectionSettings
from gpumetrics.service.push_settings import PushSettings
from gpumetrics.service.settings import ServerSettings
from gpumetrics.settingsbase import SettingsModel
from gpumetrics.store import limits as _limits
from gpumetrics.store.limits import StoreLimits

__all__ = [
    "RESOURCE_ENVELOPE_BYTES",
    "DeclaredLimits",
    "IdentitySettings",
    "LogSettings",
    "PluginSettings",
    "PluginTransport",
    "ResourceLimitSettings",
    "RuntimeSettings",
    "SidecarConfig",
    "StoreSettings",
    "batch_cap",
    "default_config",
]


class StoreSettings(SettingsModel):
    """Batch store bounds (``store``); defaults and sizing from :mod:`gpumetrics.store.limits`.

    Attributes:
        max_bytes: serialized bytes held (By), default 96 MiB.
        max_data_points: data points held, default 500,000.
        max_age_s: oldest batch kept (s), default 900.
        consumer_ttl_s: a consumer silent this long (s) stops pinning data, default 300.
        max_consumers: consumers at once (pull consumers plus ``push``), default 16.
        max_collection_bytes: serialized bytes of one batch interval's collection (By), default
            16 MiB: the budget of the batch under construction. The host resource is always
            kept; a process whose resource does not fit what is left is left out, its points
            counted as drop reason ``max_collection_bytes``.
        path: directory of the durable store (``metrics.sqlite``, ``logs.sqlite``: SQLite in WAL
            mode, :mod:`gpumetrics.store.journal`); created (mode 0700) if missing. Batches, GPU
            event records and every consumer's cursor are written there before they are
            served, so a restarted sidecar resumes its epoch and loses nothing unacknowledged.
            None or ``""`` (default): memory only. Must be an absolute path.

    """

    max_bytes: int = Field(default=_limits.DEFAULT_MAX_BYTES, gt=0)
    max_data_points: int = Field(default=_limits.DEFAULT_MAX_DATA_POINTS, gt=0)
    max_age_s: float = Field(default=_limits.DEFAULT_MAX_AGE_S, gt=0)
    consumer_ttl_s: float = Field(default=_limits.DEFAULT_CONSUMER_TTL_S, gt=0)
    max_consumers: int = Field(default=_limits.DEFAULT_MAX_CONSUMERS, gt=0)
    max_collection_bytes: int = Field(default=_limits.DEFAULT_MAX_COLLECTION_BYTES, gt=0)
    path: str | None = None

    @field_validator("path")
    @classmethod
    def _store_path(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if "\0" in value:
            raise ValueError("must not contain a NUL character")
        if value != value.strip():
            raise ValueError(f"must not begin or end with white space, got {value!r}")
        if not value.startswith("/"):
            raise ValueError(
                f"must be an absolute path (a directory for the durable store), got {value!r}"
            )
        normal = os.path.normpath(value)
        if normal in ("/", "/proc", "/sys", "/dev") or normal.startswith(("/proc/", "/sys/")):
            raise ValueError(
                f"{value!r} cannot hold the durable store; use e.g. /var/lib/gpumetrics"
            )
        return normal

    def limits(self) -> StoreLimits:
        """Return the :class:`~gpumetrics.store.StoreLimits` these settings describe."""
        return StoreLimits(**self.model_dump(exclude={"max_collection_bytes", "path"}))


class DeclaredLimits(SettingsModel):
    """Limits of the declared-process store (``identity.declared``; defaults: ``identity.limits``).

    Attributes:
        max_processes: processes held at once.
        max_process_context_bytes: largest OTEP 4719 process-context payload (By).
        max_environment_bytes: largest sum of captured environment names and values (By).
        max_profiler_resource_bytes: largest profiler-supplied resource (By).
        max_bytes: memory the decoded declarations may hold in all (By, estimated per entry);
            a declaration that does not fit is rejected, naming this setting.

    """

    max_processes: int = Field(default=_declared.DEFAULT_MAX_PROCESSES, ge=1)
    max_process_context_bytes: int = Field(
        default=_declared.DEFAULT_MAX_PROCESS_CONTEXT_BYTES, ge=1
    )
    max_environment_bytes: int = Field(default=_declared.DEFAULT_MAX_ENVIRONMENT_BYTES, ge=1)
    max_profiler_resource_bytes: int = Field(
        default=_declared.DEFAULT_MAX_PROFILER_RESOURCE_BYTES, ge=1
    )
    max_bytes: int = Field(default=_declared.DEFAULT_MAX_BYTES, ge=1)


class ResourceLimitSettings(SettingsModel):
    """Limits of one per-process resource (``identity.resource_limits``).

    The semantics are the OpenTelemetry SDK's attribute limits
    (:mod:`gpumetrics.identity.resource_limits`).

    Attributes:
        attribute_value_length_limit: longest string value (characters) or byte array (bytes),
            also inside arrays and maps; longer ones are truncated. Default 4096 (``PATH_MAX``).
        attribute_count_limit: most attributes; later ones are discarded. Default 128.
        max_bytes: most encoded bytes of a resource's attributes (By); an attribute that would
            exceed it is discarded. Default 8 KiB.
        cache_max_bytes: estimated memory (By) of the resources cached for reuse across batches
            (least recently used evicted first). Default 16 MiB.

    """

    attribute_value_length_limit: int = Field(
        default=_resource.DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT, ge=1
    )
    attribute_count_limit: int = Field(default=_resource.DEFAULT_ATTRIBUTE_COUNT_LIMIT, ge=1)
    max_bytes: int = Field(default=_resource.DEFAULT_MAX_RESOURCE_BYTES, ge=1)
    cache_max_bytes: int = Field(default=_declared.DEFAULT_RESOURCE_CACHE_MAX_BYTES, ge=1)

    def limits(self) -> ResourceLimits:
        """Return the :class:`~gpumetrics.identity.resource_limits.ResourceLimits` they set."""
        return ResourceLimits(**self.model_dump(exclude={"cache_max_bytes"}))


class IdentitySettings(SettingsModel):
    """How per-process resources are built (``identity``).

    Attributes:
        mode: ``profiler`` (default): a process's GPU resource equals its profile resource (the
            declared profiler resource, else the keys the OpenTelemetry eBPF profiler computes);
            ``enriched``: adds what the process declares about itself, ``service.name``
            fallbacks, relabel labels and host attributes, which do **not** join exactly with
            profiles (``docs/identity.md``).
        include_env_vars: variable names reported as ``process.environment_variable.<NAME>``
            on undeclared processes; set it to the profiler's ``include_env_vars`` /
            ``-env-vars`` (same names), or the resource changes when the profiler declares it.
        proc_root: procfs root; ``/host/proc`` when the host's /proc is mounted into a container.
            Also used by the collectors (``pid_max``) and ``count-gpus``.
        node_name: node name (``k8s.node.name`` in Kubernetes, else ``host.name``) of the host
            resource, and of per-process resources in enriched mode; None = the kernel's node
            name (``uname -n``).
        in_kubernetes: whether ``node_name`` is a Kubernetes node; None = detect from
            ``KUBERNETES_SERVICE_HOST``.
        host_name: ``host.name`` override; None = ``node_name`` outside Kubernetes.
        host_pid_namespace: whether ``proc_root`` shows host pids; None = detect.
        relabel_config: path of a YAML file of parca-agent relabel rules; None = no rules. In
            profiler mode only rules that keep or drop processes are accepted.
        read_process_context: read undeclared processes' OTEP 4719 ``OTEL_CTX`` mappings
            (enriched mode only).
        declared: limits of the declared-process store.
        resource_limits: limits of one per-process resource (value length, attribute count,
            encoded bytes) and of the resources cached.

    """

    mode: IdentityMode = IdentityMode.PROFILER
    include_env_vars: tuple[str, ...] = ()
    proc_root: str = "/proc"
    node_name: str | None = None
    in_kubernetes: bool | None = None
    host_name: str | None = None
    host_pid_namespace: bool | None = None
    relabel_config: str | None = None
    read_process_context: bool = True
    declared: DeclaredLimits = Field(default_factory=lambda: DeclaredLimits())
    resource_limits: ResourceLimitSettings = Field(default_factory=lambda: ResourceLimitSettings())

    @field_validator("include_env_vars", mode="before")
    @classmethod
    def _env_var_names(cls, value: object) -> tuple[str, ...]:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ValueError("must be a list of environment variable names")
        return validate_env_var_names(value)

    @field_validator("proc_root")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must be an absolute path, got {value!r}")
        return value

    @field_validator("node_name", "relabel_config")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty (leave it unset for the default)")
        return value


class RuntimeSettings(SettingsModel):
    """The sidecar runtime (``runtime``).

    Attributes:
        batch_interval_s: how often (s) the producer's content becomes one store batch
            (default 10, the store's sizing assumption).
        shutdown_timeout_s: the most a graceful shutdown may take (s) outside plugin mode.
        simulate: run on the simulated NVML driver: a built-in profile name or a scenario file
            path; ``default`` = the simulator's default profile; None = the real driver.
        unhealthy_after_nvml_down_s: once NVML has stopped answering for this long (s), gRPC
            health of ``""`` and the pull service turns NOT_SERVING, so a liveness probe
            restarts the sidecar (a container that lost device access only recovers by a
            restart, field case F32); SERVING again as soon as NVML answers. A release on
            request (GPU reset) does not count. Default 120; 0 = health never follows NVML.

    """

    batch_interval_s: float = Field(default=10.0, gt=0, le=3600)
    shutdown_timeout_s: float = Field(default=10.0, gt=0, le=600)
    simulate: str | None = None
    unhealthy_after_nvml_down_s: float = Field(default=120.0, ge=0, le=86400)

    @field_validator("simulate")
    @classmethod
    def _simulate_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must be a profile name or a scenario file (or unset)")
        return value


class PluginTransport(enum.StrEnum):
    """Listener of go-plugin mode."""

    UNIX = "unix"
    TCP = "tcp"


class PluginSettings(SettingsModel):
    """go-plugin mode (``plugin``); used only when the host's magic cookie is present.

    Attributes:
        transport: ``unix`` (a socket in a private directory) or ``tcp`` (127.0.0.1 within
            ``PLUGIN_MIN_PORT..PLUGIN_MAX_PORT``).
        shutdown_timeout_s: the most shutdown may take after ``GRPCController/Shutdown`` (s);
            go-plugin kills the plugin 2 s after asking.
        parent_check_interval_s: how often (s) the parent pid is checked.

    """

    transport: PluginTransport = PluginTransport.UNIX
    shutdown_timeout_s: float = Field(default=1.5, gt=0, lt=2.0)
    parent_check_interval_s: float = Field(default=1.0, gt=0, le=60)


class LogFormatSetting(enum.StrEnum):
    """``log.format``: ``auto`` is ``json`` in plugin mode and ``text`` otherwise."""

    AUTO = "auto"
    JSON = "json"
    TEXT = "text"


class LogSettings(SettingsModel):
    """Logging (``log``): records go to stderr.

    Attributes:
        level: ``debug``, ``info``, ``warn`` or ``error``.
        format: ``auto``, ``json`` (hclog-compatible) or ``text``.

    """

    level: str = "info"
    format: LogFormatSetting = LogFormatSetting.AUTO

    @field_validator("level")
    @classmethod
    def _level(cls, value: str) -> str:
        allowed = ("debug", "info", "warn", "warning", "error")
        if value.lower() not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}, got {value!r}")
        return value.lower()


class SidecarConfig(SettingsModel):
    """The whole sidecar configuration (see the module docstring for the sections)."""

    server: ServerSettings = Field(default_factory=lambda: ServerSettings())
    store: StoreSettings = Field(default_factory=lambda: StoreSettings())
    collection: CollectionSettings = Field(default_factory=lambda: CollectionSettings())
    events: EventSettings = Field(default_factory=lambda: EventSettings())
    identity: IdentitySettings = Field(default_factory=lambda: IdentitySettings())
    push: PushSettings = Field(default_factory=lambda: PushSettings())
    kubernetes: KubernetesSettings = Field(default_factory=lambda: KubernetesSettings())
    runtime: RuntimeSettings = Field(default_factory=lambda: RuntimeSettings())
    plugin: PluginSettings = Field(default_factory=lambda: PluginSettings())
    log: LogSettings = Field(default_factory=lambda: LogSettings())

    def log_store_limits(self) -> StoreLimits:
        """Return the log store's limits: ``events.max_*`` with the ``store`` consumer limits.

        The log store of GPU events keeps its own size and age bounds; its consumers (one
        cursor per consumer name in each store) are bounded like the metric store's.
        """
        ev = self.events
        return StoreLimits(
            max_bytes=ev.max_bytes,
            max_data_points=ev.max_log_records,
            max_age_s=ev.max_age_s,
            consumer_ttl_s=self.store.consumer_ttl_s,
            max_consumers=self.store.max_consumers,
        )

    @property
    def max_batch_bytes(self) -> int:
        """Largest batch the store keeps (By): what a default Pull answer and a push export hold.

        Larger collections are split into several batches (``BatchStore(max_batch_bytes=...)``).
        """
        return batch_cap(self.server, self.push)

    @model_validator(mode="after")
    def _batches_hold_a_resource(self) -> SidecarConfig:
        # one data point of a process carries that process's whole resource: a batch, and a
        # collection, must leave room for the largest one the resource limits allow
        need = self.identity.resource_limits.max_bytes + RESOURCE_ENVELOPE_BYTES
        limit = "identity.resource_limits.max_bytes"
        if self.max_batch_bytes < need:
            by_push = self.push.max_bytes_per_export < self.server.pull_default_max_bytes
            field = (
                "push.max_bytes_per_export"
                if self.push.endpoint and by_push
                else "server.pull_default_max_bytes"
            )
            raise ValueError(
                f"{field}: {self.max_batch_bytes} bytes cannot hold one process's resource: "
                f"{limit} lets a resource take {need - RESOURCE_ENVELOPE_BYTES} bytes "
                f"(plus {RESOURCE_ENVELOPE_BYTES} for its scope, metric and point); raise it to "
                f"at least {need} or lower {limit}"
            )
        if self.store.max_collection_bytes < need:
            raise ValueError(
                f"store.max_collection_bytes: {self.store.max_collection_bytes} bytes cannot "
                f"hold one process's resource ({limit} lets it take "
                f"{need - RESOURCE_ENVELOPE_BYTES} bytes, plus {RESOURCE_ENVELOPE_BYTES}); "
                f"raise it to at least {need} or lower {limit}"
            )
        return self

    @model_validator(mode="after")
    def _one_proc_root(self) -> SidecarConfig:
        collection_root = self.collection.proc_root
        if (
            "proc_root" in self.collection.model_fields_set
            and collection_root != self.identity.proc_root
        ):
            raise ValueError(
                "collection.proc_root: set identity.proc_root instead (one procfs root for all)"
            )
        if collection_root != self.identity.proc_root:
            object.__setattr__(
                self,
                "collection",
                self.collection.model_copy(update={"proc_root": self.identity.proc_root}),
            )
        return self


RESOURCE_ENVELOPE_BYTES = 4 * 1024
"""Room for what a batch holds besides one process's resource (whose attributes
``identity.resource_limits.max_bytes`` bounds): its scope, one metric's header and one data
point with its GPU attributes."""


def batch_cap(server: ServerSettings, push: PushSettings) -> int:
    """Return the largest batch the store may keep for these settings (By).

    A default Pull answer (``server.pull_default_max_bytes``) must hold any batch, and so must a
    push export (``push.max_bytes_per_export``) when push is on.
    """
    cap = server.pull_default_max_bytes
    if push.endpoint:
        cap = min(cap, push.max_bytes_per_export)
    return cap


def default_config() -> SidecarConfig:
    """Return the configuration with every default (the one factory of defaults)."""
    return SidecarConfig()
