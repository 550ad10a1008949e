"""Memory and recovery figures of the hardening work (issue 11), for the code of any checkout.

Every scenario runs the sidecar's real gRPC server in its own process
(``benchmarks.server_fixture``, or a push child), so the figures are that process's alone. With
``--code DIR`` the child imports ``gpumetrics`` from ``DIR`` (e.g. an older checkout's
``receiver/``) instead of this one: the same client then measures the code before and after a
change.

* ``declared``: 500 declarations with every field at its 64 KiB limit (about 197 KB each on the
  wire; the profiler resource and process context are thousands of short attributes, the
  environment one long ``OTEL_RESOURCE_ATTRIBUTES``), sent 5 per ``DeclareProcesses`` (what fits the
  default 1 MiB receive limit; the figures of docs/performance.md were taken with 15). Reports
  the server's RSS before and after, and how many were accepted and rejected.
* ``pulls``: a backlog of about 65 MB (``--backlog-mb``) of the sizing node's batches
  (``benchmarks.workload``), then 8 threads that each drain it (read positions advancing, nothing
  acknowledged) with ``max_bytes`` = 64 MiB, three times over. Reports the server's RSS before and
  its peak (``VmHWM``) over the run, and the answers' sizes.
* ``resync``: one ``StreamDeclarations`` stream begins a resync and sends 83,000 declarations
  that are all rejected (bad environment name), then ends. Reports RSS before, at the end of the
  stream (before it closes) and after it closed.
* ``calibrate`` (in this process): for typical and maximal declarations of several shapes (int,
  string, key-value-list and array attribute values; keys shared between declarations, as real
  attribute names are, or unique to each, as an attacker would send), ``tracemalloc``'s growth
  per declaration held against the store's estimate
  (:func:`gpumetrics.identity.footprint.declared_bytes`). A ratio above 1 would mean the
  estimate undercounts.
* ``push``: a child appends a small batch every 0.2 s and pushes (``push.interval_s`` 1 s) to an
  OTLP server in this process; the server is stopped for ``--outages`` seconds each and started
  again on the same port. Reports, per outage, the seconds from the restart to the first export
  that arrives.

Run: ``python -m benchmarks.hardening_bench declared|pulls|resync|push [--code DIR]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from gpumetrics.identity.ctxproto import encode_process_context
from gpumetrics.v1 import profiler_pb2 as ppb
from gpumetrics.v1 import profiler_pb2_grpc, pull_pb2, pull_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.resource.v1 import resource_pb2

from benchmarks.harness import emit, machine, proc_rss_bytes
from benchmarks.server_fixture import write_batches

ROOT = Path(__file__).resolve().parents[1]
FIELD_LIMIT = 65536
MiB = 1024 * 1024


def child_env(code: str | None) -> dict[str, str]:
    """The environment of a child that imports ``gpumetrics`` from ``code`` (None: this one)."""
    env = dict(os.environ)
    paths = [str(ROOT)] + ([code] if code else [])
    env["PYTHONPATH"] = os.pathsep.join([*reversed(paths), env.get("PYTHONPATH", "")])
    return env


class Server:
    """``benchmarks.server_fixture`` in a child process (stopped by :meth:`close`)."""

    def __init__(
        self, code: str | None, batches: Path | None = None, no_procfs: bool = False
    ) -> None:
        argv = [sys.executable, "-m", "benchmarks.server_fixture"]
        if batches is not None:
            argv += ["--batches", str(batches)]
        if no_procfs:
            argv.append("--no-procfs")
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=child_env(code),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if line[:1] != ["ADDR"]:
            raise RuntimeError(f"server_fixture did not start: {line}")
        self.address = line[1]

    def rss(self) -> tuple[int, int]:
        """``(VmRSS, VmHWM)`` of the server (bytes)."""
        return proc_rss_bytes(self.proc.pid)

    def close(self) -> int | None:
        """Stop the server; return the declarations it held (its ``DECLARED`` line)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        rest = self.proc.stdout.read().split()
        self.proc.wait(timeout=60)
        return int(rest[rest.index("DECLARED") + 1]) if "DECLARED" in rest else None


