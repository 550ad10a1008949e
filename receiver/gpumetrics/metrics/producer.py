"""The :class:`Producer`: a batch of columns, encoded into OTLP in bulk on each ``collect``.

Collectors commit what a device's tick read (:meth:`Producer.commit`: device points as
per-metric columns, per-process points as :class:`~gpumetrics.metrics.columns.ProcessBlock`
tables) or, through the seed's API, record points into a :class:`MetricBuffer`
(``record_host`` / ``record_process``). Either way the producer holds one
:class:`~gpumetrics.metrics.columns.ResourceColumns` for the host and one per process until the
next ``collect``, which writes them as one ``ExportMetricsServiceRequest``
(:mod:`gpumetrics.metrics.bulk`): one ``Metric`` per name per scope (never two same-named
metrics, as polarsignals/gpu-metrics-agent's ``Produce`` in ``nvidia.go`` emits one per
device), and one ``ResourceMetrics`` per process that recorded a point since the previous
call, so a process that stopped using the GPU gets no point in the next ``collect``.

What never changes between batches is serialized once: metric headers, point attribute
entries, the host resource and scopes, and each process's resource, cached by the resourcer's
answer (its attributes, compared whole), not by the pid alone, so a process whose identity
changes (a declaration arrives, a relabel rule changes) gets a new resource at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
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
from gpumetrics.wire import varint

if TYPE_CHECKING:  # selftelemetry builds on this package; importing it here would be circular
    from gpumetrics.selftelemetry import SelfTelemetry

T = TypeVar("T")

_UNBOUNDED = 2**62  # one request, whatever its size

HEADS_MAX = 16_384
"""Distinct point attribute tuples whose serialized heads are kept between batches."""


class ProcessResourcer(Protocol):
    """Builds the OTLP resource of one process (implemented by ``gpumetrics.identity``)."""

    def put_resource(self, pid: int, attrs: dict[str, Any]) -> bool:
        """Add the resource attributes of ``pid`` to ``attrs``.

        Returns:
            False when a relabel rule dropped the process: its points are not reported.

        """


class Renderer(Protocol):
    """Anything that can append self-telemetry metrics to a repeated ``Metric`` field."""

    def render(self, metrics: Any) -> int:
        """Append metrics; return the number of data points written."""


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
        self._resources: dict[int, tuple[tuple[tuple[str, Any], ...], bytes]] = {}
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
        self, max_bytes: int, with_self: bool = True
    ) -> tuple[list[tuple[bytes, int]], list[list[bytes]]]:
        """Drain the batch into serialized requests of at most ``max_bytes`` each.

        Returns:
            ``([(request bytes, points)], host GPU metrics)``: the requests (the host resource
            first, carrying the GPU metrics scope and, when configured, the
            ``gpumetrics.self`` scope, left out when it has nothing to carry; then one
            resource per process, by pid) and the host's GPU ``Metric`` messages (as pieces).

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
            first = self._host_resource_metrics(host, with_self)
            if first is not None:
                n += first[1]
            pids, resources = self._process_resources(metrics, resourcer)
            return bulk.frame_resources(
                first[0] if first else None,
                n,
                pids,
                resources,
                self._scope_parts,
                metrics,
                max_bytes,
            ), host

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
    ) -> tuple[list[int], list[bytes]]:
        """Return the pids with points (relabel-dropped ones counted, left out), and resources.

        A resource is serialized once and kept while its process has points, rebuilt only
        when the resourcer's answer for the pid changes.
        """
        pids: list[int] = []
        resources: list[bytes] = []
        cached = self._resources
        kept: dict[int, tuple[tuple[tuple[str, Any], ...], bytes]] = {}
        for pid in sorted({run[0] for m in metrics for run in m[3]}):
            attrs: dict[str, Any] = {names.AttrProcessPID: pid}
            if resourcer is not None and not resourcer.put_resource(pid, attrs):
                if self._telemetry is not None:
                    self._telemetry.add("gpumetrics.processes.dropped_by_relabel")
                continue
            attrs[names.AttrProcessPID] = pid  # always the int pid, whatever the resourcer did
            key = tuple(attrs.items())
            hit = cached.get(pid)
            if hit is None or hit[0] != key:  # what the resourcer says about pid changed
                hit = (key, bulk.resource_bytes(key))
            kept[pid] = hit
            pids.append(pid)
            resources.append(hit[1])
        self._resources = kept  # a process without points this batch: its resource is forgotten
        return pids, resources

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
        requests, host = self._encode(_UNBOUNDED, with_self=False)
        for pieces in host:
            host_metrics.add().ParseFromString(b"".join(pieces))
        n = 0
        for data, points in requests:
            request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(data)
            n += points
            rms = request.resource_metrics
            resources.extend(rms[1:] if host else rms)  # after the host's resource, if any
        return n

    def collect_serialized(self) -> tuple[bytes, int]:
        """Produce one complete serialized ``ExportMetricsServiceRequest`` and its point count.

        Raises:
            EncodingError: naming the metric or attribute that cannot be encoded.

        """
        requests, _ = self._encode(_UNBOUNDED)
        if not requests:
            return b"", 0
        ((data, points),) = requests
        return data, points

    def collect_batches(self, max_bytes: int) -> list[tuple[bytes, int]]:
        """Produce the batch as serialized requests of at most ``max_bytes`` each, with counts.

        Whole ``ResourceMetrics`` are packed in order, as ``metrics.split.split_request``
        packs them, so the store (``BatchStore.append_serialized``) keeps them as they come;
        a resource larger than ``max_bytes`` on its own is one request, which the store splits
        further. This is what the batcher stores. Empty when nothing was recorded.

        Raises:
            ValueError: ``max_bytes`` is not positive.
            EncodingError: naming the metric or attribute that cannot be encoded.

        """
        if max_bytes <= 0:
            raise ValueError(f"max_bytes: must be > 0, got {max_bytes}")
        requests, _ = self._encode(max_bytes)
        return requests

    def collect(self) -> metrics_service_pb2.ExportMetricsServiceRequest:
        """Produce one complete ``ExportMetricsServiceRequest`` (see :meth:`collect_serialized`)."""
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
