"""Health that follows NVML: NOT_SERVING once NVML has been down too long (field case F32).

A container that lost access to ``/dev/nvidia*`` (a host ``systemctl daemon-reload`` under the
NVIDIA container runtime with systemd cgroups: NVIDIA/nvidia-container-toolkit #48) answers
NVML_ERROR_UNKNOWN to every call and every ``nvmlInit`` until it is restarted, while the sidecar
itself is fine. The collector then reports ``gpumetrics.nvml.up`` = 0 and serves no device
metrics; this gate additionally turns gRPC health of ``""`` and the pull service NOT_SERVING
after ``runtime.unhealthy_after_nvml_down_s``, so a Kubernetes liveness probe restarts the
container, and SERVING again as soon as NVML answers. A release on request (F13) is not a
failure and does not count.

The gate is checked after every batch (``runtime.batch_interval_s``, 10 s by default), so
health changes at most one batch interval after the threshold; it reads the collector's own
clock through ``nvml_down_s()``, so tests drive it with simulated time.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["NvmlLiveness"]

log = logging.getLogger(__name__)


class NvmlLiveness:
    """Turns ``collector.nvml_down_s()`` into ``health.set_nvml_healthy(...)``.

    Args:
        collector: the collector; without ``nvml_down_s`` (a stub) the gate does nothing.
        health: has ``set_nvml_healthy(bool)``.
        after_s: seconds NVML may be down before health turns NOT_SERVING; 0 disables it.

    """

    def __init__(self, collector: Any, health: Any, after_s: float) -> None:
        self._down_s = getattr(collector, "nvml_down_s", None)
        self._collector = collector
        self._health = health
        self._after_s = after_s
        self.healthy = True
        """What health was last told (True until NVML has been down for ``after_s``)."""

    def check(self) -> bool:
        """Compare how long NVML has been down with the threshold; return the verdict."""
        if self._after_s <= 0 or not callable(self._down_s):
            return True
        down = self._down_s()
        healthy = down is None or down < self._after_s
        if healthy != self.healthy:
            self.healthy = healthy
            reason = getattr(self._collector, "nvml_reason", "unknown")
            if healthy:
                log.info("NVML answers again: health SERVING")
            else:
                log.error(
                    "NVML has not answered for %.0f s (reason %s, "
                    "runtime.unhealthy_after_nvml_down_s = %g): health NOT_SERVING so that a "
                    "liveness probe restarts the sidecar",
                    down,
                    reason,
                    self._after_s,
                )
            self._health.set_nvml_healthy(healthy)
        return healthy
