""":class:`PodAttribution`: the kubelet's GPU allocations, kept fresh on a thread of their own.

A refresher thread calls the kubelet's pod-resources API every ``refresh_interval_s`` (each call
under ``timeout_s``) and swaps in a new immutable :class:`~.allocations.Allocations`; the
collector's :meth:`PodAttribution.annotate` only reads the current one, so collection never
waits on the kubelet. Only at start-up does the sidecar wait, at most ``timeout_s``, for the
first read to end, so that its first batch already says which pod holds which GPU (a batch
without pods would leave pod-less series behind in, e.g., a Prometheus exporter). An answer
older than ``stale_after_s`` is dropped: device points then carry no pod, rather than a pod
that may have let go of the GPU.

Failures are logged once per kind and outage (WARNING, with what to do: mount the socket's
directory, run as uid 0, ...), then at DEBUG until the kubelet answers again (INFO); each
refresh is counted in ``gpumetrics.kubernetes.refreshes{outcome}``. ``GetAllocatableResources``
is asked once per successful connection (a kubelet without it is asked no more); it only serves
a diagnosis: GPU ids the kubelet offers that match no GPU NVML sees are logged once (wrong
``kubernetes.gpu_id_type``, or the container sees fewer GPUs than the node has).

Memory is bounded: an answer is refused above ``max_response_bytes``, at most ``max_device_ids``
device ids are kept, and the per-cycle annotation is cached for the last set of GPUs only.

``nvidia.gpu.k8s.allocation`` is recorded when the allocations change and every
``allocation_interval_s`` otherwise, at most ``max_allocation_points`` at once
(:mod:`.emission`). GPUs allocated through DRA claims are mapped to GPUs through this node's
ResourceSlices when ``kubernetes.dra.resource_slices`` is on (:mod:`.apiserver`, read on the
refresher thread too), else counted and logged as unattributed.

Every condition is logged once when it appears or changes and once (INFO) when it ends, never
at every refresh: device ids past ``max_device_ids``, allocation points cut, device ids the
kubelet lists for two containers (a stale allocation of an ended pod), unattributed DRA claims,
and, once per socket file, a pod-resources socket any local user may connect to (world-writable).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from gpumetrics.kubernetes.allocations import (
    EMPTY,
    Allocations,
    Match,
    build_allocations,
    listed_claim_devices,
)
from gpumetrics.kubernetes.apiserver import ResourceSliceReader, SliceCache, SliceSource
from gpumetrics.kubernetes.client import Failure, PodResourcesClient, PodResourcesError
from gpumetrics.kubernetes.emission import AllocationEmitter
from gpumetrics.kubernetes.reporting import AttributionReport
from gpumetrics.kubernetes.settings import KubernetesSettings
from gpumetrics.metrics.attribution import DeviceAnnotation
from gpumetrics.metrics.gpu import GPU
from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry

__all__ = ["PodAttribution", "PodResourcesSource"]

REFRESHES = "gpumetrics.kubernetes.refreshes"


class PodResourcesSource(Protocol):
    """What :class:`PodAttribution` needs of :class:`~.client.PodResourcesClient`."""

    socket_path: str

    def list(self) -> object:
        """``List``; raises :class:`PodResourcesError`."""

    def allocatable(self) -> object:
        """``GetAllocatableResources``; raises :class:`PodResourcesError`."""

    def close(self) -> None:
        """Release the connection."""


class PodAttribution:
    """GPU → pod attribution from the kubelet (a :class:`DeviceAttribution`).

    Args:
        settings: the ``kubernetes`` settings.
        telemetry: where refreshes and device ids are counted.
        client: the pod-resources client (default: one on ``settings.pod_resources_socket``).
        clock: monotonic seconds (staleness, the allocation cadence; injectable for tests).
        log: logger (default ``gpumetrics.kubernetes``).
        node_name: this node's name (``identity.node_name``): which ResourceSlices are read.
        slices: the ResourceSlice reader (default: one from ``settings.dra`` when
            ``resource_slices`` is on, else none).

    Thread-safety: :meth:`refresh` runs on the refresher thread (or a test's); :meth:`annotate`
    on the collector's thread; they share only an immutable snapshot, swapped under a lock.

    """

    def __init__(
        self,
        settings: KubernetesSettings,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        client: PodResourcesSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger | None = None,
        node_name: str = "",
        slices: SliceSource | None = None,
    ) -> None:
        self._settings = settings
        self._telemetry = telemetry
        self._client: PodResourcesSource = client or PodResourcesClient(
            settings.pod_resources_socket, settings.timeout_s, settings.max_response_bytes
        )
        self._clock = clock
        self._log = log or logging.getLogger("gpumetrics.kubernetes")
        self._lock = threading.Lock()
        self._current: Allocations = EMPTY
        self._taken_at: float | None = None
        self._failure: Failure | None = None
        self._warned: set[Failure] = set()  # kinds logged at WARNING since the last success
        self._stale_logged = False
        self._seen_ok = False
        self._ask_allocatable = True
        self._allocatable_answer: object | None = None
        self._memo: tuple[Allocations, tuple[GPU, ...], Match] | None = None
        self._emitter = AllocationEmitter(
            settings.allocation_interval_s, settings.max_allocation_points, clock
        )
        if slices is None and settings.dra.resource_slices:
            slices = ResourceSliceReader(
                settings.dra, node_name, settings.timeout_s, settings.max_response_bytes
            )
        self._slices = SliceCache(slices, settings, telemetry, self._log, clock)
        self._report = AttributionReport(settings, telemetry, self._log, lambda: self._slices.state)
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the snapshot -----------------------------------------------------------------
    def snapshot(self) -> Allocations:
        """Return the current allocations (:data:`~.allocations.EMPTY` when none or stale)."""
        with self._lock:
            current, taken_at = self._current, self._taken_at
        if taken_at is None:
            return EMPTY
        if self._clock() - taken_at > self._settings.stale_after_s:
            if not self._stale_logged:
                self._stale_logged = True
                self._log.warning(
                    "pod attribution: the kubelet's last answer is older than %g s "
                    "(kubernetes.stale_after_s); device metrics carry no pod until it answers",
                    self._settings.stale_after_s,
                )
            return EMPTY
        return current

    def annotate(self, gpus: Sequence[GPU]) -> Mapping[str, DeviceAnnotation]:
        """Annotate ``gpus`` from the current snapshot (memory only; see the module docstring).

        The annotations carry their ``nvidia.gpu.k8s.allocation`` points only in the cycles the
        :class:`~.emission.AllocationEmitter` says are due (a change, or the cadence).
        """
        current = self.snapshot()
        key = tuple(gpus)
        memo = self._memo
        if memo is None or memo[0] is not current or memo[1] != key:
            match = current.annotate(key)
            memo = self._memo = (current, key, match)
            self._report.allocations(current, match)
        emission = self._emitter.pick(memo[2].annotations, [g.uuid for g in key])
        self._report.emission(emission)
        return emission.annotations

    # --- refreshing -------------------------------------------------------------------
    def refresh(self) -> bool:
        """Read the kubelet's allocations once and swap them in; return True on success."""
        try:
            listing = self._client.list()
            allocatable = self._read_allocatable()
            slices = self._slices.current(listed_claim_devices(listing, self._settings))
            fresh = build_allocations(listing, allocatable, self._settings, slices)
        except PodResourcesError as err:
            self._failed(err)
            return False
        except Exception as exc:  # noqa: BLE001 - a bad answer must not end the thread
            self._failed(PodResourcesError(Failure.ERROR, f"unreadable answer: {exc!r}"))
            return False
        with self._lock:
            self._current, self._taken_at = fresh, self._clock()
        self._stale_logged = False
        self._telemetry.add(REFRESHES, 1, {"outcome": "ok"})
        if self._failure is not None or not self._seen_ok:
            self._log.info(
                "pod attribution: the kubelet answers on %s: %d GPU device id(s) held by %d "
                "container(s)",
                self._client.socket_path,
                fresh.held_ids,
                len({g.holder for gs in fresh.grants.values() for g in gs}),
            )
        self._report.refreshed(fresh, self._client.socket_path)
        self._failure = None
        self._warned.clear()
        self._seen_ok = True
        return True

    def _read_allocatable(self) -> object | None:
        if not self._ask_allocatable:
            return self._allocatable_answer
        try:
            self._allocatable_answer = self._client.allocatable()
        except PodResourcesError as err:
            if err.kind is not Failure.UNIMPLEMENTED:
                raise
            self._log.info(
                "pod attribution: the kubelet has no GetAllocatableResources (%s); "
                "allocatable GPUs are not checked",
                err,
            )
            self._allocatable_answer = None
        self._ask_allocatable = False
        return self._allocatable_answer

    def _failed(self, err: PodResourcesError) -> None:
        self._telemetry.add(REFRESHES, 1, {"outcome": err.kind.value})
        level = logging.DEBUG if err.kind in self._warned else logging.WARNING
        self._warned.add(err.kind)
        self._log.log(level, "pod attribution: %s", err)
        self._failure = err.kind
        self._ask_allocatable = True  # a new connection: ask again once

    # --- lifecycle --------------------------------------------------------------------
    def start(self, wait_first_s: float = 0.0) -> bool:
        """Start the refresher thread, which reads the kubelet at once.

        Args:
            wait_first_s: wait up to this long (s) for that first read to end (answered or
                failed), so the first collection already carries pods; the sidecar passes
                ``kubernetes.timeout_s``. Nothing waits on the kubelet after that.

        Returns:
            True when the first read ended within ``wait_first_s``.

        """
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="gpumetrics-pod-attribution", daemon=True
            )
            self._thread.start()
        return self._first.wait(wait_first_s)

    def _run(self) -> None:
        interval = self._settings.refresh_interval_s
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.refresh()
            finally:
                self._first.set()
            self._stop.wait(max(0.0, interval - (time.monotonic() - began)))

    def stop(self, timeout_s: float = 1.0) -> bool:
        """Stop the thread (a call in flight ends within ``timeout_s`` of the settings).

        Returns:
            True when the thread ended within ``timeout_s``.

        """
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        self._client.close()
        return thread is None or not thread.is_alive()
