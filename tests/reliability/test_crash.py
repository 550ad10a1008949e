"""Crash: `kill -9` of `gpumetrics serve --simulate` under load, restart, clean first collection.

The real console entry point (``python -m gpumetrics serve``) runs on a simulated 8-GPU node,
listening on a unix socket. A consumer thread pulls and acknowledges and a profiler thread
streams declarations (re-synchronising after every reconnect, as an agent does). Once both have
made progress the sidecar is killed with SIGKILL, which leaves its socket file behind, and
started again on the same address. Asserted: the restart binds despite the stale socket;
health goes NOT_SERVING → SERVING; the new epoch differs; the consumer's first answer in the
new epoch starts at sequence 1 and its stale acknowledgement is ignored; the first collection
cycle stored has every GPU with ``hw.status`` ``ok`` = 1 under the same ``hw.id`` as before (a
tick the loaded machine could not finish in time is an overrun, which leaves health alone);
declarations are accepted again; the load threads saw only UNAVAILABLE/CANCELLED while the
sidecar was down; the restarted process logged no traceback. All waits are on gRPC readiness
or events, with deadlines.
"""

from __future__ import annotations

import os
import queue
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpumetrics.v1 import profiler_pb2 as ppb
from gpumetrics.v1 import profiler_pb2_grpc, pull_pb2, pull_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from .soak_node import hw_status

START_S = 60.0
"""Deadline for a sidecar to start serving (the first collection included)."""
ALLOWED_DOWN = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}


class Sidecar:
    """One ``gpumetrics serve`` process; stderr goes to a file for the post-mortem."""

    def __init__(self, socket_path: Path, log: Path) -> None:
        self.address = f"unix://{socket_path}"
        self.profiler_address = f"unix://{socket_path.with_name('profiler.sock')}"
        self.log = log
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpumetrics",
                    "serve",
                    "--simulate",
                    "h100-8x-training",
                    "--listen",
                    self.address,
                    "--profiler-listen",  # its own socket, as by default (killed and reused too)
                    self.profiler_address,
                    "--batch-interval",
                    "0.2",
                    "--collection-interval",
                    "0.1",
                    "--log-level",
                    "warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def wait_serving(self) -> None:
        """Block until health ``""`` is SERVING (gRPC waits for the socket; Watch streams)."""
        with grpc.insecure_channel(self.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            for resp in stub.Watch(
                health_pb2.HealthCheckRequest(), wait_for_ready=True, timeout=START_S
            ):
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        raise AssertionError("health never turned SERVING")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=30) == -signal.SIGKILL

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


