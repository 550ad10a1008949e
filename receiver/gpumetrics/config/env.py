"""``GPUMETRICS_*`` environment variables: one named constant per variable, and what each sets.

Precedence: command-line flags > environment variables > the YAML file > defaults.
Each constant's docstring gives the meaning, the default and an example. A value that cannot
be parsed (or fails validation) stops start-up with a
:class:`~gpumetrics.config.load.ConfigError` naming the variable, the value and the setting.
Unknown ``GPUMETRICS_*`` names are reported as warnings (typos), except the go-plugin cookie.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ENV_BINDINGS", "EnvBinding", "EnvKind", "parse_env_value"]

GPUMETRICS_CONFIG = "GPUMETRICS_CONFIG"
"""Path of the YAML configuration file. Default: none.
Example: ``/etc/gpumetrics/gpumetrics.yaml``."""

GPUMETRICS_LISTEN = "GPUMETRICS_LISTEN"
"""``server.listen``: comma-separated addresses of the main gRPC listeners (pull, profiler,
health). Default: ``127.0.0.1:4319``. Example: ``unix:///run/gpumetrics/gpumetrics.sock``."""

GPUMETRICS_PROFILER_LISTEN = "GPUMETRICS_PROFILER_LISTEN"
"""``server.profiler_listen``: comma-separated listeners for the profiler-integration service
only. Default: ``unix:///run/gpumetrics/profiler.sock`` as root, else
``$XDG_RUNTIME_DIR/gpumetrics/profiler.sock`` (``/tmp/gpumetrics-<uid>/profiler.sock`` without
``XDG_RUNTIME_DIR``). Example: ``unix:///var/run/gpumetrics/profiler.sock``."""

GPUMETRICS_HEALTH_LISTEN = "GPUMETRICS_HEALTH_LISTEN"
"""``server.health_listen``: a plaintext listener serving only gRPC health (Kubernetes probes).
Default: none. Example: ``0.0.0.0:4328``."""

GPUMETRICS_PULL_TOKEN_FILE = "GPUMETRICS_PULL_TOKEN_FILE"
"""``server.pull_token_file``: file of bearer tokens (one per line) allowed to pull.
Default: none (no token needed). Example: ``/run/secrets/gpumetrics-pull-token``."""

GPUMETRICS_DECLARE_TOKEN_FILE = "GPUMETRICS_DECLARE_TOKEN_FILE"
"""``server.declare_token_file``: file of bearer tokens allowed to declare processes.
Default: none (no token needed). Example: ``/run/secrets/gpumetrics-declare-token``."""

GPUMETRICS_ALLOW_INSECURE_LISTEN = "GPUMETRICS_ALLOW_INSECURE_LISTEN"
"""``server.allow_insecure_listen``: allow a non-loopback TCP listener without TLS; trusted
networks only (``true``/``false``). Default: ``false``. Example: ``true``."""

GPUMETRICS_ALLOW_UNAUTHENTICATED_DECLARE = "GPUMETRICS_ALLOW_UNAUTHENTICATED_DECLARE"
"""``server.allow_unauthenticated_declare``: allow the profiler service on a TCP listener without
a declare token or mTLS (whoever can connect may declare any process's identity); single-user
hosts you trust only (``true``/``false``). Default: ``false``. Example: ``true``."""

GPUMETRICS_TRUSTED_DECLARER_UIDS = "GPUMETRICS_TRUSTED_DECLARER_UIDS"
"""``server.trusted_declarer_uids``: comma-separated uids whose unix-socket connections may
declare any process (besides root and the sidecar's own user). Default: none.
Example: ``10001``."""

GPUMETRICS_TRUSTED_DECLARER_GIDS = "GPUMETRICS_TRUSTED_DECLARER_GIDS"
"""``server.trusted_declarer_gids``: comma-separated gids or group names likewise.
Default: none. Example: ``parca``."""

GPUMETRICS_TLS_CERT_FILE = "GPUMETRICS_TLS_CERT_FILE"
"""``server.tls_cert_file``: PEM server certificate chain (TLS on TCP listeners). Default: none.
Example: ``/etc/gpumetrics/tls/server.crt``."""

