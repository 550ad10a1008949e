"""A real sidecar for the bad-input and security tests, built from configuration like ``serve``.

:class:`Rig` builds :class:`gpumetrics.runtime.Sidecar` from a configuration mapping (real
``DeclaredStore``, ``ProcessResourcer``, ``BatchStore``, ``SidecarServer`` with its tokens, TLS,
limits and sockets) with a stub collector that records one GPU point and one point per chosen
process each time :meth:`Rig.batch` is called; nothing NVML-related runs. ``identity.proc_root``
is an empty directory, so no pid of this machine is ever looked up.

:meth:`Rig.seed` stores batches and declares the *good* processes (pids :data:`GOOD_PIDS`,
declarer ``good-agent``); :meth:`Rig.snapshot` captures what must survive an attack, so a test
can assert ``rig.snapshot() == before`` afterwards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from gpumetrics.config import SidecarConfig
from gpumetrics.metrics import names
from gpumetrics.runtime import Sidecar
from gpumetrics.v1 import profiler_pb2 as ppb
from gpumetrics.v1 import profiler_pb2_grpc, pull_pb2_grpc
from grpc_health.v1 import health_pb2_grpc
from opentelemetry.proto.resource.v1 import resource_pb2

TIMEOUT = 10.0
GOOD_PIDS = (4_000_001, 4_000_002, 4_000_003)
GOOD_DECLARER = (("gpumetrics-declarer", "good-agent"),)
GPU_ATTRS = (("hw.id", "GPU-rig-0"), ("hw.type", "gpu"))
TASK = ("hw.gpu.task", "general")


class StubCollector:
    """The runtime's collector contract without NVML: ``ready`` is set at once."""

    def __init__(self, producer: Any, settings: Any, telemetry: Any) -> None:
        self.producer = producer
        self.ready = threading.Event()
        self.ready.set()

    def start(self) -> None:
        """Nothing to start: :meth:`Rig.batch` records the points."""

    def begin_stop(self) -> None:
        """Nothing runs."""

    def stop(self, timeout_s: float = 0.0) -> bool:
        return True

    def record(self, pids: Iterable[int]) -> None:
        now = time.time_ns()
        self.producer.record_host(lambda b: b.add(names.MetricPower, 250.0, now, GPU_ATTRS))
        for pid in pids:
            self.producer.record_process(
                pid,
                lambda b: b.add(names.MetricProcessUtilization, 0.5, now, (*GPU_ATTRS, TASK)),
            )


def good_declaration(pid: int) -> ppb.ProcessDeclaration:
    """A clean declaration; its profiler resource (the process's GPU resource in the default
    profiler mode) carries ``service.name`` ``good-<pid>``, as an APM-aware profiler's would."""
    res = resource_pb2.Resource()
    for key, value in (("k8s.pod.name", f"pod-{pid}"), ("service.name", f"good-{pid}")):
        kv = res.attributes.add()
        kv.key, kv.value.string_value = key, value
    return ppb.ProcessDeclaration(
        pid=pid,
        start_time_ticks=1000 + pid % 1000,
        environment=[
            ppb.EnvironmentVariable(name="OTEL_SERVICE_NAME", value=f"good-{pid}".encode())
        ],
        profiler_resource=res.SerializeToString(),
    )


@dataclass(frozen=True)
class Snapshot:
    """What an attack must leave as it was."""

    appended_points: int
    released_points: int
    held_points: int
    dropped_points: int
    good: tuple[tuple[int, int, tuple[tuple[str, bytes], ...], str, str], ...]


