"""parca-agent style labels of a process (the relabel input) and their mapping to attributes.

Input labels (parca-agent's, https://github.com/parca-dev/parca-agent: its README's "Metadata
Labels" and ``reporter/metadata/``), each only when its value is known and non-empty (an empty
label is a missing label):

* ``node`` (configured node name) and ``comm``, as parca-agent always adds them;
* ``__meta_process_pid``, ``__meta_process_ppid``, ``__meta_process_cmdline`` (arguments joined
  by spaces), ``__meta_process_cgroup`` (main cgroup path), ``__meta_process_executable_name``;
* ``__meta_env_var_<NAME>`` for each captured variable (the declaration's, else the ``OTEL_*``
  ones of ``environ``; invalid UTF-8 replaced);
* ``__meta_system_kernel_release``/``_machine`` (``uname``) and ``__meta_agent_revision`` (the
  gpumetrics version);
* ``__meta_kubernetes_*`` from the profiler's own attributes (:data:`ATTRIBUTE_META`, and
  ``k8s.pod.label.<k>``/``k8s.pod.annotation.<k>``/``k8s.node.label.<k>``/
  ``k8s.node.annotation.<k>`` as ``..._label_<sanitised k>`` plus ``..._labelpresent_<k>="true"``),
  ``__meta_kubernetes_pod_container_id`` from ``container.id`` (in Kubernetes), and
  ``__meta_kubernetes_pod_container_image`` from ``container.image.name``;
* whatever the configured resolver returns for the pid (its labels win).

Not filled (we do not analyse ELF files or query container runtimes): ``__meta_process_executable_
{file_id,build_id,compiler,static,stripped}``, ``__meta_docker_*``, ``__meta_containerd_*``,
``__meta_lxc_*``, pod IP/phase/readiness/controller. Rules that read them see ``""``.

Output labels → resource attributes (:func:`labels_to_attributes`): ``__meta_*`` labels are
removed (as parca-agent does); ``node`` and ``comm`` are not emitted (``host.name``/
``k8s.node.name`` come from configuration, and ``comm`` is already the ``service.name`` fallback);
``namespace``/``pod``/``container`` (the names of parca-agent's shipped Kubernetes config) become
``k8s.namespace.name``/``k8s.pod.name``/``k8s.container.name`` (semantic conventions), so they
join with what the OpenTelemetry side calls them; every other label is kept under its own name as
a string attribute (a rule may target an OpenTelemetry key such as ``service.namespace``
directly, since label names are UTF-8).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpumetrics.identity.attrs import AttrValue
from gpumetrics.identity.procfs import ProcessInfo
from gpumetrics.identity.relabel import META_PREFIX

LABEL_ATTRIBUTES: Mapping[str, str] = {
    "namespace": "k8s.namespace.name",
    "pod": "k8s.pod.name",
    "container": "k8s.container.name",
}
"""Output label → attribute key for the labels of parca-agent's Kubernetes config."""

IMPLICIT_LABELS = frozenset({"node", "comm"})
"""Labels parca-agent always adds to the relabel input; never emitted as attributes."""

ATTRIBUTE_META: Mapping[str, str] = {
    "k8s.namespace.name": "__meta_kubernetes_namespace",
    "k8s.pod.name": "__meta_kubernetes_pod_name",
    "k8s.pod.uid": "__meta_kubernetes_pod_uid",
    "k8s.container.name": "__meta_kubernetes_pod_container_name",
    "k8s.node.name": "__meta_kubernetes_node_name",
    "container.image.name": "__meta_kubernetes_pod_container_image",
}
"""Profiler attribute → the parca-agent ``__meta_kubernetes_*`` label it fills."""

META_ATTRIBUTES: Mapping[str, str] = {
    meta: attr for attr, meta in ATTRIBUTE_META.items() if attr != "container.image.name"
}
"""Resolver ``__meta_kubernetes_*`` label → attribute (low-precedence metadata)."""