GPUMETRICS_TLS_KEY_FILE = "GPUMETRICS_TLS_KEY_FILE"
"""``server.tls_key_file``: PEM server key. Default: none.
Example: ``/etc/gpumetrics/tls/server.key``."""

GPUMETRICS_TLS_CLIENT_CA_FILE = "GPUMETRICS_TLS_CLIENT_CA_FILE"
"""``server.tls_client_ca_file``: PEM CA bundle; clients must present a certificate it signed
(mTLS). Default: none. Example: ``/etc/gpumetrics/tls/clients-ca.crt``."""

GPUMETRICS_SIMULATE = "GPUMETRICS_SIMULATE"
"""``runtime.simulate``: run on the simulated NVML driver (profile name or scenario file).
Default: unset (the real driver). Example: ``default``."""

GPUMETRICS_BATCH_INTERVAL_S = "GPUMETRICS_BATCH_INTERVAL_S"
"""``runtime.batch_interval_s``: seconds between store batches. Default: ``10``. Example: ``5``."""

GPUMETRICS_UNHEALTHY_AFTER_NVML_DOWN_S = "GPUMETRICS_UNHEALTHY_AFTER_NVML_DOWN_S"
"""``runtime.unhealthy_after_nvml_down_s``: seconds without NVML before gRPC health (``""`` and
the pull service) turns NOT_SERVING; 0 = never. Default: ``120``. Example: ``300``."""

GPUMETRICS_COLLECTION_INTERVAL_S = "GPUMETRICS_COLLECTION_INTERVAL_S"
"""``collection.interval_s``: the fast NVML sampling cadence in seconds. Default: ``1``.
Example: ``2``."""

GPUMETRICS_DISABLED_METRICS = "GPUMETRICS_DISABLED_METRICS"
"""``collection.disabled_metrics``: comma-separated metric names not to collect. Default: none.
Example: ``hw.errors,hw.gpu.io``."""

GPUMETRICS_PROC_ROOT = "GPUMETRICS_PROC_ROOT"
"""``identity.proc_root``: procfs root. Default: ``/proc``. Example: ``/host/proc``."""

GPUMETRICS_NODE_NAME = "GPUMETRICS_NODE_NAME"
"""``identity.node_name``: node name. Default: the kernel's node name. Example: ``gpu-node-7``."""

GPUMETRICS_IN_KUBERNETES = "GPUMETRICS_IN_KUBERNETES"
"""``identity.in_kubernetes``: whether the node name is a Kubernetes node (``true``/``false``).
Default: detected from ``KUBERNETES_SERVICE_HOST``. Example: ``true``."""

GPUMETRICS_IDENTITY_MODE = "GPUMETRICS_IDENTITY_MODE"
"""``identity.mode``: ``profiler`` (per-process resources equal the profiler's) or ``enriched``
(richer, no exact join with profiles). Default: ``profiler``. Example: ``enriched``."""

GPUMETRICS_INCLUDE_ENV_VARS = "GPUMETRICS_INCLUDE_ENV_VARS"
"""``identity.include_env_vars``: comma-separated variable names reported as
``process.environment_variable.<NAME>``; the same value as the profiler's ``-env-vars``.
Default: none. Example: ``OTEL_SERVICE_NAME,OTEL_RESOURCE_ATTRIBUTES``."""

GPUMETRICS_RELABEL_CONFIG = "GPUMETRICS_RELABEL_CONFIG"
"""``identity.relabel_config``: YAML file of relabel rules. Default: none.
Example: ``/etc/gpumetrics/relabel.yaml``."""

GPUMETRICS_POD_ATTRIBUTION = "GPUMETRICS_POD_ATTRIBUTION"
"""``kubernetes.pod_attribution``: put the pod holding a GPU on its device metrics, from the
kubelet's pod-resources API (``true``/``false``). Default: on in Kubernetes. Example: ``true``."""

