"""gRPC health for the sidecar: ``grpc_health.v1.health.HealthServicer`` with a readiness switch.

Names (gRPC health checking protocol, https://github.com/grpc/grpc/blob/master/doc/health-checking.md;
``plugin`` as go-plugin's host checks it): ``""`` (the whole server) and each served
service (``gpumetrics.v1.MetricsPullService``, ``gpumetrics.v1.ProfilerIntegrationService``)
start NOT_SERVING, and turn SERVING when the sidecar calls :meth:`SidecarHealth.mark_ready`
after its first collection has been stored. :meth:`SidecarHealth.set_nvml_healthy` (False once
NVML has been down longer than ``runtime.unhealthy_after_nvml_down_s``, field case F32) makes
``""`` and the pull service NOT_SERVING until it is called with True; the profiler service keeps
following readiness alone (declarations still work).
:meth:`SidecarHealth.enter_graceful_shutdown` makes every name NOT_SERVING for good (the server
calls it before it stops accepting calls). ``Check`` and ``Watch`` only read a dictionary: they
never reach NVML, so the kubelet's 1 s probe deadline is never at risk.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from grpc_health.v1 import health, health_pb2

from gpumetrics.service.names import OVERALL_HEALTH, PROFILER_SERVICE, PULL_SERVICE

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class _HealthServicer(health.HealthServicer):
    """grpcio's servicer plus ``List``, a non-atomic listing of every name and its status.

    ``List`` was added to ``health.proto`` in 2025; grpcio's servicer leaves it UNIMPLEMENTED.
    """

    def List(self, request: Any, context: Any) -> health_pb2.HealthListResponse:  # noqa: N802
        """Return every registered name with its status."""
        with self._lock:
            statuses = dict(self._server_status)
        return health_pb2.HealthListResponse(
            statuses={k: health_pb2.HealthCheckResponse(status=v) for k, v in statuses.items()}
        )


class SidecarHealth:
    """Health state of one sidecar, shared by every listener that serves ``grpc.health.v1``.

    Args:
        services: health names that follow readiness besides ``""`` (default: the pull and
            profiler services).

    Attributes:
        servicer: the ``HealthServicer`` to register on each ``grpc.Server`` (its ``Watch`` is
            non-blocking, so watchers hold no worker thread).

    """

    def __init__(
        self,
        services: Iterable[str] = (PULL_SERVICE, PROFILER_SERVICE),
        nvml_dependent: Iterable[str] = (OVERALL_HEALTH, PULL_SERVICE),
    ) -> None:
        self.servicer: health.HealthServicer = _HealthServicer()
        self._lock = threading.Lock()
        self._ready = False
        self._nvml_healthy = True
        self._stopping = False
        self._nvml_dependent = frozenset(nvml_dependent)
        self._following: dict[str, None] = {OVERALL_HEALTH: None}
        for name in services:
            self._following[name] = None
        for name in self._following:
            self.servicer.set(name, NOT_SERVING)

    @property
    def ready(self) -> bool:
        """True after :meth:`mark_ready` until ``set_ready(False)`` or shutdown."""
        with self._lock:
            return self._ready and not self._stopping

    def _status(self, name: str) -> int:
        """Return the status of a following name (caller holds the lock)."""
        if not self._ready:
            return NOT_SERVING
        if name in self._nvml_dependent and not self._nvml_healthy:
            return NOT_SERVING
        return SERVING

    def add_service(self, name: str, follow_ready: bool = True) -> None:
        """Register health name ``name`` (e.g. ``plugin`` under go-plugin).

        Args:
            name: the name ``Check`` answers for.
            follow_ready: True: SERVING exactly when the sidecar is ready; False: SERVING from
                now until shutdown, whatever the readiness (for names that only say "the process
                answers").

        """
        with self._lock:
            if self._stopping:
                return
            if follow_ready:
                self._following[name] = None
                status = self._status(name)
            else:
                status = SERVING
            self.servicer.set(name, status)

    def mark_ready(self) -> None:
        """Turn every following name SERVING (called after the first collection is stored)."""
        self.set_ready(True)

    def set_ready(self, ready: bool) -> None:
        """Set readiness; ignored after :meth:`enter_graceful_shutdown`."""
        with self._lock:
            if self._stopping:
                return
            self._ready = ready
            self._publish()

    def set_nvml_healthy(self, healthy: bool) -> None:
        """Say whether NVML answers well enough to be live (False: ``""`` and pull NOT_SERVING).

        Ignored after :meth:`enter_graceful_shutdown`. Before :meth:`mark_ready` every name is
        NOT_SERVING anyway.
        """
        with self._lock:
            if self._stopping:
                return
            self._nvml_healthy = healthy
            self._publish()

    def _publish(self) -> None:
        """Set every following name's status (caller holds the lock).

        ``""`` is set last: a client watching the overall health that sees it change can rely
        on every service's own status having changed already (a Watch on ``""`` that saw
        NOT_SERVING must not find the pull service still SERVING).
        """
        for name in sorted(self._following, key=lambda n: n == OVERALL_HEALTH):
            self.servicer.set(name, self._status(name))

    def enter_graceful_shutdown(self) -> None:
        """Make every name NOT_SERVING permanently (idempotent)."""
        with self._lock:
            self._stopping = True
            self.servicer.enter_graceful_shutdown()

    def status(self, name: str = OVERALL_HEALTH) -> int | None:
        """Return the ``ServingStatus`` value of ``name``, or None when it is not registered."""
        with self._lock:
            return self.servicer._server_status.get(name)  # noqa: SLF001 - read-only peek
