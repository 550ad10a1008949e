"""What pod attribution logs and counts about each answer: every condition once per change.

:class:`AttributionReport` turns what :class:`~.attribution.PodAttribution` found into
self-telemetry (``gpumetrics.kubernetes.device_ids``, ``dra_devices``, ``allocation_points``)
and log lines, each condition at WARNING when it appears or changes and at INFO when it ends,
never at every refresh or cycle: device ids that match no GPU, ids past ``max_device_ids``, an
id the kubelet lists for two containers (a stale allocation of an ended pod), DRA claim devices
no ResourceSlice maps to a GPU, allocation points cut, and a world-writable pod-resources socket
(once per socket file).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Hashable

from gpumetrics.kubernetes.allocations import Allocations, DeviceKey, Match, device_id
from gpumetrics.kubernetes.dra import ClaimDevice
from gpumetrics.kubernetes.emission import Emission
from gpumetrics.kubernetes.settings import KubernetesSettings
from gpumetrics.selftelemetry import SelfTelemetry

__all__ = ["ALLOCATION_POINTS", "DEVICE_IDS", "DRA_DEVICES", "AttributionReport"]

DEVICE_IDS = "gpumetrics.kubernetes.device_ids"
ALLOCATION_POINTS = "gpumetrics.kubernetes.allocation_points"
DRA_DEVICES = "gpumetrics.kubernetes.dra_devices"


class AttributionReport:
    """Counts and logs, once per change, what the kubelet's answers show.

    Args:
        settings: the ``kubernetes`` settings (limits named in the messages).
        telemetry: where device ids and allocation points are counted.
        log: the ``gpumetrics.kubernetes`` logger.
        slice_state: says why DRA claim devices are unattributed: ``"off"`` (slices not read),
            ``"unread"`` (the read failed) or ``"read"``.

    Called from the refresher thread (:meth:`refreshed`) and the collector's
    (:meth:`allocations`, :meth:`emission`); each condition is touched from one of them only.

    """

    def __init__(
        self,
        settings: KubernetesSettings,
        telemetry: SelfTelemetry,
        log: logging.Logger,
        slice_state: Callable[[], str],
    ) -> None:
        self._settings = settings
        self._telemetry = telemetry
        self._log = log
        self._slice_state = slice_state
        self._conditions: dict[str, Hashable] = {}
        self._sockets_checked: set[tuple[int, int]] = set()
        self._reported: tuple[frozenset[DeviceKey], frozenset[DeviceKey] | None] = (
            frozenset(),
            None,
        )

    def condition(
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

    def allocations(self, current: Allocations, match: Match) -> None:
        """Count the device ids of ``current`` by state; log what changed since the last call."""
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
        self.condition(
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
        drivers = self._settings.dra.drivers
        matched = sum(
            g.ids for gs in current.grants.values() for g in gs if g.resource_name in drivers
        )
        self._telemetry.replace(
            DRA_DEVICES,
            {
                (("state", "attributed"),): matched,
                (("state", "unattributed"),): len(missing),
            },
        )
        state = self._slice_state()
        if state == "off":
            why = (
                "which GPU a claim device is, only the DRA driver's ResourceSlices say: set "
                "kubernetes.dra.resource_slices: true (an API-server read; Helm: "
                "podAttribution.dra.resourceSlices=true adds the RBAC)"
            )
        elif state == "unread":
            why = "this node's ResourceSlices could not be read (logged above)"
        else:
            why = "no ResourceSlice of this node names them with a uuid attribute"
        self.condition(
            "dra",
            missing,
            "pod attribution: %d GPU device(s) allocated through DRA claims are not attributed "
            "(%s); %s",
            (len(missing), _show_claims(missing), why),
            "pod attribution: every DRA claim device is attributed to a GPU again",
        )

    def emission(self, emission: Emission) -> None:
        """Count the allocation points recorded and cut this cycle; log a cut once."""
        if not (emission.recorded or emission.cut):
            return
        self._telemetry.add(ALLOCATION_POINTS, emission.recorded, {"outcome": "recorded"})
        self._telemetry.add(ALLOCATION_POINTS, emission.cut, {"outcome": "cut"})
        self.condition(
            "cut",
            bool(emission.cut),
            "pod attribution: %d of %d nvidia.gpu.k8s.allocation points cut "
            "(kubernetes.max_allocation_points %d); every GPU keeps its first holders",
            (emission.cut, emission.cut + emission.recorded, self._settings.max_allocation_points),
            "pod attribution: nvidia.gpu.k8s.allocation points are no longer cut",
        )

    def refreshed(self, fresh: Allocations, socket_path: str) -> None:
        """After a successful refresh: ids past ``max_device_ids``, the socket's mode."""
        self._over_limit(fresh.over_limit)
        self._check_socket_mode(socket_path)

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

    def _check_socket_mode(self, path: str) -> None:
        """Warn once per socket file the kubelet made when any local user may connect to it."""
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
