"""The :class:`Producer`: per-resource buffers drained into OTLP on each ``produce``.

Collectors record points into the host buffer (device metrics) or into one buffer per process
(per-process metrics). ``produce`` moves everything recorded since the previous call into OTLP:
one ``Metric`` per name per scope (never two same-named metrics, as polarsignals/gpu-metrics-agent's
``Produce`` in ``nvidia.go`` emits one per device), and one
``ResourceMetrics`` per process that recorded a point since the previous call, so a process that
stopped using the GPU gets no point in the next ``produce``.

The batcher takes a collection with :meth:`Producer.collect_parts`: resource by resource, each
serialized as soon as it is built (only one process's protobuf message exists at a time), within
a byte budget (``store.max_collection_bytes``): a process whose resource does not fit what is
left is left out and its points counted (:class:`CollectionParts`), so the batch under construction
never takes more than the budget, however many processes NVML reports.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from gpumetrics.metrics import names
from gpumetrics.metrics.attribution import DeviceAttribution
from gpumetrics.metrics.buffer import MetricBuffer, point_rules
from gpumetrics.metrics.encode import AttributeCache, encode_attributes, encode_metric
from gpumetrics.metrics.spec import MetricSpec, Scope, catalogue
from gpumetrics.wire import len_field

if TYPE_CHECKING:  # selftelemetry builds on this package; importing it here would be circular
    from gpumetrics.selftelemetry import SelfTelemetry

T = TypeVar("T")


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


class Producer:
    """Per-resource metric buffers and their conversion to OTLP.

    Args:
        specs: metric specs by name (default: the catalogue's GPU metrics).
        scope: the instrumentation scope of the GPU metrics (default ``parca.nvidia_gpu_metrics``
            with schema URL semconv 1.44.0).
        host_attributes: attributes of the host resource (e.g. ``host.name``, ``k8s.node.name``).
        disabled_metrics: metric names recorded but never emitted (configuration).
        telemetry: where dropped processes are counted (None: not counted).
        self_telemetry: rendered under scope ``gpumetrics.self`` on the host resource by
            :meth:`collect`, or None.

    ``record_host``/``record_process`` run their callback under the producer's lock: callbacks only
    append points (no NVML calls, no I/O).

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
        self._host = MetricBuffer(self._specs, self._rules)
        self._processes: dict[int, MetricBuffer] = {}
        self._resourcer: ProcessResourcer | None = None
        self._attribution: DeviceAttribution | None = None

    def enabled(self, name: str) -> bool:
        """Tell whether metric ``name`` is in the catalogue and not disabled by configuration."""
        return name in self._specs and name not in self._disabled

    def set_process_resourcer(self, resourcer: ProcessResourcer | None) -> None:
        """Use ``resourcer`` for process resources from the next ``produce`` (None: pid only)."""
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

    def record_host(self, fn: Callable[[MetricBuffer], T]) -> T:
        """Run ``fn(host_buffer)`` under the lock and return its result."""
        with self._lock:
            return fn(self._host)

    def record_process(self, pid: int, fn: Callable[[MetricBuffer], T]) -> T:
        """Run ``fn(buffer_of_pid)`` under the lock and return its result.

        Raises:
            ValueError: ``pid`` is not a positive int.

        """
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ValueError(f"pid: must be a positive int, got {pid!r}")
        with self._lock:
            buf = self._processes.get(pid)
            if buf is None:
                buf = self._processes[pid] = MetricBuffer(self._specs, self._rules)
            return fn(buf)

    def _drain(self) -> tuple[MetricBuffer, dict[int, MetricBuffer], ProcessResourcer | None]:
        with self._lock:
            host, procs = self._host, self._processes
            self._host, self._processes = MetricBuffer(self._specs, self._rules), {}
            return host, procs, self._resourcer

    def _encode_buffer(self, target: Any, buf: MetricBuffer, cache: AttributeCache) -> int:
        n = 0
        for spec, points in buf.items():
            if spec.name not in self._disabled:
                n += encode_metric(target.add(), spec, points, cache)
        return n

    def _new_scope_metrics(self, rm: metrics_pb2.ResourceMetrics, scope: Scope) -> Any:
        sm = rm.scope_metrics.add()
        sm.scope.name = scope.name
        if scope.schema_url:
            sm.schema_url = scope.schema_url
        return sm

    def _encode_process(
        self,
        rm: metrics_pb2.ResourceMetrics,
        pid: int,
        buf: MetricBuffer,
        resourcer: ProcessResourcer | None,
        cache: AttributeCache,
    ) -> int:
        """Fill ``rm`` with ``pid``'s resource and points; return the points (0: leave it out)."""
        attrs: dict[str, Any] = {names.AttrProcessPID: pid}
        if resourcer is not None and not resourcer.put_resource(pid, attrs):
            if self._telemetry is not None:
                self._telemetry.add("gpumetrics.processes.dropped_by_relabel")
            return 0
        attrs[names.AttrProcessPID] = pid  # always the int pid, whatever the resourcer did
        encode_attributes(rm.resource.attributes, attrs.items())
        schema_url = getattr(resourcer, "schema_url", None)
        if schema_url is not None:  # the declared resource's schema URL (docs/identity.md)
            rm.schema_url = schema_url(pid)
        sm = self._new_scope_metrics(rm, self._scope)
        return self._encode_buffer(sm.metrics, buf, cache)

    def _encode_host(
        self, rm: metrics_pb2.ResourceMetrics, host: MetricBuffer, cache: AttributeCache
    ) -> int:
        """Fill ``rm`` with the host resource: the GPU metrics scope, then ``gpumetrics.self``.

        Returns the points written; a scope with nothing is left out (``rm`` may end with none).
        """
        encode_attributes(rm.resource.attributes, self._host_attributes.items())
        sm = self._new_scope_metrics(rm, self._scope)
        n = self._encode_buffer(sm.metrics, host, cache)
        if not sm.metrics:
            del rm.scope_metrics[-1]
        if self._self_telemetry is not None:
            self_sm = self._new_scope_metrics(rm, self._self_scope)
            written = self._self_telemetry.render(self_sm.metrics)
            if not written:
                del rm.scope_metrics[-1]
            n += written
        return n

    def produce(self, host_metrics: Any, resources: Any) -> int:
        """Drain everything recorded since the last call into OTLP.

        Args:
            host_metrics: the repeated ``Metric`` field of the host resource's GPU-metrics
                ``ScopeMetrics``; one ``Metric`` per name is appended.
            resources: a repeated ``ResourceMetrics`` field; one entry is appended per process
                with points (resource from the resourcer, or only ``process.pid`` without one).

        Returns:
            The number of data points written.

        """
        host, procs, resourcer = self._drain()
        cache: AttributeCache = {}  # a GPU's attribute tuples repeat across metrics and processes
        n = self._encode_buffer(host_metrics, host, cache)
        for pid in sorted(procs):
            written = self._encode_process(resources.add(), pid, procs[pid], resourcer, cache)
            if not written:
                del resources[-1]
            n += written
        return n

    def collect(self) -> metrics_service_pb2.ExportMetricsServiceRequest:
        """Produce one complete ``ExportMetricsServiceRequest``.

        The host resource (``host_attributes``) carries the GPU metrics scope and, when
        configured, the ``gpumetrics.self`` scope; then one resource per process. The host
        resource is left out when it has nothing to carry. The same content as
        :meth:`collect_parts` without a budget, as one protobuf message.
        """
        host, procs, resourcer = self._drain()
        cache: AttributeCache = {}
        req = metrics_service_pb2.ExportMetricsServiceRequest()
        if not self._encode_host(req.resource_metrics.add(), host, cache):
            if not req.resource_metrics[0].scope_metrics:
                del req.resource_metrics[0]
        for pid in sorted(procs):
            rm = req.resource_metrics.add()
            if not self._encode_process(rm, pid, procs[pid], resourcer, cache):
                del req.resource_metrics[-1]
        return req

    def collect_parts(self, max_bytes: int = 0) -> CollectionParts:
        """Produce one collection within ``max_bytes``, serialized resource by resource.

        The content of :meth:`collect`, as :class:`CollectionParts`. Each process's
        ``ResourceMetrics`` is built as a message of its own and serialized at once, so one
        process's message is the only protobuf copy held. The host resource is always kept;
        then processes in pid order, each kept when its part fits what is left of
        ``max_bytes`` and left out otherwise (its points counted in
        ``CollectionParts.dropped_points``; a later, smaller process may still fit).

        Args:
            max_bytes: the most serialized bytes of the whole collection (By); 0 = no limit.

        Raises:
            ValueError: ``max_bytes`` is negative.

        """
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes: must be an int >= 0, got {max_bytes!r}")
        host, procs, resourcer = self._drain()
        cache: AttributeCache = {}
        out = CollectionParts()
        used = 0
        rm = metrics_pb2.ResourceMetrics()
        n = self._encode_host(rm, host, cache)
        if rm.scope_metrics:
            part = len_field(1, rm.SerializeToString())
            out.parts.append((part, n))
            used = len(part)
        for pid in sorted(procs):
            rm = metrics_pb2.ResourceMetrics()
            n = self._encode_process(rm, pid, procs[pid], resourcer, cache)
            if not n:
                continue
            part = len_field(1, rm.SerializeToString())
            del rm
            if max_bytes and used + len(part) > max_bytes:
                out.dropped_points += n
                out.dropped_resources += 1
                continue
            out.parts.append((part, n))
            used += len(part)
        return out