class Rig:
    """See the module docstring.

    Args:
        tmp: a short private directory (holds the empty proc root and any unix socket).
        config: configuration mapping (``SidecarConfig``); ``server.listen`` defaults to
            ``127.0.0.1:0``.
        before_start: called with the ``SidecarServer`` before it starts (extra services).

    """

    def __init__(
        self,
        tmp: Path,
        config: Mapping[str, Any] | None = None,
        before_start: Any = None,
    ) -> None:
        (tmp / "proc").mkdir(exist_ok=True)
        data: dict[str, Any] = {k: dict(v) for k, v in (config or {}).items()}
        data.setdefault("server", {}).setdefault("listen", ["127.0.0.1:0"])
        # declarations on the main listener (as on a single-user host that allows it), never on
        # the machine's default profiler socket
        data["server"].setdefault("profiler_listen", [])
        data["server"].setdefault("allow_unauthenticated_declare", True)
        data.setdefault("identity", {}).update(
            proc_root=str(tmp / "proc"),
            host_pid_namespace=True,
            node_name="rig",
            in_kubernetes=False,
        )
        self.config = SidecarConfig.model_validate(data)
        made: list[StubCollector] = []

        def factory(producer: Any, settings: Any, telemetry: Any) -> StubCollector:
            made.append(StubCollector(producer, settings, telemetry))
            return made[0]

        self.sidecar = Sidecar(self.config, collector_factory=factory)
        self.collector = made[0]
        p = self.sidecar.parts
        self.server, self.store, self.declared, self.health = (
            p.server,
            p.store,
            p.declared,
            p.health,
        )
        self.telemetry = p.telemetry
        if before_start is not None:
            before_start(self.server)
        self.server.start()
        self.channels: list[grpc.Channel] = []

    @property
    def address(self) -> str:
        return self.server.addresses.listen[0]

    def channel(
        self, address: str | None = None, credentials: Any = None, **kw: Any
    ) -> grpc.Channel:
        target = address or self.address
        opts = list(kw.pop("options", ()))
        if credentials is None:
            ch = grpc.insecure_channel(target, options=opts)
        else:
            ch = grpc.secure_channel(target, credentials, options=opts)
        self.channels.append(ch)
        return ch

    def pull_stub(self, **kw: Any) -> pull_pb2_grpc.MetricsPullServiceStub:
        return pull_pb2_grpc.MetricsPullServiceStub(self.channel(**kw))

    def profiler_stub(self, **kw: Any) -> profiler_pb2_grpc.ProfilerIntegrationServiceStub:
        return profiler_pb2_grpc.ProfilerIntegrationServiceStub(self.channel(**kw))

    def health_stub(self, **kw: Any) -> health_pb2_grpc.HealthStub:
        return health_pb2_grpc.HealthStub(self.channel(**kw))

    def batch(self, pids: Iterable[int] = ()) -> int | None:
        """Record one GPU point (and one per pid), then store one batch; return its sequence."""
        self.collector.record(pids)
        return self.sidecar.parts.batcher.run_once()

    def seed(
        self, batches: int = 3, channel: grpc.Channel | None = None, metadata: Any = ()
    ) -> None:
        """Store ``batches`` batches (health turns SERVING) and declare :data:`GOOD_PIDS`."""
        for _ in range(batches):
            self.batch(GOOD_PIDS)
        stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel or self.channel())
        resp = stub.DeclareProcesses(
            ppb.DeclareProcessesRequest(processes=[good_declaration(p) for p in GOOD_PIDS]),
            metadata=(*GOOD_DECLARER, *metadata),
            timeout=TIMEOUT,
        )
        assert resp.accepted == len(GOOD_PIDS) and not resp.rejected, resp

    def snapshot(self) -> Snapshot:
        s = self.store.stats()
        good = []
        for pid in GOOD_PIDS:
            d, ok = self.declared.lookup(pid)
            assert ok and d is not None, f"good pid {pid} lost"
            good.append(
                (
                    d.pid,
                    d.start_time_ticks,
                    tuple(sorted(d.environment.items())),
                    repr(sorted(d.profiler_attributes.items())),
                    d.declarer,
                )
            )
        return Snapshot(
            s.appended_points,
            s.released_points,
            s.held_points,
            sum(s.dropped_points.values()),
            tuple(good),
        )

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        self.server.stop(0)
