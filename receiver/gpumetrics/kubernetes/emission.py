"""When ``nvidia.gpu.k8s.allocation`` is recorded, and how many of its points at once.

``nvidia.gpu.k8s.allocation`` is an *info-style* series: one point per container and GPU whose
value (device ids held) changes only when the kubelet's allocations do. Recording every holder
of every GPU in every collection cycle (1 s) floods the store on a node with many pods sharing
GPUs (5,000 time-sliced pods on 8 GPUs: 4,096 points a second, a full 96 MiB store in a minute),
while saying nothing new. :class:`AllocationEmitter` records them:

* **when they change**: in the first cycle whose annotation differs from what was last
  recorded (a pod came or went, a share changed, the answer went stale), and
* **again every** ``kubernetes.allocation_interval_s`` (60 s) while they do not, so the series
  stays *fresh* where consumers expire what they do not see: Prometheus looks back 5 minutes for
  an instant query's sample (``--query.lookback-delta``), and the Collector's Prometheus
  exporter drops a series it got no point for within ``metric_expiration`` (5 minutes); a
  series recorded only on change would vanish from both after 5 minutes of stable allocations.
  Keep the interval well under both (``0`` = every cycle, the old behaviour).

A holder that lets go of a GPU is simply not recorded again; like any series that stops, it
leaves the Collector's Prometheus exporter after ``metric_expiration`` and Prometheus' queries
after the lookback.

**Bound.** At most ``kubernetes.max_allocation_points`` points are recorded at once; beyond
that the rest are *cut*, spread over the GPUs (round robin over the GPUs, each GPU's holders in
their stable order), so every GPU keeps its first holders; the cut points are counted
(``gpumetrics.kubernetes.allocation_points{outcome=cut}``) and the cut is logged once per
change by the caller. The device points' own ``k8s.*`` attributes and ``nvidia.gpu.k8s.shared``
are never cut.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from gpumetrics.metrics.attribution import DeviceAnnotation

__all__ = ["AllocationEmitter", "Emission", "cut_allocations", "without_allocations"]

Annotations = Mapping[str, DeviceAnnotation]


def without_allocations(annotations: Annotations) -> dict[str, DeviceAnnotation]:
    """Return the same annotations with no ``nvidia.gpu.k8s.allocation`` point to record."""
    return {
        uuid: replace(a, allocations=()) if a.allocations else a for uuid, a in annotations.items()
    }


def cut_allocations(
    annotations: Annotations, order: Sequence[str], limit: int
) -> tuple[dict[str, DeviceAnnotation], int]:
    """Keep at most ``limit`` allocation points, round robin over the GPUs in ``order``.

    Returns:
        The annotations with the kept points, and how many were cut (0: all kept).

    >>> from gpumetrics.metrics.attribution import DeviceAnnotation as A
    >>> notes = {"a": A((), ((("p", 1), 1), (("p", 2), 1))), "b": A((), ((("p", 3), 1),))}
    >>> kept, cut = cut_allocations(notes, ["a", "b"], 2)
    >>> [len(kept[u].allocations) for u in "ab"], cut
    ([1, 1], 1)

    """
    total = sum(len(a.allocations) for a in annotations.values())
    if total <= limit:
        return dict(annotations), 0
    keep = {uuid: 0 for uuid in order if uuid in annotations}
    for uuid in annotations:
        keep.setdefault(uuid, 0)
    left, depth = limit, 0
    while left > 0:
        grew = False
        for uuid in keep:
            if left > 0 and len(annotations[uuid].allocations) > depth:
                keep[uuid] += 1
                left -= 1
                grew = True
        if not grew:
            break
        depth += 1
    out = {
        uuid: replace(a, allocations=a.allocations[: keep[uuid]])
        if len(a.allocations) > keep[uuid]
        else a
        for uuid, a in annotations.items()
    }
    return out, total - limit


class Emission:
    """What one cycle records: the annotations, and the allocation points kept and cut."""

    __slots__ = ("annotations", "cut", "recorded")

    def __init__(self, annotations: Annotations, recorded: int, cut: int) -> None:
        self.annotations = annotations
        self.recorded = recorded
        self.cut = cut


class AllocationEmitter:
    """Decides, each collection cycle, whether the allocation points are recorded.

    Args:
        interval_s: re-record unchanged allocations this often (s); 0 = every cycle.
        max_points: the most allocation points recorded at once.
        clock: monotonic seconds (injectable for tests).

    Called from the collector's thread only (through ``PodAttribution.annotate``); cheap when
    nothing is due: it compares the annotations' identity, and their content only when a new
    kubelet answer (or a new set of GPUs) produced new ones.

    """

    def __init__(self, interval_s: float, max_points: int, clock: Callable[[], float]) -> None:
        self._interval = interval_s
        self._max = max_points
        self._clock = clock
        self._seen: Annotations | None = None
        self._quiet: Annotations = {}
        self._cut: tuple[dict[str, DeviceAnnotation], int] = ({}, 0)
        self._recorded: tuple[tuple[str, tuple[object, ...]], ...] | None = None
        self._changed = False
        self._last_at: float | None = None

    def pick(self, annotations: Annotations, order: Sequence[str]) -> Emission:
        """Return this cycle's annotations: with their allocation points when due, else none.

        Args:
            annotations: the current annotation of each GPU (a new object only when the
                kubelet's answer or the GPUs changed).
            order: the GPUs' UUIDs in the collector's order (the cut's round robin).

        """
        if annotations is not self._seen:
            self._seen = annotations
            self._quiet = without_allocations(annotations)
            self._cut = cut_allocations(annotations, order, self._max)
            content = tuple(sorted((u, a.allocations) for u, a in annotations.items()))
            if content != self._recorded:
                self._changed = True
                self._recorded = content
        now = self._clock()
        due = (
            self._changed
            or self._interval == 0
            or self._last_at is None
            or now - self._last_at >= self._interval
        )
        if not due:
            return Emission(self._quiet, 0, 0)
        self._changed = False
        self._last_at = now
        kept, cut = self._cut
        recorded = sum(len(a.allocations) for a in kept.values())
        return Emission(kept, recorded, cut)
