"""A sidecar in its own process, with the default limits and a backlog, for the memory ceiling.

``python tests/reliability/memory_sidecar.py DIR BACKLOG_MB [STORE_PATH]``

Builds :class:`gpumetrics.runtime.Sidecar` as ``serve`` does (default configuration: every
limit at its default; the default listeners, moved into ``DIR``: the pull service on
``unix:DIR/gm.sock`` and the profiler service on its own socket ``unix:DIR/profiler.sock``
through the peer-credentials relay; the real ``/proc`` so declarations of live pids are kept;
and, first, :func:`~gpumetrics.runtime.memory.return_large_buffers_to_the_os`, which ``serve``
calls), with a collector that records nothing, so only what clients do moves its memory.
Before serving it stores ``BACKLOG_MB`` of batches shaped like the store's sizing node (64
processes with typical resources, gauges sampled every second), as a Collector that was away
would find them. It prints ``READY`` and serves until its standard input closes, then prints one
JSON line of its stores' figures and exits. With ``STORE_PATH`` its stores are durable
(``store.path``): the backlog is committed to disk as it is appended, every Pull commits.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from gpumetrics.config import SidecarConfig
from gpumetrics.runtime import Sidecar
from gpumetrics.runtime.memory import return_large_buffers_to_the_os
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2


class _Idle:
    """The runtime's collector contract, recording nothing (``ready`` at once)."""

    def __init__(self, producer: Any, settings: Any, telemetry: Any) -> None:
        self.ready = threading.Event()
        self.ready.set()

    def start(self) -> None:
        """Nothing to collect."""

    def begin_stop(self) -> None:
        """Nothing runs."""

    def stop(self, timeout_s: float = 0.0) -> bool:
        return True


def batch(index: int, processes: int = 64, samples: int = 80) -> bytes:
    """About 1 MB: ``processes`` resources with ``samples`` points of two metrics each."""
    req = metrics_service_pb2.ExportMetricsServiceRequest()
    for p in range(processes):
        rm = req.resource_metrics.add()
        for key, value in (
            ("host.name", "memory-node"),
            ("process.pid", 100_000 + p),
            ("service.name", f"trainer-{p % 8}"),
            ("container.id", f"{p:064x}"),
            ("k8s.pod.name", f"trainer-{p}-7f9c4d"),
            ("k8s.namespace.name", "training"),
        ):
            kv = rm.resource.attributes.add(key=key)
            if isinstance(value, int):
                kv.value.int_value = value
            else:
                kv.value.string_value = value
        sm = rm.scope_metrics.add()
        sm.scope.name = "parca.nvidia_gpu_metrics"
        for name in ("nvidia.gpu.process.utilization", "nvidia.gpu.process.memory.usage"):
            gauge = sm.metrics.add(name=name, unit="1").gauge
            for s in range(samples):
                dp = gauge.data_points.add(
                    time_unix_nano=1_700_000_000_000_000_000 + (index * samples + s) * 10**9,
                    as_double=0.5,
                )
                dp.attributes.add(key="hw.id").value.string_value = f"GPU-{p % 8}"
    return req.SerializeToString()


def listeners(directory: Path) -> dict[str, list[str]]:
    """The default listeners with their sockets in ``directory`` (not the machine's /run).

    The profiler service on a socket of its own, through the relay that checks each caller's
    ``SO_PEERCRED`` (it trusts the test's own uid, as it trusts the sidecar's).
    """
    return {
        "listen": [f"unix:{directory / 'gm.sock'}"],
        "profiler_listen": [f"unix:{directory / 'profiler.sock'}"],
    }


def main() -> int:
    directory, backlog_mb = Path(sys.argv[1]), float(sys.argv[2])
    store_path = sys.argv[3] if len(sys.argv) > 3 else None
    return_large_buffers_to_the_os()
    config = SidecarConfig.model_validate(
        {
            "server": listeners(directory),
            "identity": {"node_name": "memory-node", "in_kubernetes": False},
            "store": {"path": store_path},
        }
    )
    sidecar = Sidecar(config, collector_factory=_Idle)
    store = sidecar.parts.store
    template, stored = batch(0), 0
    while stored < backlog_mb * 1e6:  # each batch its own copy, as the batcher makes them
        store.append_serialized(bytes(memoryview(template)), 64 * 2 * 80)
        stored += len(template)
    sidecar.start()
    print("READY", flush=True)
    sys.stdin.read()
    parts = sidecar.parts
    figures = {
        "backlog_bytes": stored,
        "declared_held_bytes": parts.declared.held_bytes,
        "declared_max_bytes": parts.declared.stats().max_bytes,
        "declared_rejected_bytes": parts.declared.stats().rejected_bytes,
        "pull_budget_peak": parts.server.pull.budget.peak,
        "pull_budget_limit": parts.server.pull.budget.limit,
        "resyncs_in_progress": parts.declared.resyncs_in_progress,
        "durable": parts.store.durable_state,
    }
    sidecar.request_stop("stdin closed")
    sidecar.shutdown(5.0)
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
