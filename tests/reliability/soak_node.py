"""A whole sidecar on a simulated node, driven cycle by cycle (no scheduler threads, no sleeps).

:class:`SoakNode` installs the simulated driver (manual clock) with the plan's faults, points
``identity.proc_root`` at a :class:`~.fakeproc.FakeProc` tree, builds the real
:class:`gpumetrics.runtime.Sidecar` from a :class:`SidecarConfig` (real ``DeclaredStore``,
``ProcessResourcer``, ``BatchStore`` and ``SidecarServer`` on a unix socket) with the real NVML
``Collector`` on the simulator's clock, and starts only the gRPC server. The soak then calls
:meth:`SoakNode.cycle`: one ``Collector.collect_once`` and one batch, whose collection
(``Producer.collect_parts``, parsed as one ``ExportMetricsServiceRequest``) is kept for
inspection and whose point count goes into the ``ledger`` (sequence -> points) *before* the
batch is appended, so concurrent consumers can check what they receive against it.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from gpumetrics.config import SidecarConfig
from gpumetrics.metrics import CollectionParts, count_points
from gpumetrics.nvml.collector import Collector, CycleReport
from gpumetrics.runtime import Batcher, Sidecar
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

import nvmlsim as sim

from .fakeproc import FakeProc
from .soak_plan import Plan

PID_MAX = 4_194_304
STORE_MAX_BYTES = 512 * 1024
STORE_MAX_POINTS = 1_800
DECLARED_MAX = 48
STATES = ("ok", "degraded", "failed", "predicted_failure")


def node_uuids(gpus: int) -> list[str]:
    """UUIDs of the first ``gpus`` GPUs of the default profile (the plan needs them first)."""
    return [d.uuid for d in sim.load_scenario(sim.DEFAULT_PROFILE).devices[:gpus]]


def node_scenario(gpus: int, plan: Plan) -> sim.Scenario:
    """The default 8×H100 training profile cut to ``gpus`` GPUs, with the plan's faults."""
    data = sim.load_scenario(sim.DEFAULT_PROFILE).model_dump(mode="json", exclude_none=True)
    devices = copy.deepcopy(data["devices"][:gpus])
    for i, d in enumerate(devices):
        d["index"] = i
    data.update(devices=devices, events=[], overrides=[], faults=plan.faults())
    return sim.scenario_from_data(data)


class _RecordingProducer:
    """Wraps the sidecar's Producer: keeps the last collection and writes the ledger first."""

    def __init__(self, producer: Any, store: Any, ledger: dict[int, int]) -> None:
        self._producer, self._store, self._ledger = producer, store, ledger
        self.last: metrics_service_pb2.ExportMetricsServiceRequest | None = None

    def collect_parts(self, max_bytes: int = 0) -> CollectionParts:
        collection = self._producer.collect_parts(max_bytes)
        request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(
            b"".join(data for data, _ in collection.parts)
        )
        self._ledger[self._store.last_sequence + 1] = count_points(request)
        assert count_points(request) == collection.points
        self.last = request
        return collection