def _many_attributes(prefix: str, limit: int) -> dict[str, int]:
    """As many short int attributes as fit ``limit`` bytes of a serialized Resource."""
    attrs: dict[str, int] = {}
    res = resource_pb2.Resource()
    i = 0
    while True:
        kv = res.attributes.add(key=f"{prefix}{i:05d}")
        kv.value.int_value = i
        if res.ByteSize() > limit - 16:
            del res.attributes[-1]
            return attrs
        attrs[kv.key] = i
        i += 1


def max_declaration(pid: int) -> ppb.ProcessDeclaration:
    """A declaration with every field at its 64 KiB limit (most decoded bytes per wire byte)."""
    res = resource_pb2.Resource()
    for key, value in _many_attributes("p", FIELD_LIMIT).items():
        res.attributes.add(key=key).value.int_value = value
    ctx_attrs = _many_attributes("c", FIELD_LIMIT - 64)
    ctx = encode_process_context(ctx_attrs)
    while len(ctx) > FIELD_LIMIT:
        ctx_attrs.popitem()
        ctx = encode_process_context(ctx_attrs)
    name = "OTEL_RESOURCE_ATTRIBUTES"
    value = ",".join(f"k{i}=v" for i in range(20000)).encode()[: FIELD_LIMIT - len(name)]
    value = value[: value.rfind(b",")]
    return ppb.ProcessDeclaration(
        pid=pid,
        start_time_ticks=0,
        process_context=ctx,
        environment=[ppb.EnvironmentVariable(name=name, value=value)],
        profiler_resource=res.SerializeToString(),
    )


def _resource_bytes(kind: str, tag: str, limit: int) -> bytes:
    res = resource_pb2.Resource()
    i = 0
    while True:
        kv = res.attributes.add(key=f"{tag}{i:05d}")
        if kind == "int":
            kv.value.int_value = 1000 + i
        elif kind == "str":
            kv.value.string_value = f"v{i}"
        elif kind == "kvlist":
            kv.value.kvlist_value.values.add(key="a").value.int_value = i
        else:
            kv.value.array_value.values.add().int_value = i
        if res.ByteSize() > limit - 16:
            del res.attributes[-1]
            return res.SerializeToString()
        i += 1