GPUMETRICS_POD_RESOURCES_SOCKET = "GPUMETRICS_POD_RESOURCES_SOCKET"
"""``kubernetes.pod_resources_socket``: the kubelet's pod-resources socket.
Default: ``/var/lib/kubelet/pod-resources/kubelet.sock``.
Example: ``/host/pod-resources/kubelet.sock``."""

GPUMETRICS_KUBERNETES_GPU_ID_TYPE = "GPUMETRICS_KUBERNETES_GPU_ID_TYPE"
"""``kubernetes.gpu_id_type``: device-plugin id formats that name GPUs, ``auto``, ``uuid`` or
``device-name``. Default: ``auto``. Example: ``device-name``."""

GPUMETRICS_STORE_MAX_BYTES = "GPUMETRICS_STORE_MAX_BYTES"
"""``store.max_bytes``: bytes of serialized OTLP held. Default: ``100663296`` (96 MiB).
Example: ``33554432``."""

GPUMETRICS_STORE_MAX_DATA_POINTS = "GPUMETRICS_STORE_MAX_DATA_POINTS"
"""``store.max_data_points``: data points held. Default: ``500000``. Example: ``100000``."""

GPUMETRICS_STORE_MAX_AGE_S = "GPUMETRICS_STORE_MAX_AGE_S"
"""``store.max_age_s``: oldest batch kept, in seconds. Default: ``900``. Example: ``300``."""

GPUMETRICS_STORE_PATH = "GPUMETRICS_STORE_PATH"
"""``store.path``: directory of the durable store (SQLite files of the batches, GPU events and
cursors not yet acknowledged, kept across restarts). Default: none (memory only).
Example: ``/var/lib/gpumetrics``."""

GPUMETRICS_EVENTS_ENABLED = "GPUMETRICS_EVENTS_ENABLED"
"""``events.enabled``: listen for NVML events (Xid, ECC...) and serve them as OTLP logs
(``true``/``false``). Default: ``true``. Example: ``false``."""

GPUMETRICS_EVENTS_TYPES = "GPUMETRICS_EVENTS_TYPES"
"""``events.types``: comma-separated NVML event types to register (docs/events.md).
Default: every type but ``pstate`` and ``clock``. Example: ``xid,double_bit_ecc``."""

GPUMETRICS_EVENTS_STORM_BURST = "GPUMETRICS_EVENTS_STORM_BURST"
"""``events.storm_burst``: identical events logged per storm window. Default: ``10``.
Example: ``3``."""

GPUMETRICS_EVENTS_STORM_WINDOW_S = "GPUMETRICS_EVENTS_STORM_WINDOW_S"
"""``events.storm_window_s``: the storm window in seconds. Default: ``60``. Example: ``300``."""

GPUMETRICS_PUSH_ENDPOINT = "GPUMETRICS_PUSH_ENDPOINT"
"""``push.endpoint``: OTLP/gRPC collector to push to. Default: none (no push).
Example: ``otel-collector:4317``."""

GPUMETRICS_PUSH_INSECURE = "GPUMETRICS_PUSH_INSECURE"
"""``push.insecure``: push in plaintext (``true``/``false``). Default: ``false``.
Example: ``true``."""

GPUMETRICS_PUSH_HEADERS = "GPUMETRICS_PUSH_HEADERS"
"""``push.headers``: comma-separated ``key=value`` gRPC metadata. Default: none.
Example: ``x-tenant=ml,x-team=infra``."""

GPUMETRICS_PUSH_COMPRESSION = "GPUMETRICS_PUSH_COMPRESSION"
"""``push.compression``: ``none`` or ``gzip``. Default: ``none``. Example: ``gzip``."""

GPUMETRICS_PUSH_TIMEOUT_S = "GPUMETRICS_PUSH_TIMEOUT_S"
"""``push.timeout_s``: one deadline for an export and its retries, in seconds. Default: ``10``.
Example: ``30``."""

GPUMETRICS_PUSH_INTERVAL_S = "GPUMETRICS_PUSH_INTERVAL_S"
"""``push.interval_s``: seconds between exports. Default: ``10``. Example: ``15``."""