class SoakNode:
    """See the module docstring. Use :func:`soak_node` (it cleans up)."""

    def __init__(self, tmp: Path, gpus: int, plan: Plan) -> None:
        self.drv = sim.install(node_scenario(gpus, plan), latency="clock", max_hang_s=20)
        clock = self.drv.clock
        scn = self.drv.scenario
        self.boot_unix = int(scn.clock.start_unix - scn.clock.uptime_s)
        self.proc = FakeProc(tmp / "proc", self.boot_unix)
        self.socket = str(tmp / "gm.sock")
        config = SidecarConfig.model_validate(
            {
                # every service on the one socket (its peer check trusts the test's own uid)
                "server": {
                    "listen": [f"unix://{self.socket}"],
                    "profiler_listen": [],
                    "max_streams": 4,
                },
                "store": {
                    "max_bytes": STORE_MAX_BYTES,
                    "max_data_points": STORE_MAX_POINTS,
                    "max_consumers": 8,
                },
                "collection": {
                    "pid_max": PID_MAX,
                    "pcie_interval_s": 0,
                    "errors_interval_s": 10,
                    # Real-time deadlines (workers.py): long enough that an unfaulted call on a
                    # loaded 2-core machine never reaches them, short enough that each hang
                    # costs only half a second.
                    "call_timeout_s": 0.5,
                    "cycle_timeout_s": 2.0,
                    "device_backoff_initial_s": 1,
                    "device_backoff_max_s": 2,
                    "init_backoff_initial_s": 1,
                    "init_backoff_max_s": 2,
                },
                "identity": {
                    "proc_root": str(self.proc.root),
                    "host_pid_namespace": True,
                    "node_name": "soak-node",
                    "in_kubernetes": False,
                    "declared": {"max_processes": DECLARED_MAX},
                },
                "runtime": {"batch_interval_s": 3600},
            }
        )
        now_ns = lambda: clock.now_us() * 1000  # noqa: E731
        boot_ns = self.boot_unix * 1_000_000_000
        made: list[Collector] = []

        def factory(producer: Any, settings: Any, telemetry: Any) -> Collector:
            made.append(
                Collector(
                    producer,
                    settings,
                    telemetry,
                    clock_ns=now_ns,
                    monotonic_ns=now_ns,
                    boot_time_ns=lambda: boot_ns,
                )
            )
            return made[0]

        self.sidecar = Sidecar(config, collector_factory=factory)
        self.collector: Collector = made[0]
        parts = self.sidecar.parts
        self.store, self.declared, self.health = parts.store, parts.declared, parts.health
        self.telemetry = parts.telemetry
        self.ledger: dict[int, int] = {}
        self.recorder = _RecordingProducer(parts.producer, self.store, self.ledger)
        self.batcher = Batcher(
            self.recorder, self.store, 3600, self.collector.ready, self.health.mark_ready
        )
        parts.server.start()
        self.address = parts.server.addresses.listen[0]
        self.channels: list[grpc.Channel] = []
        self.uuids = [d.uuid for d in scn.devices]
        self._health = health_pb2_grpc.HealthStub(self.channel())

    def channel(self) -> grpc.Channel:
        """A channel closed with the node (for the run's long-lived clients)."""
        ch = grpc.insecure_channel(self.address)
        self.channels.append(ch)
        return ch

    def dial(self) -> grpc.Channel:
        """A channel its caller closes (consumers that reconnect: the node keeps no reference)."""
        return grpc.insecure_channel(self.address)

    def cycle(self) -> tuple[CycleReport, metrics_service_pb2.ExportMetricsServiceRequest]:
        """Collect once at the current simulated time, then store one batch."""
        report = self.collector.collect_once()
        seq = self.batcher.run_once()
        assert seq == self.store.last_sequence and seq in self.ledger
        assert self.recorder.last is not None
        return report, self.recorder.last

    def health_status(self, service: str = "") -> int:
        return self._health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        self.drv.release_hangs()
        parts = self.sidecar.parts
        parts.server.stop(0)
        clean = self.collector.stop(5.0)
        sim.uninstall()
        assert clean, "collector did not stop cleanly (a worker still inside NVML)"


@contextmanager
def soak_node(gpus: int, plan: Plan) -> Iterator[SoakNode]:
    """A :class:`SoakNode` in a short private temporary directory (unix socket path limit)."""
    with tempfile.TemporaryDirectory(prefix="gm-soak-", dir="/tmp") as d:
        (Path(d) / "proc").mkdir()
        node = SoakNode(Path(d), gpus, plan)
        try:
            yield node
        finally:
            node.close()


def hw_status(
    request: metrics_service_pb2.ExportMetricsServiceRequest, cycles: int = 1
) -> dict[str, dict[str, int]]:
    """``hw.status`` points of a request: hw.id -> {hw.state: value} of its newest collection.

    ``cycles`` is how many collections the request may hold (one per batch in the soak, so a
    second point for the same series is an error there).
    """
    latest: dict[tuple[str, str], tuple[int, int]] = {}
    seen: dict[tuple[str, str], int] = {}
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name != "hw.status":
                    continue
                for dp in m.sum.data_points:
                    a = {kv.key: kv.value.string_value for kv in dp.attributes}
                    key = (a["hw.id"], a["hw.state"])
                    seen[key] = seen.get(key, 0) + 1
                    assert seen[key] <= cycles, f"{seen[key]} hw.status points for {a}"
                    if key not in latest or dp.time_unix_nano >= latest[key][0]:
                        latest[key] = (dp.time_unix_nano, dp.as_int)
    out: dict[str, dict[str, int]] = {}
    for (hw_id, state), (_, value) in latest.items():
        out.setdefault(hw_id, {})[state] = value
    return out


def process_services(request: metrics_service_pb2.ExportMetricsServiceRequest) -> dict[int, str]:
    """pid -> ``service.name`` of every per-process resource in a request."""
    out: dict[int, str] = {}
    for rm in request.resource_metrics:
        attrs = {kv.key: kv.value for kv in rm.resource.attributes}
        if "process.pid" in attrs:
            pid = attrs["process.pid"].int_value
            assert pid not in out, f"two resources for pid {pid}"
            out[pid] = attrs["service.name"].string_value if "service.name" in attrs else ""
    return out


def process_metrics(
    request: metrics_service_pb2.ExportMetricsServiceRequest,
) -> dict[int, set[str]]:
    """pid -> the metric names of its per-process resource in a request."""
    out: dict[int, set[str]] = {}
    for rm in request.resource_metrics:
        pids = [kv.value.int_value for kv in rm.resource.attributes if kv.key == "process.pid"]
        if pids:
            out[pids[0]] = {m.name for sm in rm.scope_metrics for m in sm.metrics}
    return out