_PREFIX_META = (
    ("k8s.pod.label.", "__meta_kubernetes_pod_label_", "__meta_kubernetes_pod_labelpresent_"),
    (
        "k8s.pod.annotation.",
        "__meta_kubernetes_pod_annotation_",
        "__meta_kubernetes_pod_annotationpresent_",
    ),
    ("k8s.node.label.", "__meta_kubernetes_node_label_", "__meta_kubernetes_node_labelpresent_"),
    (
        "k8s.node.annotation.",
        "__meta_kubernetes_node_annotation_",
        "__meta_kubernetes_node_annotationpresent_",
    ),
)
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def sanitize_label_name(name: str) -> str:
    """Replace every character outside ``[a-zA-Z0-9_]`` by ``_``.

    Prometheus ``strutil.SanitizeLabelName``, used for Kubernetes label/annotation names.

    Examples:
        >>> sanitize_label_name("topology.kubernetes.io/zone")
        'topology_kubernetes_io_zone'

    """
    return _INVALID.sub("_", name)


def _profiler_meta(attrs: Mapping[str, AttrValue], in_kubernetes: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in attrs.items():
        if not isinstance(value, str) or not value:
            continue
        meta = ATTRIBUTE_META.get(key)
        if meta is not None:
            out[meta] = value
            continue
        for attr_prefix, value_prefix, present_prefix in _PREFIX_META:
            if key.startswith(attr_prefix) and len(key) > len(attr_prefix):
                name = sanitize_label_name(key[len(attr_prefix) :])
                out[value_prefix + name] = value
                out[present_prefix + name] = "true"
                break
    cid = attrs.get("container.id")
    if in_kubernetes and isinstance(cid, str) and cid:
        out["__meta_kubernetes_pod_container_id"] = cid
    return out


def process_labels(
    pid: int,
    info: ProcessInfo | None,
    environment: Mapping[str, bytes],
    profiler_attributes: Mapping[str, AttrValue],
    resolver_labels: Mapping[str, str],
    *,
    node_name: str,
    in_kubernetes: bool,
    system_labels: Mapping[str, str],
    container_id: str | None = None,
) -> dict[str, str]:
    """Build the relabel input labels of one process (see the module docstring)."""
    labels: dict[str, str] = {"__meta_process_pid": str(pid)}
    if node_name:
        labels["node"] = node_name
    if info is not None:
        if info.comm:
            labels["comm"] = info.comm
        if info.ppid is not None:
            labels["__meta_process_ppid"] = str(info.ppid)
        if info.cmdline:
            labels["__meta_process_cmdline"] = " ".join(info.cmdline)
        if info.cgroup_path:
            labels["__meta_process_cgroup"] = info.cgroup_path
        if info.exe_name:
            labels["__meta_process_executable_name"] = info.exe_name
    for name, raw in environment.items():
        value = raw.decode("utf-8", "replace")
        if value:
            labels[f"__meta_env_var_{name}"] = value
    labels.update(system_labels)
    prof = dict(profiler_attributes)
    if container_id and "container.id" not in prof:
        prof["container.id"] = container_id
    labels.update(_profiler_meta(prof, in_kubernetes))
    labels.update({k: v for k, v in resolver_labels.items() if v})
    return labels


def labels_to_attributes(labels: Mapping[str, str]) -> dict[str, str]:
    """Map relabel output labels to resource attributes (see the module docstring)."""
    out: dict[str, str] = {}
    for name, value in labels.items():
        if not name or not value or name.startswith(META_PREFIX) or name in IMPLICIT_LABELS:
            continue
        out[LABEL_ATTRIBUTES.get(name, name)] = value
    return out


def meta_to_attributes(labels: Mapping[str, str]) -> dict[str, str]:
    """Return the attributes a resolver's ``__meta_kubernetes_*`` labels imply."""
    return {META_ATTRIBUTES[k]: v for k, v in labels.items() if k in META_ATTRIBUTES and v}
