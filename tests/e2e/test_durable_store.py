"""End-to-end, the durable store (issue 25): the sidecar killed with SIGKILL at random moments
while the real Collector scrapes it, metrics and GPU events, into a counting sink.

The sidecar (``serve --store-path``) runs on the two-GPU simulated node of ``scenario.py`` whose
GPUs raise an Xid every 0.25 s of each run; it is killed ``kills`` times, each time started
again on the same store, then runs until the sink has everything. The Collector
(``collector-config/e2e-remote.yaml``: the gpumetrics receiver in both pipelines, file exporters)
keeps running throughout: its receiver resumes with its own acknowledgement. The test is a
second pull consumer of both stores, ``truth``, that sees every batch the sidecar stored (the
sink is the Collector's files, read as they grow).

Variants:

* ``kill9``: 30 kills. Every point and event record the sidecar stored reaches the sink at
  least once (0 lost), neither store's epoch ever changes, and the Collector never sees a
  restart; ``truth`` acknowledges what it read once the Collector is registered, so batches are
  also released from disk under the kills.
* ``disk_full``: the store on a small tmpfs (needs root and mount: skipped, with the reason,
  where mounting is not allowed) that a filler file fills after the 3rd kill and frees after the
  7th. While it is full the sidecar serves from memory under a new epoch (logged once per run
  and store, ``gpumetrics.store.durable{state="failed"}`` in the sink), health stays SERVING,
  and no run crash-loops; only points of those memory-only epochs may be lost, and every
  point stored on disk arrives.
* ``corrupt``: between runs the files are damaged (a garbage header on both; later a torn page
  in a batch of the metric store). The next run moves each damaged file aside (a timestamped
  name), starts afresh under a new epoch and keeps serving; only what the damaged files held
  may be lost.

``truth`` never acknowledges in the last two (it pins every batch, so a damaged file holds
data). Duplicates (deliveries re-sent after a kill before the receiver's acknowledgement
arrived) are counted and printed, not failed. The kill moments come from a seeded generator
(``GPUMETRICS_SEED`` overrides it; the seed is printed).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpumetrics.v1 import logs_pull_pb2, logs_pull_pb2_grpc, pull_pb2, pull_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from .harness import (
    CONFIG_DIR,
    POLL_INTERVAL_S,
    GpuProcess,
    Proc,
    clean_environ,
    gpumetrics_command,
    log_records,
    procs,
    profiler_address,
    wait_for,
)
from .otlp import JsonlFollower, flatten, flatten_logs, record_key
from .scenario import write_scenario

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("GPUMETRICS_SEED", "20260101"))
DRAIN_TIMEOUT_S = 180.0  # the last run delivers everything (loaded 2-core machine)
START_TIMEOUT_S = 60.0
XIDS = (13, 31, 43, 45, 48, 61, 62, 79)
NVML_EVENTS = [
    # an Xid every 0.25 s of each run, alternating GPUs, no two alike within a storm window
    {"device": i % 2, "type": "xid", "data": XIDS[(i // 2) % 8], "after_registration": 1,
     "delay_s": 0.25 * (i + 1)}
    for i in range(400)
]  # fmt: skip
RESTARTED = "The gpumetrics sidecar restarted (new store epoch); acknowledgement cursor reset"
MEMORY_EPOCH = re.compile(r"serves from memory only, (?:epoch|under a new epoch) ([0-9a-f]+)")


@dataclass(frozen=True)
class Kind:
    """One of the two stores, as the test reads it."""

    name: str
    pull: Callable[[grpc.Channel], Callable[..., Any]]
    request: type[Any]
    payload: str
    dropped: str
    parse: type[Any]
    keys: Callable[[Any], list[tuple[object, ...]]]


METRICS = Kind(
    "metrics",
    lambda ch: pull_pb2_grpc.MetricsPullServiceStub(ch).Pull,
    pull_pb2.PullRequest,
    "export_metrics_service_request",
    "dropped_data_points",
    ExportMetricsServiceRequest,
    lambda req: [p.key for p in flatten([req])],
)
LOGS = Kind(
    "logs",
    lambda ch: logs_pull_pb2_grpc.LogsPullServiceStub(ch).PullLogs,
    logs_pull_pb2.PullLogsRequest,
    "export_logs_service_request",
    "dropped_log_records",
    ExportLogsServiceRequest,
    lambda req: [record_key(r) for r in flatten_logs([req])],
)
KINDS = (METRICS, LOGS)


@dataclass
class Truth:
    """The test's own consumer of one store: every batch the sidecar stored, by epoch."""

    kind: Kind
    address: str
    acks: bool = False  # acknowledge what was read (once allowed)
    epoch: str = ""
    read: int = 0
    keys: dict[str, set[tuple[object, ...]]] = field(default_factory=dict)
    batches: set[tuple[str, int]] = field(default_factory=set)  # (epoch, sequence) read
    dropped: int = 0
    # (epoch, first, last, keys) of every answer, to name the batches a failure lost
    answers: list[tuple[str, int, int, frozenset[tuple[object, ...]]]] = field(default_factory=list)

    def drain(self) -> None:
        """Read what is new (a sidecar that is down or starting: nothing, no error)."""
        with grpc.insecure_channel(self.address) as ch:
            pull = self.kind.pull(ch)
            while True:
                request = self.kind.request(
                    consumer="truth",
                    ack_sequence=self.read if self.acks else 0,
                    ack_epoch=self.epoch,
                    read_after_sequence=self.read,
                )
                try:
                    r = pull(request, timeout=5)
                except grpc.RpcError as err:
                    if err.code() in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.CANCELLED,
                    ):
                        return
                    raise
                if r.epoch != self.epoch:
                    self.epoch, self.read = r.epoch, 0
                self.dropped += getattr(r, self.kind.dropped)
                if not r.last_sequence:
                    return
                req = self.kind.parse.FromString(getattr(r, self.kind.payload))
                got = frozenset(self.kind.keys(req))
                self.keys.setdefault(r.epoch, set()).update(got)
                self.answers.append((r.epoch, r.first_sequence, r.last_sequence, got))
                self.batches.update(
                    (r.epoch, q) for q in range(r.first_sequence, r.last_sequence + 1)
                )
                self.read = r.last_sequence
                if not r.more:
                    return

    def all_keys(
        self, leave_out: frozenset[str] | set[str] = frozenset()
    ) -> set[tuple[object, ...]]:
        return set().union(*(k for e, k in self.keys.items() if e not in leave_out))