def _typical(pid: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    res = resource_pb2.Resource()
    for key, value in (
        ("container.id", f"{pid:064x}"),
        ("k8s.namespace.name", "training"),
        ("k8s.pod.name", f"trainer-{pid}-7f9c"),
        ("k8s.pod.uid", f"0a1b2c3d-{pid:04d}-4e5f-8a9b-0c1d2e3f4a5b"),
        ("k8s.container.name", "trainer"),
        ("k8s.deployment.name", "trainer"),
        ("k8s.node.name", "gpu-node-7"),
        ("service.name", "trainer"),
        ("service.version", "2.3.1"),
        ("deployment.environment.name", "prod"),
        ("process.executable.name", "python3"),
        ("telemetry.sdk.language", "python"),
    ):
        res.attributes.add(key=key).value.string_value = value
    env = [
        ("OTEL_SERVICE_NAME", b"trainer"),
        ("OTEL_RESOURCE_ATTRIBUTES", b"team=ml,cost.center=4711"),
    ]
    return res.SerializeToString(), env


def run_calibrate(count: int = 40) -> dict[str, Any]:
    import gc
    import tracemalloc

    from gpumetrics.identity import DeclaredStore

    shapes: dict[str, Any] = {"typical": lambda pid: _typical(pid)}
    for kind in ("int", "str", "kvlist", "array"):
        for keys in ("shared", "unique"):
            shapes[f"max-{kind}-{keys}-keys"] = lambda pid, kind=kind, keys=keys: (
                _resource_bytes(kind, f"k{pid:03d}_" if keys == "unique" else "k_", 65536),
                [],
            )
    out = {}
    for name, make in shapes.items():
        inputs = [make(pid) for pid in range(1, count + 1)]
        store = DeclaredStore(max_bytes=2**62)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for pid, (resource, env) in zip(range(1, count + 1), inputs, strict=True):
            store.declare(pid, 0, b"", env, resource)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        traced = sum(st.size_diff for st in after.compare_to(before, "filename"))
        out[name] = {
            "wire_bytes": len(inputs[0][0]) + sum(len(k) + len(v) for k, v in inputs[0][1]),
            "traced_bytes": traced // count,
            "estimated_bytes": store.held_bytes // count,
            "traced_over_estimate": round(traced / store.held_bytes, 3),
        }
    return out


def run_declared(code: str | None, count: int = 500, per_request: int = 5) -> dict[str, Any]:
    template = max_declaration(1)
    server = Server(code, no_procfs=True)
    try:
        stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(
            grpc.insecure_channel(server.address)
        )
        rss0, _ = server.rss()
        accepted = rejected = 0
        reasons: set[str] = set()
        for start in range(0, count, per_request):
            batch = []
            for pid in range(1_000_000 + start, 1_000_000 + min(count, start + per_request)):
                d = ppb.ProcessDeclaration()
                d.CopyFrom(template)
                d.pid = pid
                batch.append(d)
            r = stub.DeclareProcesses(ppb.DeclareProcessesRequest(processes=batch), timeout=120)
            accepted += r.accepted
            rejected += len(r.rejected)
            reasons.update(x.reason.split(" (")[0][:60] for x in r.rejected)
        rss1, hwm = server.rss()
    finally:
        held = server.close()
    return {
        "declarations": count,
        "held_at_end": held,
        "wire_bytes_each": template.ByteSize(),
        "accepted": accepted,
        "rejected": rejected,
        "rss_before_mb": round(rss0 / 1e6, 1),
        "rss_after_mb": round(rss1 / 1e6, 1),
        "rss_peak_mb": round(hwm / 1e6, 1),
        "rss_per_accepted_kb": round((rss1 - rss0) / max(1, accepted) / 1e3, 1),
        "rejection": sorted(reasons)[:1],
    }


def _backlog(path: Path, megabytes: float) -> int:
    from benchmarks.server_fixture import read_batches

    template = path.with_suffix(".tpl")
    subprocess.run(
        [sys.executable, "-m", "benchmarks.workload", "--out", str(template), "--batches", "10"],
        cwd=ROOT,
        check=True,
        timeout=600,
    )
    batches = read_batches(template)
    reqs = []
    total = 0
    while total < megabytes * 1e6:
        points, data = batches[len(reqs) % len(batches)]
        reqs.append(metrics_service_pb2.ExportMetricsServiceRequest.FromString(data))
        total += len(data)
    write_batches(reqs, path)
    return total


def run_pulls(code: str | None, backlog_mb: float, threads: int = 8, rounds: int = 3) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "backlog.bin"
        total = _backlog(path, backlog_mb)
        server = Server(code, batches=path)
    try:
        rss0, _ = server.rss()
        channel = grpc.insecure_channel(
            server.address, options=[("grpc.max_receive_message_length", 256 * MiB)]
        )
        stub = pull_pb2_grpc.MetricsPullServiceStub(channel)
        sizes: list[int] = []
        refused = [0]
        lock = threading.Lock()

        def drain(i: int) -> None:
            for _ in range(rounds):
                pos, epoch = 0, ""
                while True:
                    try:
                        r = stub.Pull(
                            pull_pb2.PullRequest(
                                consumer=f"c{i}",
                                ack_epoch=epoch,
                                read_after_sequence=pos,
                                max_bytes=64 * MiB,
                            ),
                            timeout=120,
                        )
                    except grpc.RpcError as err:
                        if err.code() is grpc.StatusCode.UNAVAILABLE:
                            with lock:
                                refused[0] += 1
                            time.sleep(0.05)  # the client's back-off before it resends
                            continue
                        raise
                    epoch = r.epoch
                    with lock:
                        sizes.append(len(r.export_metrics_service_request))
                    if not r.last_sequence or not r.more:
                        break
                    pos = r.last_sequence

        t0 = time.perf_counter()
        with futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(drain, range(threads)))
        elapsed = time.perf_counter() - t0
        rss1, hwm = server.rss()
    finally:
        server.close()
    return {
        "backlog_mb": round(total / 1e6, 1),
        "threads": threads,
        "answers": len(sizes),
        "largest_answer_mb": round(max(sizes) / 1e6, 2),
        "unavailable_retries": refused[0],
        "seconds": round(elapsed, 1),
        "rss_before_mb": round(rss0 / 1e6, 1),
        "rss_peak_mb": round(hwm / 1e6, 1),
        "rss_after_mb": round(rss1 / 1e6, 1),
    }


