"""The two identity modes, the eBPF profiler's own per-process resource, and the observed keys.

``profiler`` (the default) makes a process's GPU resource equal its profile resource:

* declared by a profiler (with a ``profiler_resource``): that resource, attribute for attribute;
* not declared (yet): :func:`profiler_resource`, the keys the OpenTelemetry eBPF profiler puts
  on the same process's profiles by its own rules, so the resource does not change when the
  profiler declares it.

``enriched`` adds what the process says about itself (OTEP 4719 context,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``), a ``service.name`` fallback, relabel output
labels, ``process.owner``, ``process.creation.time`` and ``host.name``/``k8s.node.name``. Those
extra keys exist on no profile, so enriched resources do **not** join exactly with profiles.

The eBPF profiler's resource (``go.opentelemetry.io/ebpf-profiler`` v0.0.202633,
``reporter/internal/pdata/generate.go`` ``setResourceAttributes``; ``process/process.go``
``GetProcessMeta``, ``parseContainerID``, ``NewEnvVarsEnricher``):

* ``process.pid``: int;
* ``process.executable.path``: the target of ``/proc/<pid>/exe`` as ``readlink`` gives it, and
  ``process.executable.name``: what follows its last ``/`` (both absent when unreadable);
* ``container.id``: :func:`gpumetrics.identity.cgroup.container_id` (absent when none);
* ``process.environment_variable.<NAME>``: for each configured name (its ``-env-vars`` /
  ``include_env_vars``) present in ``/proc/<pid>/environ``, the value verbatim, except that
  bytes which are not UTF-8 become U+FFFD by :mod:`gpumetrics.identity.utf8`'s rule (the rule
  the Collector's exporter applies to what the profiler sends, so both sides stay equal);
* ``service.name`` only from its APM-agent integration, which the sidecar cannot see, so it is
  never computed here (a declaration carries it);
* the ``ResourceProfiles`` carry ``schema_url`` :data:`PROFILER_SCHEMA_URL` (``semconv.SchemaURL``
  of ``go.opentelemetry.io/otel/semconv/v1.37.0``, ``rp.SetSchemaUrl`` in ``generate.go``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence

from gpumetrics.identity.attrs import AttrValue
from gpumetrics.identity.procfs import ProcessInfo, ProcfsReader
from gpumetrics.identity.relabel_config import Action, RelabelConfig, RelabelConfigError
from gpumetrics.identity.utf8 import to_valid_utf8

__all__ = [
    "ENV_VAR_PREFIX",
    "MAX_INCLUDE_ENV_VARS",
    "OBSERVED_KEYS",
    "OBSERVED_PREFIXES",
    "PROFILER_SCHEMA_URL",
    "IdentityMode",
    "check_profiler_mode_rules",
    "is_observed_key",
    "process_observer",
    "profiler_resource",
    "validate_env_var_names",
]

ENV_VAR_PREFIX = "process.environment_variable."
"""Semconv ``process.environment_variable.<key>``: the profiler's key for a captured variable."""

PROFILER_SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"
"""The schema URL the eBPF profiler (v0.0.202633) gives each process's profile resource; the
schema URL of an undeclared process's resource in profiler mode (a declaration brings its own)."""

MAX_INCLUDE_ENV_VARS = 256
"""Most environment variable names that may be configured (as a declaration's ``environment``)."""

OBSERVED_KEYS = frozenset(
    {
        "process.pid",
        "process.executable.name",
        "process.executable.path",
        "process.owner",
        "process.creation.time",
    }
)
"""Keys only the sidecar's own observation or configuration (or a declaring profiler) may set;
every key under :data:`OBSERVED_PREFIXES` too (:func:`is_observed_key`)."""

OBSERVED_PREFIXES = ("host.", "k8s.", "container.", ENV_VAR_PREFIX)
"""Namespaces whose every key is observed: ``host.*`` (the node), ``k8s.*`` (what Kubernetes,
the kubelet's pod-resources API or a Collector's ``k8sattributes`` know: namespace, pod, uid,
container, deployment and other workload names, node, labels), ``container.*`` (what the
container runtime and the cgroup show: id, name, image) and the captured variables
``process.environment_variable.*`` (read from ``/proc/<pid>/environ``, not from what the process
says about them)."""


class IdentityMode(enum.StrEnum):
    """How per-process resources are built (``identity.mode``)."""

    PROFILER = "profiler"
    """The profiler's resource: equal, key for key, to the process's profile resource."""
    ENRICHED = "enriched"
    """The profiler's keys plus the process's own declarations and fallbacks (no exact join)."""


def is_observed_key(key: str) -> bool:
    """Whether ``key`` is observed or configured identity that a process cannot override.

    ``host.*``, ``k8s.*``, ``container.*``, ``process.pid``, ``process.executable.*``,
    ``process.owner``, ``process.creation.time`` and ``process.environment_variable.*``: a
    process naming itself after another host, pod, namespace, container or executable would
    move its GPU metrics there (issue 11 item 11 for ``host.*``/``container.id``, issue 23 item
    3 for ``k8s.*``: ``OTEL_RESOURCE_ATTRIBUTES=k8s.pod.name=victim-pod`` put a process's GPU
    usage on another pod).

    Examples:
        >>> is_observed_key("host.name"), is_observed_key("service.name")
        (True, False)
        >>> is_observed_key("k8s.pod.name"), is_observed_key("k8s.deployment.name")
        (True, True)

    """
    return key in OBSERVED_KEYS or key.startswith(OBSERVED_PREFIXES)