class Sink:
    """What the Collector's file exporter wrote for one signal, counted per key."""

    def __init__(self, path: Path, kind: Kind) -> None:
        self._follow = JsonlFollower(path, kind.parse)
        self.kind = kind
        self.counts: Counter[tuple[object, ...]] = Counter()
        self.requests = 0
        self.durable: set[tuple[object, object]] = set()  # (value, state) of the metric store

    def update(self) -> None:
        for req in self._follow.new():
            self.requests += 1
            self.counts.update(self.kind.keys(req))
            if self.kind is METRICS:
                for p in flatten([req]):
                    if p.metric == "gpumetrics.store.durable" and p.attr("signal") is None:
                        self.durable.add((p.value, p.attr("state")))


def serving(address: str) -> bool | None:
    """Health ``""``: True SERVING, False NOT_SERVING, None not answering."""
    try:
        with grpc.insecure_channel(address) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
    except grpc.RpcError:
        return None
    return bool(r.status == health_pb2.HealthCheckResponse.SERVING)


def stored_keys(store: Path, kind: Kind) -> set[tuple[object, ...]]:
    """The keys of every batch a killed sidecar's file holds (read from a copy)."""
    src = store / f"{kind.name}.sqlite"
    if not src.exists():
        return set()
    copy = store.parent / f"read-{kind.name}"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    for f in store.glob(f"{kind.name}.sqlite*"):
        shutil.copy2(f, copy / f.name)
    keys: set[tuple[object, ...]] = set()
    with closing(sqlite3.connect(copy / src.name)) as conn:
        for (data,) in conn.execute("SELECT data FROM batches"):
            keys.update(kind.keys(kind.parse.FromString(data)))
    shutil.rmtree(copy)
    return keys


def checkpoint(path: Path) -> None:
    """Fold a killed sidecar's WAL into its file (as its own clean close would)."""
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def garbage_header(path: Path) -> None:
    checkpoint(path)
    with open(path, "r+b") as f:
        f.write(os.urandom(100))


