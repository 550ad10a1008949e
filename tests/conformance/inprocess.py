"""The python runner's sidecar: the real server and stores, in this process, on a unix socket.

Built from a case's ``config`` as the runtime builds them (``gpumetrics.runtime.Sidecar``):
``SidecarConfig`` validates it; the metric store has ``store.*``, the log store
``SidecarConfig.log_store_limits()``, the declared store ``identity.declared.*`` with the
runtime's procfs start-time reader; ``SidecarServer`` serves them with ``server.*``. What differs,
so that a case can control the stores: batches are appended by the runner (no collector runs),
both stores share one manual clock (``Clock`` of ``tests/store/conftest.py``), and the metric
store keeps the store's default batch cap instead of the runtime's (which splits collections to
fit ``server.pull_default_max_bytes``): so one case can store a batch larger than the server may
send, and provoke a delivery that fails.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
from gpumetrics.config import SidecarConfig
from gpumetrics.identity import DeclaredStore
from gpumetrics.identity.procfs import ProcfsReader
from gpumetrics.nvml.context import DEFAULT_PID_MAX
from gpumetrics.selftelemetry import Telemetry
from gpumetrics.service import SidecarHealth, SidecarServer
from gpumetrics.store import LOGS, BatchStore

from ..store.conftest import Clock


class InProcessSidecar:
    """See the module docstring.

    Args:
        config: the case's configuration (a sidecar configuration file's content).
        tmp: a short private directory for the unix sockets.

    """

    def __init__(self, config: Mapping[str, Any], tmp: Path) -> None:
        self._raw = copy.deepcopy(dict(config))
        self._tmp = tmp
        self._lives = 0
        self.clock = Clock()  # both stores' monotonic clock, moved only by `advance` steps
        self.channel: grpc.Channel
        self._start()

    def _start(self) -> None:
        self._lives += 1
        data = copy.deepcopy(self._raw)
        server = dict(data.get("server") or {})
        server["listen"] = [f"unix:{self._tmp}/life-{self._lives}.sock"]
        server["profiler_listen"] = []  # every service on the one socket (peer credentials: root)
        data["server"] = server
        self.config = config = SidecarConfig.model_validate(data)
        telemetry = Telemetry()
        self.store = BatchStore(config.store.limits(), telemetry=telemetry, clock=self.clock)
        self.logs_store = BatchStore(config.log_store_limits(), clock=self.clock, signal=LOGS)
        ident = config.identity
        procfs = ProcfsReader(
            ident.proc_root,
            host_pid_namespace=ident.host_pid_namespace,
            include_env_vars=ident.include_env_vars,
        )
        self.declared = DeclaredStore(
            **ident.declared.model_dump(),
            pid_max=config.collection.pid_max or DEFAULT_PID_MAX,
            start_time_reader=procfs.start_time_ticks,
        )
        health = SidecarHealth()
        self.server = SidecarServer(
            config.server, self.store, self.declared, health, telemetry, logs_store=self.logs_store
        )
        self.server.start()
        health.mark_ready()
        self.channel = grpc.insecure_channel(self.server.addresses.listen[0])

    def store_of(self, service: str) -> BatchStore:
        """The metric store (``pull``) or the log store (``logs``)."""
        return self.logs_store if service == "logs" else self.store

    def restart(self) -> None:
        """Stop serving and start afresh: new epochs, nothing held, no consumer or declaration."""
        self.close()
        self._start()

    def close(self) -> None:
        """Close the channel and stop the server."""
        self.channel.close()
        self.server.stop(0)
