"""``ProcessResourcer``: the one code path that turns a pid into its OTLP resource attributes.

Two modes (:class:`~gpumetrics.identity.modes.IdentityMode`, ``docs/identity.md``):

``profiler`` (default): the resource equals the process's profile resource.

* Declared with a ``profiler_resource``: exactly those attributes (keys, value types, values),
  except that ``process.pid`` is always the int pid (as the profiler itself sets it, and as the
  Producer enforces for every per-process resource).
* Otherwise: :func:`~gpumetrics.identity.modes.profiler_resource`, the keys the eBPF profiler
  computes for the same process (``process.pid``, ``process.executable.*``, ``container.id``,
  ``process.environment_variable.<NAME>`` for the configured names).
* Relabel rules only drop processes (:func:`~gpumetrics.identity.modes.check_profiler_mode_rules`).

``enriched``: the profiler mode's keys plus more, lowest tier first (a later tier overwrites):

1. relabel output labels (only with ``relabel_configs``; :mod:`gpumetrics.identity.labels`);
2. what the process says about itself: ``OTEL_RESOURCE_ATTRIBUTES``, then ``OTEL_SERVICE_NAME``
   (strict, :mod:`.envparse`), then its OTEP 4719 context resource (declared, else read from the
   ``OTEL_CTX`` mapping). Tiers 1–2 may not set an observed key
   (:func:`~gpumetrics.identity.modes.is_observed_key`: ``host.*``, ``k8s.*``,
   ``container.*``, ``process.pid``, ``process.executable.*``, ``process.owner``,
   ``process.creation.time``, ``process.environment_variable.*``): such keys are removed,
   whatever the sidecar itself knows;
3. what the sidecar observes or is configured with: ``k8s.node.name`` (in Kubernetes) and
   ``host.name``; the ``k8s.*`` a resolver's ``__meta_kubernetes_*`` labels imply;
   ``process.owner``; ``process.creation.time``; the profiler mode's undeclared resource;
4. the declaring profiler's attributes, verbatim (an authenticated peer: the only one that may
   set observed keys);
5. always ``process.pid`` (int); and if no tier gave ``service.name``: ``comm``, then the
   executable basename (parca-agent PR #3230). No ``unknown_service`` is invented.

Tier 2 is the eBPF profiler PR #1343's order (context over environment). A declared field that
is empty falls back to our own read of the same thing (procfs ``environ``, the ``OTEL_CTX``
mapping).

Every resource, in both modes, is then cut to the resource limits (:mod:`.resource_limits`: the
OpenTelemetry SDK's attribute value length and count limits, and a byte limit), since it is
copied into every batch; what is cut is counted in ``gpumetrics.identity.attributes.limited``
and logged once per reason.

Results are cached per pid and reused while the live start time, the declaration object and the
process context's publication timestamp are unchanged and the entry is younger than
``procfs_ttl_ns`` (``exec`` keeps pid and start time but changes ``comm``/``exe``); a cache hit
costs one ``stat`` read (plus a 32-byte header read for undeclared processes in enriched mode).
The cache holds at most ``cache_size`` processes and ``cache_max_bytes`` of resources (each
entry charged its estimated memory, :func:`~gpumetrics.identity.footprint.deep_size`), least
recently used first out.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import gpumetrics
from gpumetrics.identity.attrs import AttrValue
from gpumetrics.identity.declaration import Declared
from gpumetrics.identity.declared import DeclaredStore
from gpumetrics.identity.envparse import SERVICE_NAME, env_resource
from gpumetrics.identity.footprint import ALLOCATOR_FACTOR, deep_size
from gpumetrics.identity.labels import labels_to_attributes, meta_to_attributes, process_labels
from gpumetrics.identity.limits import DEFAULT_RESOURCE_CACHE_MAX_BYTES
from gpumetrics.identity.modes import (
    PROFILER_SCHEMA_URL,
    IdentityMode,
    check_profiler_mode_rules,
    is_observed_key,
    profiler_resource,
)
from gpumetrics.identity.processctx import ProcessContext, ProcessContextReader
from gpumetrics.identity.procfs import ProcfsReader
from gpumetrics.identity.relabel import relabel
from gpumetrics.identity.relabel_config import RelabelConfig, parse_relabel_configs
from gpumetrics.identity.resource_limits import ResourceLimits, limit_resource
from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry

log = logging.getLogger(__name__)

NOT_UTF8_WARN_INTERVAL_NS = 60_000_000_000
"""Least time between two WARNINGs about processes whose variables are not UTF-8 (monotonic
ns); the processes in between are logged at DEBUG."""

LIMITED = "gpumetrics.identity.attributes.limited"
"""Self-telemetry counter of attributes truncated or discarded by the resource limits."""

_LIMIT_SETTINGS = {
    "value_length": ("truncated", "attribute_value_length_limit"),
    "count": ("discarded", "attribute_count_limit"),
    "max_bytes": ("discarded", "max_bytes"),
    "unencodable": ("discarded (OTLP cannot encode its value)", ""),
}


class LabelResolver(Protocol):
    """Extra relabel input labels for a host pid; the seed's ``LabelResolver``.

    E.g. ``__meta_kubernetes_*`` labels from a kubelet or container-runtime client.
    """

    def labels_for_pid(self, pid: int) -> Mapping[str, str]:
        """Return labels for ``pid`` ({} when unknown)."""


def iso8601_ns(ns: int) -> str:
    """Format ns since the Unix epoch as ISO 8601 UTC with milliseconds (semconv example form).

    Examples:
        >>> iso8601_ns(1_700_560_734_853_000_000)
        '2023-11-21T09:58:54.853Z'

    """
    dt = datetime.datetime.fromtimestamp(ns // 1_000_000_000, tz=datetime.UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{ns % 1_000_000_000 // 1_000_000:03d}Z"


@dataclass(slots=True)
class _Cached:
    start: int | None
    declared: Declared | None
    ctx_ts: int | None
    computed_at_ns: int
    resource: dict[str, AttrValue] | None  # None: dropped by a relabel rule
    size: int  # estimated memory (By), charged to the cache's byte budget
    schema_url: str
    not_utf8: bool  # a configured variable's value was not UTF-8 (counted and logged)


class ProcessResourcer:
    """Computes per-process resource attributes (see the module docstring for both modes).

    Args:
        procfs: reads ``/proc/<pid>`` (and decides whether host pids may be read there); its
            ``include_env_vars`` are the captured ``process.environment_variable.*`` names.
        declared: the profiler's declarations, or None (procfs and ``OTEL_CTX`` only).
        context_reader: reads ``OTEL_CTX`` mappings (enriched mode), or None to never read them.
        relabel_configs: validated rules; empty = no relabeling (no process is dropped).
        mode: ``profiler`` (default) or ``enriched``.
        resolver: extra labels per pid, or None.
        node_name: the node (``k8s.node.name`` in Kubernetes; parca's ``node`` label).
        in_kubernetes: whether the node name is a Kubernetes node name.
        host_name: ``host.name``; defaults to ``node_name`` outside Kubernetes.
        procfs_ttl_ns: how long procfs-derived values are reused (monotonic ns).
        cache_size: processes cached (least recently used evicted).
        cache_max_bytes: estimated memory (By) of the cached resources; beyond it the least
            recently used are evicted.
        clock: monotonic ns clock.
        empty_service_name_is_set: see :func:`gpumetrics.identity.envparse.env_resource`.
        limits: the bounds every resource is cut to (:class:`ResourceLimits`).
        telemetry: counts ``gpumetrics.identity.attributes.limited{reason}``.

    Thread-safe; procfs is read outside the lock.

    Raises:
        gpumetrics.identity.relabel_config.RelabelConfigError: in profiler mode, a rule that
            writes a label (:func:`~gpumetrics.identity.modes.check_profiler_mode_rules`).

    """

    def __init__(
        self,
        *,
        procfs: ProcfsReader,
        declared: DeclaredStore | None = None,
        context_reader: ProcessContextReader | None = None,
        relabel_configs: Sequence[RelabelConfig] = (),
        resolver: LabelResolver | None = None,
        node_name: str = "",
        in_kubernetes: bool = False,
        host_name: str | None = None,
        procfs_ttl_ns: int = 60_000_000_000,
        cache_size: int = 131072,
        cache_max_bytes: int = DEFAULT_RESOURCE_CACHE_MAX_BYTES,
        clock: Callable[[], int] = time.monotonic_ns,
        empty_service_name_is_set: bool = False,
        mode: IdentityMode | str = IdentityMode.PROFILER,
        limits: ResourceLimits | None = None,
        telemetry: SelfTelemetry = NO_TELEMETRY,
    ) -> None:
        self._mode = IdentityMode(mode)
        if self._mode is IdentityMode.PROFILER:
            check_profiler_mode_rules(relabel_configs)
        self._procfs = procfs
        self._declared = declared
        self._ctx = context_reader
        self._rules = tuple(relabel_configs)
        self._resolver = resolver
        self._node = node_name
        self._in_k8s = in_kubernetes
        self._host = host_name if host_name is not None else (None if in_kubernetes else node_name)
        self._ttl = procfs_ttl_ns
        self._cache_size = cache_size
        self._cache_max_bytes = cache_max_bytes
        self._cache_bytes = 0
        self._limits = limits or ResourceLimits()
        self._telemetry = telemetry
        self._clock = clock
        self._empty_sn = empty_service_name_is_set
        uname = os.uname()
        self._system = {
            "__meta_system_kernel_release": uname.release,
            "__meta_system_kernel_machine": uname.machine,
            "__meta_agent_revision": gpumetrics.__version__,
        }
        self._cache: OrderedDict[int, _Cached] = OrderedDict()
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._not_utf8_warned_ns: int | None = None
        self._not_utf8_suppressed = 0
        self._n = dict.fromkeys(
            (
                "cache_hits",
                "cache_misses",
                "dropped",
                "env_discarded",
                "env_var_not_utf8",
                "resolver_errors",
                "attributes_truncated",
                "attributes_discarded",
            ),
            0,
        )

    @property
    def mode(self) -> IdentityMode:
        """The identity mode resources are built in."""
        return self._mode

    def stats(self) -> dict[str, int]:
        """Return the counters.

        ``cache_hits``, ``cache_misses``, ``dropped`` (by relabeling), ``env_discarded``
        (malformed ``OTEL_*`` variables, enriched mode), ``env_var_not_utf8`` (processes with a
        configured variable whose value is not UTF-8, counted once per process: its invalid
        bytes are replaced, :mod:`gpumetrics.identity.utf8`), ``resolver_errors``,
        ``attributes_truncated`` / ``attributes_discarded`` (by the resource limits, each time a
        resource was built), ``cached`` (processes), ``cached_bytes`` (their estimated memory).
        """
        with self._lock:
            return {**self._n, "cached": len(self._cache), "cached_bytes": self._cache_bytes}

    def put_resource(self, pid: int, attrs: dict[str, Any]) -> bool:
        """Add the resource attributes of ``pid`` to ``attrs``.

        Values are shared with the cache (lists/dicts included): do not mutate them.

        Returns:
            False when a relabel rule dropped the process (``attrs`` is left unchanged): its
            points must not be reported.

        """
        resource = self._resolve(pid)
        if resource is None:
            return False
        attrs.update(resource)
        return True

    def schema_url(self, pid: int) -> str:
        """Return the schema URL of the resource last built for ``pid`` ("" when none).

        Profiler mode: a declaration's ``profiler_resource_schema_url`` (verbatim, "" when it
        declared none) when it declared a ``profiler_resource``, else
        :data:`~gpumetrics.identity.modes.PROFILER_SCHEMA_URL` (the eBPF profiler's, so it does
        not change when the profiler declares the process). Enriched mode: "" (its attributes
        come from several sources, under no one schema). Reads no procfs: call it after
        :meth:`put_resource` for the same pid.
        """
        with self._lock:
            hit = self._cache.get(pid)
            return hit.schema_url if hit is not None else ""

    def resource(self, pid: int) -> dict[str, AttrValue] | None:
        """Return a copy of the resource attributes of ``pid``, or None when dropped."""
        resource = self._resolve(pid)
        return None if resource is None else dict(resource)

    def _resolve(self, pid: int) -> dict[str, AttrValue] | None:
        live = self._procfs.start_time_ticks(pid)
        declared = self._declared.get(pid, live)[0] if self._declared is not None else None
        start = live
        if start is None and declared is not None and declared.start_time_ticks:
            start = declared.start_time_ticks
        ctx = self._read_context(pid, live, declared)
        ctx_ts = ctx.published_at_ns if ctx is not None else None
        now = self._clock()
        with self._lock:
            hit = self._cache.get(pid)
            if (
                hit is not None
                and hit.start == start
                and hit.declared is declared
                and hit.ctx_ts == ctx_ts
                and now - hit.computed_at_ns < self._ttl
            ):
                self._cache.move_to_end(pid)
                self._n["cache_hits"] += 1
                if hit.resource is None:
                    self._n["dropped"] += 1
                return hit.resource
            self._n["cache_misses"] += 1
        not_utf8: list[str] = []
        resource = self._compute(pid, live, start, declared, ctx, not_utf8)
        schema_url = self._schema_url(declared)
        size = 0
        if resource is not None:
            resource = self._limit(pid, resource)
            size = int(deep_size(resource) * ALLOCATOR_FACTOR)
        with self._lock:
            if resource is None:
                self._n["dropped"] += 1
            old = self._cache.pop(pid, None)
            if old is not None:
                self._cache_bytes -= old.size
            # once per process: a recomputation for the same process was counted already
            first = bool(not_utf8) and not (old is not None and old.start == start and old.not_utf8)
            if first:
                self._n["env_var_not_utf8"] += 1
            self._cache[pid] = _Cached(
                start, declared, ctx_ts, now, resource, size, schema_url, bool(not_utf8)
            )
            self._cache_bytes += size
            while len(self._cache) > 1 and (
                len(self._cache) > self._cache_size or self._cache_bytes > self._cache_max_bytes
            ):
                self._cache_bytes -= self._cache.popitem(last=False)[1].size
        if first:
            self._warn_not_utf8(pid, not_utf8, now)
        return resource

    def _schema_url(self, declared: Declared | None) -> str:
        if self._mode is IdentityMode.ENRICHED:
            return ""
        if declared is not None and declared.profiler_attributes:
            return declared.schema_url
        return PROFILER_SCHEMA_URL

    def _limit(self, pid: int, resource: dict[str, AttrValue]) -> dict[str, AttrValue]:
        """``resource`` cut to the resource limits; what was cut counted and logged once."""
        limited = limit_resource(resource, self._limits)
        if not limited.cut:
            return resource
        by_reason: dict[str, int] = {}
        for _, reason in limited.cut:
            by_reason[reason] = by_reason.get(reason, 0) + 1
        with self._lock:
            truncated = by_reason.get("value_length", 0)
            self._n["attributes_truncated"] += truncated
            self._n["attributes_discarded"] += len(limited.cut) - truncated
        for reason, n in by_reason.items():
            self._telemetry.add(LIMITED, n, {"reason": reason})
            key = next(k for k, r in limited.cut if r == reason)
            what, setting = _LIMIT_SETTINGS[reason]
            where = f" (identity.resource_limits.{setting})" if setting else ""
            self._warn_once(
                f"limit:{reason}",
                "pid %d: %d resource attribute(s) %s%s, first %r; counted in %s, logged once",
                pid,
                n,
                what,
                where,
                key[:80],
                LIMITED,
            )
        return limited.attributes

    def _read_context(
        self, pid: int, live: int | None, declared: Declared | None
    ) -> ProcessContext | None:
        if self._ctx is None or live is None or self._mode is IdentityMode.PROFILER:
            return None
        if declared is not None and declared.has_process_context:
            return None
        return self._ctx.read(pid, live).context

    def _warn_once(self, kind: str, message: str, *args: object) -> None:
        with self._lock:
            first = kind not in self._warned
            self._warned.add(kind)
        log.log(logging.WARNING if first else logging.DEBUG, message, *args)

    def _warn_not_utf8(self, pid: int, names: list[str], now: int) -> None:
        """Log a process whose variables are not UTF-8.

        At WARNING at most once per :data:`NOT_UTF8_WARN_INTERVAL_NS` (naming how many were
        logged at DEBUG meanwhile), else at DEBUG.
        """
        with self._lock:
            last = self._not_utf8_warned_ns
            warn = last is None or now - last >= NOT_UTF8_WARN_INTERVAL_NS
            if warn:
                self._not_utf8_warned_ns, suppressed = now, self._not_utf8_suppressed
                self._not_utf8_suppressed = 0
            else:
                self._not_utf8_suppressed += 1
        message = (
            "pid %d: %s not UTF-8; each run of invalid bytes is replaced by U+FFFD on the "
            "resource, as the profiles exporter declares it (docs/identity.md)"
        )
        names_text = ", ".join(sorted(names)) + (" is" if len(names) == 1 else " are")
        if warn:
            more = f" ({suppressed} more process(es) since the last warning)" if suppressed else ""
            log.warning(message + more, pid, names_text)
        else:
            log.debug(message, pid, names_text)

    def _resolver_labels(self, pid: int) -> Mapping[str, str]:
        if self._resolver is None:
            return {}
        try:
            return self._resolver.labels_for_pid(pid)
        except Exception as exc:  # noqa: BLE001 - a resolver failure must not stop metrics
            with self._lock:
                self._n["resolver_errors"] += 1
            self._warn_once("resolver", "label resolver failed for pid %d: %s", pid, exc)
            return {}

    def _compute(
        self,
        pid: int,
        live: int | None,
        start: int | None,
        declared: Declared | None,
        ctx: ProcessContext | None,
        not_utf8: list[str],
    ) -> dict[str, AttrValue] | None:
        profiler = declared.profiler_attributes if declared is not None else {}
        enriched = self._mode is IdentityMode.ENRICHED
        # profiler mode reads procfs only for its own rules or relabel input
        needs_procfs = enriched or bool(self._rules) or not profiler
        info = self._procfs.read(pid) if live is not None and needs_procfs else None
        environ: Mapping[str, bytes] = {}
        if declared is not None and declared.environment:
            environ = declared.environment
        elif info is not None and info.environ:
            environ = info.environ
        resolved = self._resolver_labels(pid) if enriched or self._rules else {}

        relabeled: dict[str, str] = {}
        if self._rules:
            labels = process_labels(
                pid,
                info,
                environ,
                profiler,
                resolved,
                node_name=self._node,
                in_kubernetes=self._in_k8s,
                system_labels=self._system,
                container_id=info.container_id if info is not None else None,
            )
            out = relabel(labels, self._rules)
            if out is None:
                return None
            relabeled = labels_to_attributes(out)

        if not enriched:
            if profiler:
                # the profile's resource, attribute for attribute; process.pid is the key the
                # producer always sets to the int pid (the eBPF profiler's own value)
                return {**profiler, "process.pid": pid}
            return profiler_resource(pid, info, not_utf8)

        env = env_resource(environ, empty_service_name_is_set=self._empty_sn)
        if env.errors:
            with self._lock:
                self._n["env_discarded"] += len(env.errors)
            for err in env.errors:
                self._warn_once(err.split(":", 1)[0], "pid %d: discarded %s", pid, err)
        if declared is not None and declared.has_process_context:
            ctx_resource: Mapping[str, AttrValue] = declared.context_resource
        else:
            ctx_resource = ctx.resource if ctx is not None else {}

        said: dict[str, AttrValue] = {**relabeled, **env.attributes, **ctx_resource}
        res = {k: v for k, v in said.items() if not is_observed_key(k)}
        if self._in_k8s and self._node:
            res["k8s.node.name"] = self._node
        if self._host:
            res["host.name"] = self._host
        res.update(meta_to_attributes(resolved))
        if info is not None and info.owner:
            res["process.owner"] = info.owner
        if start is not None:
            created = self._procfs.creation_time_ns(start)
            if created is not None:
                res["process.creation.time"] = iso8601_ns(created)
        res.update(profiler_resource(pid, info, not_utf8))
        res.update(profiler)
        res["process.pid"] = pid
        if SERVICE_NAME not in res:
            exe_name = res.get("process.executable.name")
            if info is not None and info.comm:
                res[SERVICE_NAME] = info.comm
            elif isinstance(exe_name, str) and exe_name:
                res[SERVICE_NAME] = exe_name
        return res


def new_process_resourcer(
    resolver: LabelResolver | None,
    declared: DeclaredStore | None,
    node_name: str,
    in_kubernetes: bool,
    relabel_configs: Sequence[RelabelConfig] | Sequence[Mapping[str, Any]] | None = None,
    *,
    proc_root: str = "/proc",
    host_pid_namespace: bool | None = None,
    host_name: str | None = None,
    read_process_context: bool = True,
    procfs: ProcfsReader | None = None,
    context_reader: ProcessContextReader | None = None,
    mode: IdentityMode | str = IdentityMode.PROFILER,
    include_env_vars: Sequence[str] = (),
    **options: Any,
) -> ProcessResourcer:
    """Build a :class:`ProcessResourcer` (the seed's ``NewProcessResourcer``).

    Args:
        resolver: extra labels per pid, or None.
        declared: the declared store, or None (procfs and ``OTEL_CTX`` only).
        node_name: node name (``k8s.node.name`` in Kubernetes, else the default ``host.name``).
        in_kubernetes: whether ``node_name`` is a Kubernetes node.
        relabel_configs: validated :class:`RelabelConfig` rules, or raw rule mappings (parsed
            here), or None.
        proc_root: procfs root (e.g. ``/host/proc``).
        host_pid_namespace: whether ``proc_root`` shows host pids (None: detect; F15).
        host_name: ``host.name`` override.
        read_process_context: read ``OTEL_CTX`` mappings of undeclared processes (enriched
            mode only; profiler mode never reads them).
        procfs: a prepared reader (overrides ``proc_root``/``host_pid_namespace``/
            ``include_env_vars``).
        context_reader: a prepared ``OTEL_CTX`` reader.
        mode: ``profiler`` (default) or ``enriched`` (:class:`IdentityMode`).
        include_env_vars: variable names reported as ``process.environment_variable.<NAME>``
            (the profiler's ``include_env_vars``), for the reader built here.
        **options: passed to :class:`ProcessResourcer` (``procfs_ttl_ns``, ``cache_size``,
            ``clock``, ``empty_service_name_is_set``).

    Raises:
        gpumetrics.identity.relabel_config.RelabelConfigError: an invalid raw rule, or in
            profiler mode a rule that writes a label.
        ValueError: ``mode`` is not an identity mode.

    """
    rules: tuple[RelabelConfig, ...] = ()
    if relabel_configs:
        items = list(relabel_configs)
        rules = (
            tuple(items)  # type: ignore[arg-type]
            if all(isinstance(r, RelabelConfig) for r in items)
            else parse_relabel_configs(items)
        )
    mode = IdentityMode(mode)
    reader = procfs or ProcfsReader(
        proc_root, host_pid_namespace=host_pid_namespace, include_env_vars=include_env_vars
    )
    if context_reader is None and read_process_context and mode is IdentityMode.ENRICHED:
        context_reader = ProcessContextReader(reader.proc_root)
    return ProcessResourcer(
        procfs=reader,
        declared=declared,
        context_reader=context_reader,
        relabel_configs=rules,
        resolver=resolver,
        node_name=node_name,
        in_kubernetes=in_kubernetes,
        host_name=host_name,
        mode=mode,
        **options,
    )