GPUMETRICS_PUSH_CA_FILE = "GPUMETRICS_PUSH_CA_FILE"
"""``push.ca_file``: PEM roots to verify the collector. Default: the system roots.
Example: ``/etc/gpumetrics/ca.pem``."""

GPUMETRICS_PLUGIN_TRANSPORT = "GPUMETRICS_PLUGIN_TRANSPORT"
"""``plugin.transport``: go-plugin listener, ``unix`` or ``tcp``. Default: ``unix``.
Example: ``tcp``."""

GPUMETRICS_LOG_LEVEL = "GPUMETRICS_LOG_LEVEL"
"""``log.level``: ``debug``, ``info``, ``warn`` or ``error``. Default: ``info``.
Example: ``debug``."""

GPUMETRICS_LOG_FORMAT = "GPUMETRICS_LOG_FORMAT"
"""``log.format``: ``auto``, ``json`` or ``text``. Default: ``auto``. Example: ``json``."""


class EnvKind(enum.Enum):
    """How a variable's text becomes a configuration value."""

    SCALAR = "scalar"
    """Passed as text; the model's type converts it (numbers, ``true``/``false``, enums)."""
    LIST = "list"
    """Comma-separated items, blanks dropped."""
    MAP = "map"
    """Comma-separated ``key=value`` pairs (split on the first ``=``)."""


@dataclass(frozen=True)
class EnvBinding:
    """One variable and the dotted configuration path it sets."""

    name: str
    path: str
    kind: EnvKind = EnvKind.SCALAR


ENV_BINDINGS: tuple[EnvBinding, ...] = (
    EnvBinding(GPUMETRICS_LISTEN, "server.listen", EnvKind.LIST),
    EnvBinding(GPUMETRICS_PROFILER_LISTEN, "server.profiler_listen", EnvKind.LIST),
    EnvBinding(GPUMETRICS_PULL_TOKEN_FILE, "server.pull_token_file"),
    EnvBinding(GPUMETRICS_DECLARE_TOKEN_FILE, "server.declare_token_file"),
    EnvBinding(GPUMETRICS_TLS_CERT_FILE, "server.tls_cert_file"),
    EnvBinding(GPUMETRICS_TLS_KEY_FILE, "server.tls_key_file"),
    EnvBinding(GPUMETRICS_TLS_CLIENT_CA_FILE, "server.tls_client_ca_file"),
    EnvBinding(GPUMETRICS_HEALTH_LISTEN, "server.health_listen"),
    EnvBinding(GPUMETRICS_ALLOW_INSECURE_LISTEN, "server.allow_insecure_listen"),
    EnvBinding(GPUMETRICS_ALLOW_UNAUTHENTICATED_DECLARE, "server.allow_unauthenticated_declare"),
    EnvBinding(GPUMETRICS_TRUSTED_DECLARER_UIDS, "server.trusted_declarer_uids", EnvKind.LIST),
    EnvBinding(GPUMETRICS_TRUSTED_DECLARER_GIDS, "server.trusted_declarer_gids", EnvKind.LIST),
    EnvBinding(GPUMETRICS_SIMULATE, "runtime.simulate"),
    EnvBinding(GPUMETRICS_BATCH_INTERVAL_S, "runtime.batch_interval_s"),
    EnvBinding(GPUMETRICS_UNHEALTHY_AFTER_NVML_DOWN_S, "runtime.unhealthy_after_nvml_down_s"),
    EnvBinding(GPUMETRICS_COLLECTION_INTERVAL_S, "collection.interval_s"),
    EnvBinding(GPUMETRICS_DISABLED_METRICS, "collection.disabled_metrics", EnvKind.LIST),
    EnvBinding(GPUMETRICS_PROC_ROOT, "identity.proc_root"),
    EnvBinding(GPUMETRICS_NODE_NAME, "identity.node_name"),
    EnvBinding(GPUMETRICS_IN_KUBERNETES, "identity.in_kubernetes"),
    EnvBinding(GPUMETRICS_IDENTITY_MODE, "identity.mode"),
    EnvBinding(GPUMETRICS_INCLUDE_ENV_VARS, "identity.include_env_vars", EnvKind.LIST),
    EnvBinding(GPUMETRICS_RELABEL_CONFIG, "identity.relabel_config"),
    EnvBinding(GPUMETRICS_POD_ATTRIBUTION, "kubernetes.pod_attribution"),
    EnvBinding(GPUMETRICS_POD_RESOURCES_SOCKET, "kubernetes.pod_resources_socket"),
    EnvBinding(GPUMETRICS_KUBERNETES_GPU_ID_TYPE, "kubernetes.gpu_id_type"),
    EnvBinding(GPUMETRICS_STORE_MAX_BYTES, "store.max_bytes"),
    EnvBinding(GPUMETRICS_STORE_MAX_DATA_POINTS, "store.max_data_points"),
    EnvBinding(GPUMETRICS_STORE_MAX_AGE_S, "store.max_age_s"),
    EnvBinding(GPUMETRICS_STORE_PATH, "store.path"),
    EnvBinding(GPUMETRICS_EVENTS_ENABLED, "events.enabled"),
    EnvBinding(GPUMETRICS_EVENTS_TYPES, "events.types", EnvKind.LIST),
    EnvBinding(GPUMETRICS_EVENTS_STORM_BURST, "events.storm_burst"),
    EnvBinding(GPUMETRICS_EVENTS_STORM_WINDOW_S, "events.storm_window_s"),
    EnvBinding(GPUMETRICS_PUSH_ENDPOINT, "push.endpoint"),
    EnvBinding(GPUMETRICS_PUSH_INSECURE, "push.insecure"),
    EnvBinding(GPUMETRICS_PUSH_HEADERS, "push.headers", EnvKind.MAP),
    EnvBinding(GPUMETRICS_PUSH_COMPRESSION, "push.compression"),
    EnvBinding(GPUMETRICS_PUSH_TIMEOUT_S, "push.timeout_s"),
    EnvBinding(GPUMETRICS_PUSH_INTERVAL_S, "push.interval_s"),
    EnvBinding(GPUMETRICS_PUSH_CA_FILE, "push.ca_file"),
    EnvBinding(GPUMETRICS_PLUGIN_TRANSPORT, "plugin.transport"),
    EnvBinding(GPUMETRICS_LOG_LEVEL, "log.level"),
    EnvBinding(GPUMETRICS_LOG_FORMAT, "log.format"),
)
"""Every variable that sets a configuration value (``GPUMETRICS_CONFIG`` names the file)."""