def profiler_resource(
    pid: int, info: ProcessInfo | None, invalid_env: list[str] | None = None
) -> dict[str, AttrValue]:
    """Return the resource the eBPF profiler gives ``pid``'s profiles (module docstring).

    Args:
        pid: host pid.
        info: what procfs shows for ``pid`` (read with the configured ``include_env_vars``), or
            None when it is not visible: then only ``process.pid``.
        invalid_env: receives the name of each configured variable whose value is not UTF-8
            (an OTLP string must be UTF-8: its invalid bytes are replaced,
            :func:`~gpumetrics.identity.utf8.to_valid_utf8`).

    Returns:
        ``process.pid`` (int), then ``container.id``, ``process.executable.path``/``.name`` and
        ``process.environment_variable.<NAME>`` where known (``str``).

    """
    res: dict[str, AttrValue] = {"process.pid": pid}
    if info is None:
        return res
    if info.container_id:
        res["container.id"] = info.container_id
    if info.exe_target:
        res["process.executable.path"] = info.exe_target
        res["process.executable.name"] = info.exe_target.rsplit("/", 1)[-1]
    for name, raw in (info.env_vars or {}).items():
        value, replaced = to_valid_utf8(raw)
        res[ENV_VAR_PREFIX + name] = value
        if replaced and invalid_env is not None:
            invalid_env.append(name)
    return res


def validate_env_var_names(names: Iterable[object]) -> tuple[str, ...]:
    """Return configured environment variable names, checked, in order, without duplicates.

    The profiler trims each name of its comma-separated ``-env-vars`` and drops empty ones; a
    list item here must already be a name: a non-empty string without ``=``, NUL or surrounding
    whitespace (no ``environ`` entry could match it otherwise).

    Raises:
        ValueError: ``[i]: reason`` for the first bad name, or too many names.

    Examples:
        >>> validate_env_var_names(["OTEL_SERVICE_NAME", "CUDA_VISIBLE_DEVICES"])
        ('OTEL_SERVICE_NAME', 'CUDA_VISIBLE_DEVICES')

    """
    out: dict[str, None] = {}
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise ValueError(f"[{i}]: must be a non-empty string, got {name!r}")
        if name != name.strip():
            raise ValueError(f"[{i}]: {name!r} has surrounding whitespace")
        if "=" in name or "\x00" in name:
            raise ValueError(f"[{i}]: {name!r} cannot contain '=' or NUL")
        out[name] = None
    if len(out) > MAX_INCLUDE_ENV_VARS:
        raise ValueError(f"{len(out)} names exceed the limit of {MAX_INCLUDE_ENV_VARS}")
    return tuple(out)


_WRITES_TARGET = frozenset({Action.REPLACE, Action.HASHMOD, Action.LOWERCASE, Action.UPPERCASE})
_TEMPORARY = "__"


def check_profiler_mode_rules(rules: Sequence[RelabelConfig]) -> None:
    """Refuse relabel rules that could only change a resource, in ``identity.mode: profiler``.

    In profiler mode relabeling only chooses which processes are reported (``keep``, ``drop``,
    ``keepequal``, ``dropequal``; ``labeldrop``/``labelkeep`` and rules writing a temporary
    ``__``-prefixed label may prepare them); no output label becomes an attribute, because an
    added or renamed key would make the GPU resource differ from the profile resource. A rule
    writing any other label (``replace``, ``hashmod``, ``lowercase``, ``uppercase`` with such a
    ``target_label``, ``labelmap`` with such a ``replacement``) is therefore refused rather than
    silently ignored.

    Raises:
        RelabelConfigError: ``relabel_configs[i].target_label`` (or ``.replacement``) naming the
            label and what to do instead.

    """
    for i, rule in enumerate(rules):
        if rule.action in _WRITES_TARGET:
            field, label = "target_label", rule.target_label
        elif rule.action is Action.LABELMAP:
            field, label = "replacement", rule.replacement
        else:
            continue
        if not label.startswith(_TEMPORARY):
            raise RelabelConfigError(
                f"relabel_configs[{i}].{field}: action {rule.action.value} writes label "
                f"{label!r}; identity.mode 'profiler' adds no label to a resource (it must equal "
                "the profile resource), so only keep/drop rules and temporary '__' labels are "
                "allowed; set identity.mode to 'enriched' to add labels"
            )


def process_observer(
    proc_root: str, host_pid_namespace: bool | None = None
) -> Callable[[int, Sequence[str]], dict[str, AttrValue]]:
    """Return ``observe(pid, env_var_names)``: :func:`profiler_resource` of ``pid`` read now.

    What the sidecar itself sees of a process, by the eBPF profiler's rules, with the variables
    ``env_var_names`` captured: the service layer compares the observed keys a declarer that is
    not trusted sends with it (``gpumetrics.service.declarers``). Each call reads procfs afresh.
    """
    base = ProcfsReader(proc_root, host_pid_namespace=host_pid_namespace)

    def observe(pid: int, env_var_names: Sequence[str]) -> dict[str, AttrValue]:
        reader = ProcfsReader(
            proc_root,
            host_pid_namespace=base.in_host_pid_namespace,  # detected (and logged) once
            resolve_user_names=False,
            include_env_vars=env_var_names,
        )
        return profiler_resource(pid, reader.read(pid))

    return observe
