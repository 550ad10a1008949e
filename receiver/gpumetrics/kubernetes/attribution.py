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
import os
import stat
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Protocol

from gpumetrics.kubernetes.allocations import (
    EMPTY,
    Allocations,
    DeviceKey,
    Match,
    build_allocations,
    device_id,
    listed_claim_devices,
)
from gpumetrics.kubernetes.apiserver import ResourceSliceError, ResourceSliceReader
from gpumetrics.kubernetes.client import Failure, PodResourcesClient, PodResourcesError
from gpumetrics.kubernetes.dra import ClaimDevice
from gpumetrics.kubernetes.emission import AllocationEmitter
from gpumetrics.kubernetes.settings import KubernetesSettings
from gpumetrics.metrics.attribution import DeviceAnnotation
from gpumetrics.metrics.gpu import GPU
from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry

__all__ = ["PodAttribution", "PodResourcesSource"]

REFRESHES = "gpumetrics.kubernetes.refreshes"
DEVICE_IDS = "gpumetrics.kubernetes.device_ids"
ALLOCATION_POINTS = "gpumetrics.kubernetes.allocation_points"
DRA_DEVICES = "gpumetrics.kubernetes.dra_devices"
SLICE_READS = "gpumetrics.kubernetes.resource_slice_reads"