def parse_env_value(binding: EnvBinding, raw: str) -> Any:
    """Turn the text of ``binding``'s variable into the value for its path.

    Raises:
        ValueError: a ``MAP`` item without ``=`` or with an empty key (the message names it).

    """
    if binding.kind is EnvKind.LIST:
        return [item.strip() for item in raw.split(",") if item.strip()]
    if binding.kind is EnvKind.MAP:
        out: dict[str, str] = {}
        for item in raw.split(","):
            if not item.strip():
                continue
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"item {item.strip()!r} is not key=value")
            out[key.strip()] = value.strip()
        return out
    return raw


def env_overrides(environ: Mapping[str, str]) -> dict[str, tuple[str, Any]]:
    """Collect ``{path: (variable, value)}`` from the bound variables present in ``environ``.

    Empty values count as unset.

    Raises:
        ValueError: ``NAME='raw': reason`` when a value cannot be parsed.

    """
    out: dict[str, tuple[str, Any]] = {}
    for binding in ENV_BINDINGS:
        raw = environ.get(binding.name)
        if raw is None or raw == "":
            continue
        try:
            out[binding.path] = (binding.name, parse_env_value(binding, raw))
        except ValueError as exc:
            raise ValueError(f"{binding.name}={raw!r}: {exc}") from None
    return out


def unknown_variables(environ: Mapping[str, str], ignore: tuple[str, ...] = ()) -> list[str]:
    """``GPUMETRICS_*`` names in ``environ`` that are not ours (likely typos), sorted."""
    known = {b.name for b in ENV_BINDINGS} | {GPUMETRICS_CONFIG, *ignore}
    return sorted(n for n in environ if n.startswith("GPUMETRICS_") and n not in known)
