"""The :class:`Producer`: a batch of columns, encoded into OTLP in bulk on each collection.

Collectors commit what a device's tick read (:meth:`Producer.commit`: device points as
per-metric columns, per-process points as :class:`~gpumetrics.metrics.columns.ProcessBlock`
tables) or, through the seed's API, record points into a :class:`MetricBuffer`
(``record_host`` / ``record_process``). Either way the producer holds one
:class:`~gpumetrics.metrics.columns.ResourceColumns` for the host and per-metric
:class:`~gpumetrics.metrics.columns.ProcessColumns` for the processes until the next
collection, which writes them as OTLP (:mod:`gpumetrics.metrics.bulk`): one ``Metric`` per
name per scope (never two same-named metrics, as polarsignals/gpu-metrics-agent's ``Produce``
in ``nvidia.go`` emits one per device), and one ``ResourceMetrics`` per process that recorded a
point since the previous call, so a process that stopped using the GPU gets no point in the
next collection.

The batcher takes a collection with :meth:`Producer.collect_parts`: resource by resource, each
a serialized request of its own, within a byte budget (``store.max_collection_bytes``): a
process whose resource does not fit what is left is left out and its points counted
(:class:`CollectionParts`); its ``ResourceMetrics`` is never written, so the collection's parts
never take more than the budget, however many processes NVML reports.

What never changes between collections is serialized once: metric headers, point attribute
entries, the host resource and scopes, and each process's resource, cached by the resourcer's
answer (its attributes, compared whole, and the schema URL), not by the pid alone, so a process
whose identity changes (a declaration arrives, a relabel rule changes) gets a new resource at
once. The cache holds only the resources of the last collection's kept processes, so with a
budget it never holds more than the budget.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from gpumetrics.metrics import bulk, names
from gpumetrics.metrics.attribution import DeviceAttribution
from gpumetrics.metrics.buffer import MetricBuffer, point_rules
from gpumetrics.metrics.columns import (
    MetricColumns,
    Points,
    ProcessColumns,
    ResourceColumns,
    check,
)
from gpumetrics.metrics.spec import MetricSpec, Scope, catalogue
from gpumetrics.wire import len_field, varint

if TYPE_CHECKING:  # selftelemetry builds on this package; importing it here would be circular
    from gpumetrics.selftelemetry import SelfTelemetry

T = TypeVar("T")

HEADS_MAX = 16_384
"""Distinct point attribute tuples whose serialized heads are kept between batches."""


class ProcessResourcer(Protocol):
    """Builds the OTLP resource of one process (implemented by ``gpumetrics.identity``).

    A resourcer may also have ``schema_url(pid) -> str``, the schema URL of the resource it last
    put for ``pid`` ("" for none; ``gpumetrics.identity``'s has): it becomes the per-process
    ``ResourceMetrics.schema_url``.
    """

    def put_resource(self, pid: int, attrs: dict[str, Any]) -> bool:
        """Add the resource attributes of ``pid`` to ``attrs``.

        Returns:
            False when a relabel rule dropped the process: its points are not reported.

        """


class Renderer(Protocol):
    """Anything that can append self-telemetry metrics to a repeated ``Metric`` field."""

    def render(self, metrics: Any) -> int:
        """Append metrics; return the number of data points written."""


@dataclass
class CollectionParts:
    """One collection, serialized resource by resource (what :meth:`Producer.collect_parts` makes).

    Attributes:
        parts: ``(data, points)``: each ``data`` a serialized ``ExportMetricsServiceRequest``
            holding one ``ResourceMetrics`` (the host resource first, when it has anything, then
            one per process in pid order) and its data points. The concatenation of the
            ``data`` is the collection as one serialized request.
        dropped_points: points of the processes left out for the byte budget.
        dropped_resources: processes left out for the byte budget.

    """

    parts: list[tuple[bytes, int]] = field(default_factory=list)
    dropped_points: int = 0
    dropped_resources: int = 0

    @property
    def size(self) -> int:
        """Serialized bytes of the collection (By)."""
        return sum(len(data) for data, _ in self.parts)

    @property
    def points(self) -> int:
        """Data points in the collection."""
        return sum(n for _, n in self.parts)


_ResourceKey = tuple[tuple[tuple[str, Any], ...], str]
"""What a process's cached resource bytes are keyed by: its attributes and its schema URL."""


class _Batch:
    """What was recorded since the last ``collect``."""

    __slots__ = ("host", "processes", "host_buffer", "process_buffers")

    def __init__(self) -> None:
        self.host = ResourceColumns()
        self.processes: dict[str, ProcessColumns] = {}
        self.host_buffer: MetricBuffer | None = None
        self.process_buffers: dict[int, MetricBuffer] = {}

    def process_columns(self, spec: MetricSpec) -> ProcessColumns:
        """Return the batch's per-process columns of ``spec``'s metric, created on first use."""
        pc = self.processes.get(spec.name)
        if pc is None:
            pc = self.processes[spec.name] = ProcessColumns(spec)
        return pc


class Producer:
    """The batch being built, as columns, and its conversion to OTLP.

    Args:
        specs: metric specs by name (default: the catalogue's GPU metrics).
        scope: the instrumentation scope of the GPU metrics (default ``parca.nvidia_gpu_metrics``
            with schema URL semconv 1.44.0).
        host_attributes: attributes of the host resource (e.g. ``host.name``, ``k8s.node.name``).
        disabled_metrics: metric names recorded but never emitted (configuration).
        telemetry: where dropped processes and refused points are counted (None: not counted).
        self_telemetry: rendered under scope ``gpumetrics.self`` on the host resource by
            :meth:`collect`, or None.

    ``commit`` and ``record_host``/``record_process`` run under the producer's lock; callbacks
    only append points (no NVML calls, no I/O).

    Raises:
        ValueError: ``disabled_metrics`` names a metric not in ``specs``.

    """

    def __init__(
        self,
        specs: Mapping[str, MetricSpec] | None = None,
        scope: Scope | None = None,
        host_attributes: Mapping[str, Any] | None = None,
        disabled_metrics: Collection[str] = (),
        telemetry: SelfTelemetry | None = None,
        self_telemetry: Renderer | None = None,
    ) -> None:
        cat = catalogue()
        self._specs = dict(specs if specs is not None else cat.metrics)
        unknown = set(disabled_metrics) - set(self._specs)
        if unknown:
            raise ValueError(f"disabled_metrics: unknown metric(s) {sorted(unknown)}")
        self._disabled = frozenset(disabled_metrics)
        self._scope = scope or cat.scope
        self._self_scope = cat.self_scope
        self._host_attributes = dict(host_attributes or {})
        self._telemetry = telemetry
        self._self_telemetry = self_telemetry
        self._lock = threading.Lock()
        self._rules = point_rules(self._specs)
        self._batch = _Batch()
        self._resourcer: ProcessResourcer | None = None
        self._attribution: DeviceAttribution | None = None
        # encoding state kept between batches (guarded by _encode_lock)
        self._encode_lock = threading.Lock()
        self._metric_heads = bulk.MetricHeads()
        self._point_heads = (bulk.PointHeads(False), bulk.PointHeads(True))
        self._resources: dict[int, tuple[_ResourceKey, bytes]] = {}
        self._host_resource: bytes | None = None
        self._scope_parts = bulk.scope_bytes(self._scope)
        self._self_scope_parts = bulk.scope_bytes(self._self_scope)

    def enabled(self, name: str) -> bool:
        """Tell whether metric ``name`` is in the catalogue and not disabled by configuration."""
        return name in self._specs and name not in self._disabled

    @property
    def specs(self) -> Mapping[str, MetricSpec]:
        """The metric specs this producer holds points of (name → spec)."""
        return self._specs

    def set_process_resourcer(self, resourcer: ProcessResourcer | None) -> None:
        """Use ``resourcer`` for process resources from the next ``collect`` (None: pid only)."""
        with self._lock:
            self._resourcer = resourcer

    def set_device_attribution(self, attribution: DeviceAttribution | None) -> None:
        """Give device points attributes from outside NVML (None: none); see ``attribution``.

        The collector reads :attr:`device_attribution` once per cycle and applies it when it
        builds each device's attributes (``gpumetrics.nvml``).
        """
        self._attribution = attribution

    @property
    def device_attribution(self) -> DeviceAttribution | None:
        """The :class:`~gpumetrics.metrics.attribution.DeviceAttribution` in use, or None."""
        return self._attribution

    # -- recording ------------------------------------------------------------------------------

    def commit(self, *tables: Points) -> tuple[int, int]:
        """Add device ticks' points to the batch, in order; return ``(added, refused)``.

        Each column and block is checked as a whole (``columns.check``'s rules, the rules of
        ``MetricBuffer.add``); points that break one are left out and counted in ``refused``,
        together with those their reader could not add (``Points.refused``). Per-process rows
        go to their process's resource; a pid that is not positive is refused.
        """
        refused = added = 0
        specs = self._specs
        with self._lock:
            host = self._batch.host
            for points in tables:
                refused += points.refused
                for name, mc in points.host.items():
                    if name not in specs:
                        refused += len(mc)
                        continue
                    refused += check(mc)
                    dst = host.get(name)
                    if dst is None:
                        host[name] = mc  # the tick's columns become the batch's
                    else:
                        dst.extend(mc)
                    added += len(mc)
                for block in points.blocks:
                    if block.spec.name not in specs:
                        refused += len(block)
                        continue
                    bad = block.refused()
                    if bad:
                        refused += len(bad)
                        block = block.without(bad)
                    added += self._batch.process_columns(block.spec).add_block(block)
        return added, refused

    def record_host(self, fn: Callable[[MetricBuffer], T]) -> T:
        """Run ``fn(host_buffer)`` under the lock and return its result (the seed's API).

        The buffer's points join the host resource's columns at the next ``collect``.
        """
        with self._lock:
            buf = self._batch.host_buffer
            if buf is None:
                buf = self._batch.host_buffer = MetricBuffer(self._specs, self._rules)
            return fn(buf)

    def record_process(self, pid: int, fn: Callable[[MetricBuffer], T]) -> T:
        """Run ``fn(buffer_of_pid)`` under the lock and return its result (the seed's API).

        Raises:
            ValueError: ``pid`` is not a positive int.

        """
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ValueError(f"pid: must be a positive int, got {pid!r}")
        with self._lock:
            buf = self._batch.process_buffers.get(pid)
            if buf is None:
                buf = self._batch.process_buffers[pid] = MetricBuffer(self._specs, self._rules)
            return fn(buf)

    # -- draining -------------------------------------------------------------------------------

    def _drain(self) -> tuple[_Batch, ProcessResourcer | None]:
        with self._lock:
            batch, self._batch = self._batch, _Batch()
            return batch, self._resourcer

    def _fold_buffers(self, batch: _Batch) -> None:
        """Move the seed-API buffers' points into the batch's columns, checked."""
        refused = 0
        if batch.host_buffer is not None:
            refused += _fold(batch.host_buffer, batch.host)
        touched = set()
        for pid, buf in batch.process_buffers.items():
            for spec, pts in buf.items():
                pc = batch.process_columns(spec)
                touched.add(spec.name)
                for p in pts:
                    v, t, a, st = p.value, p.time_unix_nano, p.attributes, p.start_time_unix_nano
                    if not pc.add(pid, v, t, a, st):
                        refused += 1
        for name in touched:
            refused += batch.processes[name].check()
        if refused and self._telemetry is not None:
            self._telemetry.add("gpumetrics.values.dropped", refused, {"reason": "invalid_point"})

    def _encode_metrics(self, rc: ResourceColumns) -> list[list[bytes]]:
        disabled = self._disabled
        return [
            bulk.metric_pieces(mc, self._metric_heads, self._point_heads)
            for name, mc in rc.items()
            if len(mc) and name not in disabled
        ]

    def _encode(
        self, budget: int, with_self: bool = True
    ) -> tuple[CollectionParts, list[list[bytes]]]:
        """Drain the batch into one part per resource, within ``budget`` bytes (0: no limit).

        Returns:
            ``(parts, host GPU metrics)``: the collection (the host resource first, carrying the
            GPU metrics scope and, when configured, the ``gpumetrics.self`` scope, left out when
            it has nothing to carry; then one resource per process, by pid, while they fit) and
            the host's GPU ``Metric`` messages (as pieces).

        """
        batch, resourcer = self._drain()
        with self._encode_lock:
            self._fold_buffers(batch)
            for heads in self._point_heads:
                if len(heads) > HEADS_MAX:
                    heads.clear()
            disabled = self._disabled
            host = self._encode_metrics(batch.host)
            n = sum(len(mc) for name, mc in batch.host.items() if name not in disabled)
            metrics = bulk.encode_process_metrics(
                (pc for name, pc in batch.processes.items() if name not in disabled),
                self._metric_heads,
                self._point_heads,
            )
            del batch
            first = self._host_resource_metrics(host, with_self)
            if first is not None:
                n += first[1]
            pids, resources, keys = self._process_resources(metrics, resourcer)
            parts, dropped = bulk.frame_resources(
                first[0] if first else None,
                n,
                pids,
                resources,
                self._scope_parts,
                metrics,
                budget,
            )
            del metrics
            out = CollectionParts(parts)
            if dropped:
                out.dropped_resources = len(dropped)
                out.dropped_points = sum(points for _, points in dropped)
                for pid, _ in dropped:  # the cache keeps what the budget kept, no more
                    del keys[pid]
            self._resources = keys  # a process without points this batch: its resource is forgotten
            return out, host

    def _host_resource_metrics(
        self, host: list[list[bytes]], with_self: bool
    ) -> tuple[list[bytes], int] | None:
        """Return the host's ``resource_metrics`` field (its pieces) and self-telemetry points.

        None when the host resource has nothing to carry.
        """
        scopes: list[list[bytes]] = []
        n_self = 0
        if host:
            scopes.append(bulk.scope_pieces(self._scope_parts, host))
        if with_self and self._self_telemetry is not None:
            tmp = metrics_pb2.ScopeMetrics()
            n_self = self._self_telemetry.render(tmp.metrics)
            if n_self:
                rendered = [[m.SerializeToString()] for m in tmp.metrics]
                scopes.append(bulk.scope_pieces(self._self_scope_parts, rendered))
        if not scopes:
            return None
        if self._host_resource is None:
            self._host_resource = bulk.resource_bytes(self._host_attributes.items())
        pieces = [self._host_resource]
        for scope in scopes:
            pieces.append(b"\x12" + varint(sum(map(len, scope))))
            pieces.extend(scope)
        return [b"\x0a" + varint(sum(map(len, pieces))), *pieces], n_self

    def _process_resources(
        self, metrics: list[bulk.ProcessMetric], resourcer: ProcessResourcer | None
    ) -> tuple[list[int], list[bytes], dict[int, tuple[_ResourceKey, bytes]]]:
        """Return the pids with points (relabel-dropped ones counted, left out), and resources.

        A resource (with the ``ResourceMetrics.schema_url`` the resourcer gives the pid, when it
        has ``schema_url``) is serialized once and kept while its process has points, rebuilt
        only when the resourcer's answer for the pid changes. Also returns the entries to keep.
        """
        pids: list[int] = []
        resources: list[bytes] = []
        cached = self._resources
        kept: dict[int, tuple[_ResourceKey, bytes]] = {}
        schema_url = getattr(resourcer, "schema_url", None)
        for pid in sorted({run[0] for m in metrics for run in m[3]}):
            attrs: dict[str, Any] = {names.AttrProcessPID: pid}
            if resourcer is not None and not resourcer.put_resource(pid, attrs):
                if self._telemetry is not None:
                    self._telemetry.add("gpumetrics.processes.dropped_by_relabel")
                continue
            attrs[names.AttrProcessPID] = pid  # always the int pid, whatever the resourcer did
            url = schema_url(pid) if schema_url is not None else ""  # docs/identity.md
            key = (tuple(attrs.items()), url)
            hit = cached.get(pid)
            if hit is None or hit[0] != key:  # what the resourcer says about pid changed
                data = bulk.resource_bytes(key[0])
                if url:  # ResourceMetrics.schema_url (field 3); fields may come in any order
                    data += len_field(3, url.encode())
                hit = (key, data)
            kept[pid] = hit
            pids.append(pid)
            resources.append(hit[1])
        return pids, resources, kept

    def produce(self, host_metrics: Any, resources: Any) -> int:
        """Drain everything recorded since the last call into OTLP messages (the seed's API).

        Args:
            host_metrics: the repeated ``Metric`` field of the host resource's GPU-metrics
                ``ScopeMetrics``; one ``Metric`` per name is appended.
            resources: a repeated ``ResourceMetrics`` field; one entry is appended per process
                with points (resource from the resourcer, or only ``process.pid`` without one).

        Returns:
            The number of data points written.

        """
        collection, host = self._encode(0, with_self=False)
        for pieces in host:
            host_metrics.add().ParseFromString(b"".join(pieces))
        n = 0
        for i, (data, points) in enumerate(collection.parts):
            n += points
            if i == 0 and host:
                continue  # the host's resource: its metrics are in host_metrics
            request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(data)
            resources.extend(request.resource_metrics)
        return n

    def collect_parts(self, max_bytes: int = 0) -> CollectionParts:
        """Produce one collection within ``max_bytes``, serialized resource by resource.

        The content of :meth:`collect`, as :class:`CollectionParts`: the host resource is
        always kept; then processes in pid order, each kept when its part fits what is left of
        ``max_bytes`` and left out otherwise (its points counted in
        ``CollectionParts.dropped_points``; a later, smaller process may still fit). A process
        left out is never written: its size is known from its columns before its bytes are.
        What the batcher stores (``BatchStore.append_parts``). Empty parts when nothing was
        recorded.

        Args:
            max_bytes: the most serialized bytes of the whole collection (By); 0 = no limit.

        Raises:
            ValueError: ``max_bytes`` is negative.
            EncodingError: naming the metric or attribute that cannot be encoded.

        """
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes: must be an int >= 0, got {max_bytes!r}")
        collection, _ = self._encode(max_bytes)
        return collection

    def collect_serialized(self) -> tuple[bytes, int]:
        """Produce one complete serialized ``ExportMetricsServiceRequest`` and its point count.

        Raises:
            EncodingError: naming the metric or attribute that cannot be encoded.

        """
        collection, _ = self._encode(0)
        return b"".join(data for data, _ in collection.parts), collection.points

    def collect(self) -> metrics_service_pb2.ExportMetricsServiceRequest:
        """Produce one complete ``ExportMetricsServiceRequest``.

        The host resource (``host_attributes``) carries the GPU metrics scope and, when
        configured, the ``gpumetrics.self`` scope; then one resource per process. The host
        resource is left out when it has nothing to carry. The content of
        :meth:`collect_parts` without a budget, as one protobuf message.
        """
        data, _ = self.collect_serialized()
        return metrics_service_pb2.ExportMetricsServiceRequest.FromString(data)


def _fold(buf: MetricBuffer, rc: ResourceColumns) -> int:
    """Append ``buf``'s points to ``rc`` (checked); return how many were refused."""
    refused = 0
    for spec, pts in buf.items():
        tmp = MetricColumns(spec)
        for p in pts:
            if not tmp.add(p.value, p.time_unix_nano, p.attributes, p.start_time_unix_nano):
                refused += 1
        refused += check(tmp)
        rc.columns(spec).extend(tmp)
    return refused