class SliceSource(Protocol):
    """What :class:`PodAttribution` needs of :class:`~.apiserver.ResourceSliceReader`."""

    @property
    def where(self) -> str:
        """The API server's address, for log lines."""

    def read(self) -> Mapping[ClaimDevice, str]:
        """Map this node's claim devices to GPU UUIDs; raises :class:`ResourceSliceError`."""


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
        self._reported: tuple[frozenset[DeviceKey], frozenset[DeviceKey] | None] = (
            frozenset(),
            None,
        )
        self._emitter = AllocationEmitter(
            settings.allocation_interval_s, settings.max_allocation_points, clock
        )
        self._conditions: dict[str, Hashable] = {}
        self._sockets_checked: set[tuple[int, int]] = set()
        dra = settings.dra
        if slices is None and dra.resource_slices:
            slices = ResourceSliceReader(
                dra, node_name, settings.timeout_s, settings.max_response_bytes
            )
        self._slices = slices
        self._slice_index: Mapping[ClaimDevice, str] | None = None
        self._slices_at: float | None = None
        self._slice_failures: set[str] = set()
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
            self._report(current, match)
        emission = self._emitter.pick(memo[2].annotations, [g.uuid for g in key])
        if emission.recorded or emission.cut:
            self._telemetry.add(ALLOCATION_POINTS, emission.recorded, {"outcome": "recorded"})
            self._telemetry.add(ALLOCATION_POINTS, emission.cut, {"outcome": "cut"})
            self._condition(
                "cut",
                bool(emission.cut),
                "pod attribution: %d of %d nvidia.gpu.k8s.allocation points cut "
                "(kubernetes.max_allocation_points %d); every GPU keeps its first holders",
                (
                    emission.cut,
                    emission.cut + emission.recorded,
                    self._settings.max_allocation_points,
                ),
                "pod attribution: nvidia.gpu.k8s.allocation points are no longer cut",
            )
        return emission.annotations

    def _condition(
        self,
        name: str,
        detail: Hashable,
        message: str,
        args: tuple[object, ...],
        cleared: str,
    ) -> None:
        """Log a condition at WARNING when it appears or its detail changes, INFO when it ends.

        ``detail`` is falsy while the condition does not hold; the same detail is never logged
        twice in a row.
        """
        before = self._conditions.get(name)
        if detail == before or (not detail and not before):
            return
        self._conditions[name] = detail
        if detail:
            self._log.warning(message, *args)
        else:
            self._log.info(cleared)

    def _report(self, current: Allocations, match: Match) -> None:
        unmatched = sum(g.ids for k in match.unmatched for g in current.grants[k])
        self._telemetry.replace(
            DEVICE_IDS,
            {
                (("state", "matched"),): current.held_ids - unmatched,
                (("state", "unmatched"),): unmatched,
                (("state", "unrecognised"),): current.unrecognised,
                (("state", "over_limit"),): current.over_limit,
            },
        )
        self._report_dra(current)
        self._condition(
            "stale",
            current.stale,
            "pod attribution: the kubelet lists device ids for more than one container (%s): "
            "a device plugin gives an id to one container at a time, so this is the allocation "
            "of a pod that has ended (Succeeded or Failed; kubernetes/kubernetes#119423) beside "
            "the pod now using the device; both count as holders until the ended pod is deleted",
            (_show_stale(current.stale),),
            "pod attribution: no device id is listed for more than one container any more",
        )
        reported = (frozenset(match.unmatched), match.unmatched_allocatable)
        if reported == self._reported:
            return
        self._reported = reported
        if match.unmatched:
            self._log.warning(
                "pod attribution: the kubelet allocated GPU device ids that match no GPU NVML "
                "sees (%s); check kubernetes.gpu_id_type and that the sidecar sees every GPU "
                "(NVIDIA_VISIBLE_DEVICES=all)",
                _show(match.unmatched),
            )
        if match.unmatched_allocatable:
            self._log.warning(
                "pod attribution: the kubelet can allocate GPU device ids that match no GPU "
                "NVML sees (%s); their pods will not be attributed",
                _show(match.unmatched_allocatable),
            )

    def _report_dra(self, current: Allocations) -> None:
        missing = current.dra_unattributed
        by_driver: dict[str, int] = {}
        for _, device in missing:
            by_driver[device.driver] = by_driver.get(device.driver, 0) + 1
        matched = sum(
            g.ids for gs in current.grants.values() for g in gs if g.resource_name in self._drivers
        )
        self._telemetry.replace(
            DRA_DEVICES,
            {
                (("state", "attributed"),): matched,
                (("state", "unattributed"),): len(missing),
            },
        )
        if self._slices is None:
            why = (
                "which GPU a claim device is, only the DRA driver's ResourceSlices say: set "
                "kubernetes.dra.resource_slices: true (an API-server read; Helm: "
                "podAttribution.dra.resourceSlices=true adds the RBAC)"
            )
        elif self._slice_index is None:
            why = "this node's ResourceSlices could not be read (logged above)"
        else:
            why = "no ResourceSlice of this node names them with a uuid attribute"
        self._condition(
            "dra",
            missing,
            "pod attribution: %d GPU device(s) allocated through DRA claims are not attributed "
            "(%s); %s",
            (len(missing), _show_claims(missing), why),
            "pod attribution: every DRA claim device is attributed to a GPU again",
        )

    @property
    def _drivers(self) -> frozenset[str]:
        return frozenset(self._settings.dra.drivers)

    # --- refreshing -------------------------------------------------------------------
    def refresh(self) -> bool:
        """Read the kubelet's allocations once and swap them in; return True on success."""
        try:
            listing = self._client.list()
            allocatable = self._read_allocatable()
            slices = self._read_slices(listing)
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
        self._over_limit(fresh.over_limit)
        self._check_socket_mode()
        self._failure = None
        self._warned.clear()
        self._seen_ok = True
        return True

    def _over_limit(self, over: int) -> None:
        """WARNING when ids start to be left out, DEBUG while the number moves, INFO at the end."""
        before = self._conditions.get("over_limit", 0)
        self._conditions["over_limit"] = over
        limit = self._settings.max_device_ids
        if over and not before:
            self._log.warning(
                "pod attribution: %d device id(s) past kubernetes.max_device_ids (%d) ignored "
                "(counted in gpumetrics.kubernetes.device_ids{state=over_limit})",
                over,
                limit,
            )
        elif over and over != before:
            self._log.debug("pod attribution: now %d device id(s) past max_device_ids", over)
        elif before and not over:
            self._log.info("pod attribution: no device id is past kubernetes.max_device_ids")

    def _check_socket_mode(self) -> None:
        """Warn once per socket file the kubelet made when any local user may connect to it."""
        path = self._client.socket_path
        try:
            st = os.stat(path)
        except OSError:
            return
        ident = (st.st_dev, st.st_ino)
        if ident in self._sockets_checked:
            return
        self._sockets_checked.add(ident)
        if st.st_mode & stat.S_IWOTH:
            self._log.warning(
                "pod attribution: %s is world-writable (mode %04o): any process on the node "
                "that reaches it may call the kubelet's pod-resources API (every pod's devices, "
                "CPUs and memory; the kubelet's rate limit); the kubelet creates it for root "
                "only: find what changed its mode",
                path,
                stat.S_IMODE(st.st_mode),
            )

    def _read_slices(self, listing: object) -> Mapping[ClaimDevice, str] | None:
        """Return this node's ResourceSlice index, re-read when due or a device is unknown.

        Reads at most every ``kubernetes.refresh_interval_s`` (a claim device no slice names)
        and otherwise every ``kubernetes.dra.refresh_interval_s``; a failed read keeps the last
        index and is logged once per kind until a read succeeds.
        """
        if self._slices is None:
            return None
        now = self._clock()
        since = None if self._slices_at is None else now - self._slices_at
        needed = listed_claim_devices(listing, self._settings)
        index = self._slice_index
        unknown = bool(needed) and (index is None or not needed <= index.keys())
        due = (
            since is None
            or since >= self._settings.dra.refresh_interval_s
            or (unknown and since >= self._settings.refresh_interval_s)
        )
        if not due:
            return index
        self._slices_at = now
        try:
            self._slice_index = self._slices.read()
        except ResourceSliceError as err:
            self._telemetry.add(SLICE_READS, 1, {"outcome": err.kind.value})
            level = logging.DEBUG if err.kind.value in self._slice_failures else logging.WARNING
            self._slice_failures.add(err.kind.value)
            self._log.log(level, "pod attribution: reading ResourceSlices: %s", err)
            return index
        self._telemetry.add(SLICE_READS, 1, {"outcome": "ok"})
        if self._slice_failures or index is None:
            self._log.info(
                "pod attribution: read this node's ResourceSlices from %s: %d GPU device(s) of %s",
                self._slices.where,
                len(self._slice_index),
                ", ".join(self._settings.dra.drivers),
            )
        self._slice_failures.clear()
        return self._slice_index

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