class Load:
    """A consumer and a profiler hammering the sidecar from their own threads until stopped."""

    def __init__(self, address: str, profiler_address: str) -> None:
        self.address = address
        self.profiler_address = profiler_address
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.down_codes: dict[str, int] = {}
        self.epochs: list[str] = []
        self.first_in_epoch: dict[str, int] = {}
        self.pulls: dict[str, int] = {}
        self.declared: dict[str, int] = {}
        self.progress = threading.Condition()
        self.epoch = ""
        self._threads = [
            threading.Thread(target=self._guard, args=(self._consume,), daemon=True),
            threading.Thread(target=self._guard, args=(self._declare,), daemon=True),
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _guard(self, fn: Any) -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(exc))

    def _down(self, err: grpc.RpcError) -> None:
        code = err.code()
        if code not in ALLOWED_DOWN:
            raise AssertionError(f"unexpected {code}: {err.details()}")
        self.down_codes[code.name] = self.down_codes.get(code.name, 0) + 1

    def _bump(self, table: dict[str, int], n: int = 1) -> None:
        with self.progress:
            table[self.epoch] = table.get(self.epoch, 0) + n
            self.progress.notify_all()

    def wait(self, table: dict[str, int], epoch: str, at_least: int, timeout: float) -> None:
        with self.progress:
            ok = self.progress.wait_for(lambda: table.get(epoch, 0) >= at_least, timeout)
        assert ok, f"no progress in epoch {epoch}: {table}, errors {self.errors}"

    def _consume(self) -> None:
        acked, epoch = 0, ""
        with grpc.insecure_channel(self.address) as ch:
            stub = pull_pb2_grpc.MetricsPullServiceStub(ch)
            for _ in range(200_000):
                if self.stop.is_set():
                    return
                try:
                    r = stub.Pull(
                        pull_pb2.PullRequest(
                            consumer="loader", ack_sequence=acked, ack_epoch=epoch
                        ),
                        wait_for_ready=True,
                        timeout=START_S,
                    )
                except grpc.RpcError as err:
                    self._down(err)
                    continue
                if r.epoch != epoch:
                    with self.progress:
                        self.epochs.append(r.epoch)
                        self.epoch = r.epoch
                    epoch, acked = r.epoch, 0
                if r.last_sequence:
                    self.first_in_epoch.setdefault(epoch, r.first_sequence)
                    acked = r.last_sequence
                    self._bump(self.pulls)
                self.stop.wait(0.01)  # pacing only

    def _declare(self) -> None:
        pids = list(range(700_001, 700_041))
        with grpc.insecure_channel(self.profiler_address) as ch:
            stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(ch)
            for _ in range(10_000):
                if self.stop.is_set():
                    return
                out: queue.Queue = queue.Queue()
                out.put(ppb.StreamDeclarationsRequest(resync_begin=ppb.ResyncBegin()))
                try:
                    answers = stub.StreamDeclarations(
                        iter(out.get, None),
                        metadata=(("gpumetrics-declarer", "crash-agent"),),
                        wait_for_ready=True,
                        timeout=600,
                    )
                    assert next(answers).accepted
                    for i in range(100_000):
                        if self.stop.is_set():
                            break
                        pid = pids[i % len(pids)]
                        out.put(
                            ppb.StreamDeclarationsRequest(
                                declare=ppb.ProcessDeclaration(
                                    pid=pid,
                                    environment=[
                                        ppb.EnvironmentVariable(
                                            name="OTEL_SERVICE_NAME", value=b"job"
                                        )
                                    ],
                                )
                            )
                        )
                        assert next(answers).accepted
                        self._bump(self.declared)
                        if i == len(pids):
                            out.put(ppb.StreamDeclarationsRequest(resync_end=ppb.ResyncEnd()))
                            assert next(answers).accepted
                    out.put(None)
                    list(answers)
                except grpc.RpcError as err:
                    out.put(None)
                    self._down(err)

    def join(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(30)
            assert not t.is_alive(), "a load thread did not stop"


@pytest.fixture
def sidecars(short_tmp: Path) -> Iterator[list[Sidecar]]:
    made: list[Sidecar] = []
    yield made
    for s in made:
        s.stop()


def _first_collection(
    address: str,
) -> tuple[str, metrics_service_pb2.ExportMetricsServiceRequest]:
    """The epoch and the oldest held batch that holds a collection cycle (``hw.status``).

    The batcher stores batches on its own interval from the start, so on a loaded machine the
    first batches may come before the first cycle finished and hold only self-telemetry. Health
    turns SERVING only after the first batch that follows a complete cycle is stored, so once the
    caller saw SERVING such a batch is held (or was already acknowledged by the load's
    consumer, which then holds later ones): this reads forward with ``read_after_sequence``
    (with the epoch it read, without which the sidecar ignores the position, docs/protocol.md)
    and never acknowledges, so it releases nothing the load's consumer has not seen.
    """
    after, epoch = 0, ""
    with grpc.insecure_channel(address) as ch:
        stub = pull_pb2_grpc.MetricsPullServiceStub(ch)
        for _ in range(1000):
            r = stub.Pull(
                pull_pb2.PullRequest(
                    consumer="inspector",
                    max_data_points=1,
                    ack_epoch=epoch,
                    read_after_sequence=after,
                ),
                timeout=30,
            )
            assert r.last_sequence, "health was SERVING but no batch holds a collection cycle"
            assert epoch in ("", r.epoch)
            epoch, after = r.epoch, r.last_sequence
            batch = metrics_service_pb2.ExportMetricsServiceRequest.FromString(
                r.export_metrics_service_request
            )
            if hw_status(batch, cycles=100):
                return epoch, batch
    raise AssertionError("no batch with hw.status among the first 1000")


def test_kill9_under_load_and_restart(sidecars, short_tmp: Path, form, figures, timed) -> None:
    sock = short_tmp / "gm.sock"
    log = short_tmp / "serve.log"
    sidecars.append(Sidecar(sock, log))
    sidecars[-1].wait_serving()
    first_epoch, batch = _first_collection(sidecars[-1].address)
    gpus = set(hw_status(batch, cycles=100))
    assert len(gpus) == 8, gpus
    load = Load(sidecars[-1].address, sidecars[-1].profiler_address)
    load.start()
    epoch = first_epoch
    try:
        for _round in range(form.crash_rounds):
            load.wait(load.pulls, load.epoch or epoch, 3, START_S)
            load.wait(load.declared, load.epoch or epoch, 50, START_S)
            sidecars[-1].kill9()
            assert stat.S_ISSOCK(os.lstat(sock).st_mode), "kill -9 should leave the socket file"
            log.write_text(log.read_text() + "\n--- restart ---\n")
            start_offset = len(log.read_bytes())
            sidecars.append(Sidecar(sock, log))
            sidecars[-1].wait_serving()
            new_epoch, batch = _first_collection(sidecars[-1].address)
            assert new_epoch != epoch
            statuses = hw_status(batch, cycles=100)
            assert set(statuses) == gpus, "the same GPUs under the same hw.id"
            assert all(s["ok"] == 1 for s in statuses.values()), (statuses, log.read_text()[-4000:])
            load.wait(load.pulls, new_epoch, 3, START_S)
            load.wait(load.declared, new_epoch, 50, START_S)
            assert load.first_in_epoch[new_epoch] == 1, load.first_in_epoch
            assert b"Traceback" not in log.read_bytes()[start_offset:]
            epoch = new_epoch
    finally:
        load.join()
    assert not load.errors, load.errors
    assert load.epochs[0] == first_epoch and len(set(load.epochs)) == form.crash_rounds + 1
    figures.add("crash", "kill9_restarts", form.crash_rounds)
    figures.add("crash", "pulls_during_run", sum(load.pulls.values()))
    figures.add("crash", "declarations_during_run", sum(load.declared.values()))
    for code, n in load.down_codes.items():
        figures.add("crash", f"client_errors_while_down.{code}", n)