def torn_batch_page(path: Path) -> None:
    """The first half of a page holding batch data overwritten, as a torn write leaves it."""
    checkpoint(path)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        try:
            pages = [
                r[0]
                for r in conn.execute(
                    "SELECT pageno FROM dbstat WHERE name = 'batches' AND pagetype = 'overflow'"
                )
            ]
        except sqlite3.OperationalError:  # an SQLite built without dbstat: the header then
            pages = [1]
    assert pages, "no batch data to tear"
    with open(path, "r+b") as f:
        f.seek((pages[len(pages) // 2] - 1) * 4096)
        f.write(os.urandom(2048))


@pytest.fixture
def store_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """The sidecar's store.path: a plain directory, or for ``disk_full`` a 4 MiB tmpfs."""
    target = tmp_path / "store"
    target.mkdir()
    if request.node.callspec.params["variant"] != "disk_full":
        yield target
        return
    mount = ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(target)]
    try:
        done = subprocess.run(mount, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a size-limited tmpfs for the store: {exc}")
    if done.returncode != 0:
        why = done.stderr.strip() or f"mount exited {done.returncode}"
        pytest.skip(f"cannot mount a size-limited tmpfs for the store: {why}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True, timeout=30)


def fill(directory: Path) -> Path:
    """A file taking every free byte of ``directory``'s filesystem."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (65536, 4096, 512):  # the last bytes in smaller pieces
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    return filler


@pytest.mark.parametrize(("variant", "kills"), [("kill9", 30), ("disk_full", 10), ("corrupt", 8)])
def test_sigkill_loop_loses_nothing_the_sidecar_stored(
    variant: str,
    kills: int,
    otelcol: Path,
    tmp_path: Path,
    store_dir: Path,
    gpu_processes: tuple[GpuProcess, GpuProcess],
) -> None:
    rng = random.Random(f"{SEED}-{variant}")
    address = f"unix:{tmp_path}/gm.sock"
    scenario = write_scenario(
        tmp_path / "node.yaml", gpu_processes[0].pid, gpu_processes[1].pid, nvml_events=NVML_EVENTS
    )
    sidecar_argv = [
        str(gpumetrics_command()), "serve", "--simulate", str(scenario), "--listen", address,
        "--profiler-listen", profiler_address(address),  # its own, not the machine's default
        "--batch-interval", "0.5", "--collection-interval", "1", "--node-name", "e2e-node",
        "--store-path", str(store_dir),
    ]  # fmt: skip
    outputs = {k: tmp_path / f"{k.name}.jsonl" for k in KINDS}
    collector_env = clean_environ(
        {
            "SIDECAR_ENDPOINT": address,
            "E2E_OUTPUT": str(outputs[METRICS]),
            "E2E_EVENTS_OUTPUT": str(outputs[LOGS]),
        }
    )
    # truth starts without acknowledging (see poll): a batch it alone acknowledged before the
    # Collector's first Pull registered the Collector would be released, and a consumer
    # registers just before the oldest batch held (docs/protocol.md), so the Collector would never
    # be sent it: the store's rule, but the test's loss
    truths = {k: Truth(k, address) for k in KINDS}
    sinks = {k: Sink(outputs[k], k) for k in KINDS}
    lost_allowed: set[tuple[object, ...]] = set()  # what damaged files held (corrupt)
    runs: list[Proc] = []
    filler: Path | None = None

    def poll() -> None:
        for k in KINDS:
            truths[k].drain()
            sinks[k].update()
            # acknowledge only once the Collector is registered in this store (its first
            # delivery is in the sink): an acknowledgement of truth alone would release
            # batches before the Collector's first Pull
            truths[k].acks = truths[k].acks or (variant == "kill9" and sinks[k].requests > 0)

    def diagnostics() -> str:
        return "\n".join(p.log_tail(4000) for p in [*runs[-2:], collector])

    with procs() as started:
        collector = Proc(
            "otelcol", [otelcol, f"--config={CONFIG_DIR / 'e2e-remote.yaml'}"], collector_env,
            tmp_path / "otelcol.log",
        )  # fmt: skip
        started.append(collector)

        def start_run() -> Proc:
            proc = Proc(f"sidecar-{len(runs)}", sidecar_argv, clean_environ(),
                        tmp_path / f"sidecar-{len(runs)}.log")  # fmt: skip
            started.append(proc)
            runs.append(proc)
            return proc

        for n in range(kills):
            proc = start_run()
            began = time.monotonic()
            early = variant == "kill9" and n % 5 == 4  # during start-up and the store's load
            if not early:
                what = f"run {n} answering health"
                if variant == "kill9":
                    wait_for(lambda: serving(address) is not None, START_TIMEOUT_S, what,
                             diagnostics)  # fmt: skip
                else:  # health SERVING in every run, disk full or not
                    wait_for(lambda: serving(address), START_TIMEOUT_S, what, diagnostics)
                    poll()  # truth reads this run's first batch (each epoch is seen)
                if variant == "disk_full" and n == 3:  # the first run on the full disk

                    def reported() -> bool:
                        poll()
                        return (1, "failed") in sinks[METRICS].durable

                    wait_for(reported, START_TIMEOUT_S, 'state="failed" in the sink', diagnostics)
                began = time.monotonic()
            kill_at = began + (rng.uniform(0.0, 1.5) if early else rng.uniform(0.0, 3.0))
            while time.monotonic() < kill_at:  # the random moment: keep reading until then
                poll()
                time.sleep(POLL_INTERVAL_S)
            assert proc.running(), f"run {n} exited by itself\n{proc.log_tail()}"
            if not early and variant != "kill9":
                assert serving(address), f"run {n}: health is not SERVING\n{proc.log_tail()}"
            proc.stop(timeout_s=10, sig=signal.SIGKILL)
            if variant == "disk_full" and n == 2:
                filler = fill(store_dir)
            if variant == "disk_full" and n == 6 and filler is not None:
                filler.unlink()
            if variant == "corrupt" and n in (2, 5):
                damaged = KINDS if n == 2 else (METRICS,)
                for k in damaged:
                    lost_allowed |= stored_keys(store_dir, k)
                    path = store_dir / f"{k.name}.sqlite"
                    (garbage_header if n == 2 else torn_batch_page)(path)

        last = start_run()
        wait_for(lambda: serving(address), START_TIMEOUT_S, "the last run serving", diagnostics)
        poll()  # the last reading: what the sidecar stored up to now is what must arrive (the
        # last run keeps appending, and the sink can never catch up with a reader that keeps
        # reading the newest batch)

        def delivered() -> bool:
            for k in KINDS:
                sinks[k].update()
            return all(
                truths[k].all_keys(memory_epochs(runs)) - lost_allowed <= set(sinks[k].counts)
                for k in KINDS
            )

        wait_for(delivered, DRAIN_TIMEOUT_S, "every stored point and record in the sink",
                 lambda: summary(truths, sinks, runs, lost_allowed) + diagnostics())  # fmt: skip
        assert collector.stop(timeout_s=30) == 0, collector.log_tail()
        for k in KINDS:
            sinks[k].update()  # what the exporter flushed at shutdown
        assert last.stop(timeout_s=30) == 0, last.log_tail()

    figures = summary(truths, sinks, runs, lost_allowed)
    print(f"\nkill -9 loop ({variant}, seed {SEED}, {kills} SIGKILLs): {figures}")
    leave_out = memory_epochs(runs)
    for k in KINDS:
        expected = truths[k].all_keys(leave_out) - lost_allowed
        assert expected <= set(sinks[k].counts), (k.name, figures)
        assert truths[k].dropped == 0, (k.name, "the store dropped data", figures)
    for n, run in enumerate(runs):
        text = run.log_path.read_text(errors="replace")
        assert "Traceback" not in text, run.log_tail()
        for k in KINDS:  # at most one WARNING about the store per run and store
            warned = re.findall(rf"\[WARN\].*store\.path: .*{k.name}\.sqlite", text)
            assert len(warned) <= 1, (n, warned)
    restarts = [r for r in log_records(collector.log_path) if r.get("msg") == RESTARTED]
    if variant == "kill9":
        assert not leave_out and not lost_allowed
        for k in KINDS:
            assert len(truths[k].keys) == 1, f"{k.name}: the epoch changed: {truths[k].keys}"
        assert not restarts, "the Collector saw a new epoch"
    if variant == "disk_full":
        assert leave_out, "the full disk never made a store serve from memory"
        states = sinks[METRICS].durable
        assert (1, "failed") in states and (1, "ok") in states, states
    if variant == "corrupt":
        for k in KINDS:
            moved = sorted(store_dir.glob(f"{k.name}.sqlite.corrupt-*"))
            moved = [m for m in moved if not m.name.endswith("-wal")]
            assert len(moved) == (2 if k is METRICS else 1), moved
            assert all(re.search(r"\.corrupt-\d{8}T\d{6}Z(-\d+)?$", m.name) for m in moved)
            assert len(truths[k].keys) == (3 if k is METRICS else 2), "a fresh epoch each time"


def memory_epochs(runs: list[Proc]) -> set[str]:
    """Epochs the sidecar's runs served from memory only (their WARNING names them)."""
    found: set[str] = set()
    for run in runs:
        found.update(MEMORY_EPOCH.findall(run.log_path.read_text(errors="replace")))
    return found


def summary(
    truths: dict[Kind, Truth], sinks: dict[Kind, Sink], runs: list[Proc], allowed: set[Any]
) -> str:
    """Stored, received, lost and duplicated, per signal (the figures docs/e2e.md quotes)."""
    leave_out = memory_epochs(runs)
    parts = []
    for k in KINDS:
        t, s = truths[k], sinks[k]
        stored = t.all_keys()
        durable = t.all_keys(leave_out) - allowed
        received = sum(s.counts.values())
        parts.append(
            f"{k.name}: {len(t.batches)} batches / {len(stored)} "
            f"{'points' if k is METRICS else 'records'} stored (epochs {len(t.keys)}), "
            f"{received} received, {len(durable - set(s.counts))} lost of {len(durable)} on "
            f"disk, {len(stored - durable - set(s.counts))} lost of {len(stored - durable)} "
            f"memory-only or in damaged files, {received - len(set(s.counts))} duplicates"
        )
        seen = set(s.counts) | allowed
        missing = [f"{e}:{a}..{b}" for e, a, b, ks in t.answers if e not in leave_out and ks - seen]
        if missing:  # which batches: where in the runs to look
            parts[-1] += f" (lost from batches {', '.join(missing[:10])})"
    return "; ".join(parts)