def _show_stale(stale: tuple[tuple[str, tuple[object, ...]], ...], limit: int = 4) -> str:
    """``GPU-… held by ml/train-0/main and ml/train-1/main; …`` for the first ``limit`` ids."""
    shown = [
        f"{device} held by " + " and ".join(f"{h.namespace}/{h.pod}/{h.container}" for h in holders)  # type: ignore[attr-defined]
        for device, holders in stale[:limit]
    ]
    more = len(stale) - limit
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _show_claims(missing: frozenset[tuple[object, ClaimDevice]], limit: int = 8) -> str:
    """``claim ml/gpu-claim: gpu.nvidia.com/node-1/gpu-0, …`` for the first ``limit`` devices."""
    shown = sorted(f"claim {claim}: {device}" for claim, device in missing)
    more = len(shown) - limit
    return ", ".join(shown[:limit]) + (f", and {more} more" if more > 0 else "")


def _show(keys: frozenset[DeviceKey] | None, limit: int = 8) -> str:
    """Device keys as the device plugin spells them (``GPU-…``, ``nvidia3``, ``nvidia3/gi1``)."""
    shown = sorted(device_id(k) for k in keys or ())
    more = len(shown) - limit
    return ", ".join(shown[:limit]) + (f", and {more} more" if more > 0 else "")