def run_resync(code: str | None, events: int = 83_000) -> dict[str, Any]:
    import queue

    server = Server(code)
    try:
        stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(
            grpc.insecure_channel(server.address)
        )
        rss0, _ = server.rss()
        out: queue.Queue[Any] = queue.Queue()
        responses = stub.StreamDeclarations(
            iter(out.get, None), metadata=(("gpumetrics-declarer", "bench"),), timeout=600
        )
        out.put(ppb.StreamDeclarationsRequest(resync_begin=ppb.ResyncBegin()))
        next(responses)
        bad = [ppb.EnvironmentVariable(name="NOT_OTEL", value=b"x")]
        rejected = 0
        for i in range(events):
            out.put(
                ppb.StreamDeclarationsRequest(
                    declare=ppb.ProcessDeclaration(pid=1 + i, environment=bad)
                )
            )
            rejected += not next(responses).accepted
        rss_open, _ = server.rss()
        out.put(ppb.StreamDeclarationsRequest(resync_end=ppb.ResyncEnd()))
        next(responses)
        out.put(None)
        for _ in responses:
            pass
        rss_closed, hwm = server.rss()
    finally:
        server.close()
    return {
        "events": events,
        "rejected": rejected,
        "rss_before_mb": round(rss0 / 1e6, 1),
        "rss_stream_open_mb": round(rss_open / 1e6, 1),
        "rss_after_close_mb": round(rss_closed / 1e6, 1),
        "rss_peak_mb": round(hwm / 1e6, 1),
    }


# -- push -------------------------------------------------------------------------------------


class _Collector(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
        with self.lock:
            self.arrivals.append(time.monotonic())
        return metrics_service_pb2.ExportMetricsServiceResponse()


def _start_collector(fake: _Collector, port: int) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(fake, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, bound


def push_child(endpoint: str) -> int:
    """The sidecar side of ``push``: a store fed every 0.2 s and a PushExporter (until stdin)."""
    from gpumetrics.service.push import PushExporter, PushSettings
    from gpumetrics.store import BatchStore

    def build_request(points: int) -> Any:
        req = metrics_service_pb2.ExportMetricsServiceRequest()
        gauge = req.resource_metrics.add().scope_metrics.add().metrics.add(name="g").gauge
        for i in range(points):
            gauge.data_points.add(time_unix_nano=time.time_ns(), as_int=i)
        return req

    store = BatchStore()
    exporter = PushExporter(
        store, PushSettings(endpoint=endpoint, insecure=True, interval_s=1.0, timeout_s=10.0)
    )
    exporter.start()
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.wait(0.2):
        store.append(build_request(10))
    exporter.shutdown(flush_timeout_s=1.0)
    return 0


def run_push(code: str | None, outages: list[float]) -> dict[str, Any]:
    fake = _Collector()
    server, port = _start_collector(fake, 0)
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.hardening_bench", "push-child", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=child_env(code),
        stdin=subprocess.PIPE,
    )
    delays = []
    try:
        deadline = time.monotonic() + 30
        while not fake.arrivals and time.monotonic() < deadline:
            time.sleep(0.05)
        for outage in outages:
            server.stop(0).wait()
            time.sleep(outage)
            server, _ = _start_collector(fake, port)
            back = time.monotonic()
            deadline = back + 120
            first = None
            while first is None and time.monotonic() < deadline:
                with fake.lock:
                    later = [t for t in fake.arrivals if t >= back]
                first = later[0] if later else None
                time.sleep(0.02)
            delays.append(round(first - back, 2) if first is not None else None)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=60)
        server.stop(0)
    return {"outages_s": outages, "resumed_after_s": delays}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "scenario", choices=["calibrate", "declared", "pulls", "resync", "push", "push-child"]
    )
    ap.add_argument("endpoint", nargs="?")
    ap.add_argument("--code", help="directory to import gpumetrics from (default: this checkout)")
    ap.add_argument("--backlog-mb", type=float, default=65.0)
    ap.add_argument("--outages", type=float, nargs="+", default=[5.0, 15.0, 30.0])
    args = ap.parse_args()
    if args.scenario == "push-child":
        return push_child(args.endpoint)
    runs = {
        "calibrate": run_calibrate,
        "declared": lambda: run_declared(args.code),
        "pulls": lambda: run_pulls(args.code, args.backlog_mb),
        "resync": lambda: run_resync(args.code),
        "push": lambda: run_push(args.code, args.outages),
    }
    result = runs[args.scenario]()
    emit(
        f"hardening.{args.scenario}",
        {"code": args.code or "this checkout", "result": result, "machine": machine()},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
