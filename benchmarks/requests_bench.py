"""Memory of the requests being read: requests at the receive limit held, queued and flooding.

The sidecar's gRPC server runs in a child process with the default ``ServerSettings`` and the
default listeners, their sockets in a temporary directory: the pull service on ``gm.sock``, the
profiler service on its own ``profiler.sock`` through the peer-credentials relay. Every request
is just under the child's receive limit (``--max-receive``, default the default): its padding is
an unknown field, which the parser keeps as bytes.

* ``held``: the child's declared store holds every ``exit`` until released, so each
  ``ReportExits`` call and each ``StreamDeclarations`` exit event keeps its thread and its
  parsed request. The client sends one unary call more than ``unary_workers`` and one stream
  more than ``max_streams``; reported: how many the child held (the threads that read), and the
  child's ``VmHWM`` over its idle ``VmRSS`` then. Next, ``--queued`` more unary calls at the
  limit, half on each socket, which wait for a thread; after ``--settle-s`` the peak again.
  ``--unary-workers 12`` holds 16 at once: as many as the default's threads may read (8 unary,
  and 4 streams each of the profiler service and reflection, whose servicer cannot be held).
* ``flood``: ``--callers`` threads (half on each socket, 8 connections per socket) send two
  requests at the limit each, answered at once (an invalid ``consumer``; a rejected entry);
  reported: the child's ``VmHWM`` over its idle ``VmRSS``.

With ``--code DIR`` the child imports ``gpumetrics`` from ``DIR`` (an older checkout's
``receiver/``), to measure the code before a change with the same client.

Run: ``python -m benchmarks.requests_bench held|flood [--code DIR]``.
"""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from gpumetrics.v1 import profiler_pb2 as ppb
from gpumetrics.v1 import pull_pb2

from benchmarks.harness import emit, machine, proc_rss_bytes

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
PAD_FIELD = 15  # a field number none of the requests uses: kept as an unknown field


def padded(message: Any, total: int) -> bytes:
    """``message`` serialized with an unknown bytes field that brings it to ``total`` bytes."""
    body = message.SerializeToString()
    size = total - len(body) - 8
    varint = bytearray()
    n = size
    while True:
        byte, n = n & 0x7F, n >> 7
        varint.append(byte | (0x80 if n else 0))
        if not n:
            break
    return body + bytes([PAD_FIELD << 3 | 2]) + bytes(varint) + b"\x00" * size


def serve(directory: Path, unary_workers: int | None, max_receive: int | None) -> int:
    """The child: the default server on ``directory``'s sockets, exits held until stdin closes."""
    from gpumetrics.identity import DeclaredStore
    from gpumetrics.selftelemetry import Telemetry
    from gpumetrics.service import ServerSettings, SidecarHealth, SidecarServer
    from gpumetrics.store import BatchStore

    try:  # what `gpumetrics serve` does first
        from gpumetrics.runtime.memory import return_large_buffers_to_the_os
    except ImportError:
        pass
    else:
        return_large_buffers_to_the_os()
    release = threading.Event()
    lock = threading.Lock()
    held = [0]

    class Holding(DeclaredStore):
        def exit(self, pid: int, start_time_ticks: int = 0) -> int:
            with lock:
                held[0] += 1
                print(f"HELD {held[0]}", flush=True)
            release.wait()
            return 0

    given: dict[str, int] = {}
    if unary_workers is not None:
        given["unary_workers"] = unary_workers
    if max_receive is not None:
        given["max_receive_message_bytes"] = max_receive
    settings = ServerSettings(
        listen=[f"unix:{directory / 'gm.sock'}"],
        profiler_listen=[f"unix:{directory / 'profiler.sock'}"],
        **given,
    )
    server = SidecarServer(settings, BatchStore(), Holding(), SidecarHealth(), Telemetry())
    server.start()
    limits = (settings.unary_workers, settings.max_streams, settings.max_receive_message_bytes)
    print("READY", *limits, flush=True)
    sys.stdin.read()
    release.set()
    server.stop(1.0)
    return 0


class Child:
    def __init__(
        self,
        directory: Path,
        code: str | None,
        unary_workers: int | None = None,
        max_receive: int | None = None,
    ) -> None:
        env = dict(os.environ)
        if code:
            env["PYTHONPATH"] = code
        given = [] if unary_workers is None else ["--unary-workers", str(unary_workers)]
        given += [] if max_receive is None else ["--max-receive", str(max_receive)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.requests_bench", "serve", str(directory), *given],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self.lines.get(timeout=60).split()
        assert ready[0] == "READY", ready
        self.unary_workers, self.max_streams, self.max_receive = map(int, ready[1:4])
        self.at_limit = self.max_receive - 256  # with gRPC's 5-byte prefix: under the limit
        self.idle_rss = proc_rss_bytes(self.proc.pid)[0]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def peak_over_idle_mib(self) -> float:
        return round((proc_rss_bytes(self.proc.pid)[1] - self.idle_rss) / MiB, 1)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def run_held(
    code: str | None,
    queued: int,
    settle_s: float,
    unary_workers: int | None,
    max_receive: int | None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gmr-", dir="/tmp") as tmp:
        d = Path(tmp)
        child = Child(d, code, unary_workers, max_receive)
        main, prof = f"unix://{d / 'gm.sock'}", f"unix://{d / 'profiler.sock'}"
        exits = padded(ppb.ReportExitsRequest(exits=[ppb.ProcessExit(pid=1)]), child.at_limit)
        event = padded(ppb.StreamDeclarationsRequest(exit=ppb.ProcessExit(pid=1)), child.at_limit)
        channels = [grpc.insecure_channel(t) for t in (prof, main)]
        unary = child.unary_workers + 1
        streams = child.max_streams + 1
        pool = futures.ThreadPoolExecutor(unary + streams + queued)
        try:
            exit_call = channels[0].unary_unary(
                "/gpumetrics.v1.ProfilerIntegrationService/ReportExits",
                request_serializer=None,
                response_deserializer=None,
            )
            stream_call = channels[0].stream_stream(
                "/gpumetrics.v1.ProfilerIntegrationService/StreamDeclarations",
                request_serializer=None,
                response_deserializer=None,
            )
            calls = [pool.submit(exit_call, exits, timeout=120) for _ in range(unary)]
            calls += [
                pool.submit(lambda: list(stream_call(iter([event]), timeout=120)))
                for _ in range(streams)
            ]
            held, deadline = 0, time.monotonic() + settle_s + 30
            expected = child.unary_workers + child.max_streams
            while held < expected and time.monotonic() < deadline:
                try:
                    held = int(child.lines.get(timeout=1).split()[1])
                except queue.Empty:
                    continue
            time.sleep(settle_s)  # the call and the stream beyond the limits: taken or not
            while not child.lines.empty():
                held = int(child.lines.get().split()[1])
            peak_held = child.peak_over_idle_mib()
            pull = channels[1].unary_unary(
                "/gpumetrics.v1.MetricsPullService/Pull",
                request_serializer=None,
                response_deserializer=None,
            )
            big_pull = pull_pb2.PullRequest(consumer="x" * child.at_limit).SerializeToString()
            calls += [
                pool.submit(exit_call if i % 2 else pull, exits if i % 2 else big_pull, timeout=120)
                for i in range(queued)
            ]
            time.sleep(settle_s)  # a benchmark, not a test: let the queued requests arrive
            peak_queued = child.peak_over_idle_mib()
        finally:
            child.close()
            for f in calls:
                try:
                    f.result(timeout=120)
                except grpc.RpcError:
                    pass
            pool.shutdown()
            for ch in channels:
                ch.close()
    return {
        "unary_workers": child.unary_workers,
        "max_streams": child.max_streams,
        "max_receive_message_bytes": child.max_receive,
        "held": held,
        "held_expected": expected,
        "hwm_over_idle_held_mib": peak_held,
        "queued": queued,
        "hwm_over_idle_held_and_queued_mib": peak_queued,
        "idle_rss_mib": round(child.idle_rss / MiB, 1),
    }


def run_flood(code: str | None, callers: int, max_receive: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gmr-", dir="/tmp") as tmp:
        d = Path(tmp)
        child = Child(d, code, None, max_receive)
        at_limit = child.at_limit
        targets = (f"unix://{d / 'gm.sock'}", f"unix://{d / 'profiler.sock'}")
        channels = {t: [grpc.insecure_channel(t) for _ in range(8)] for t in targets}
        requests = {
            targets[0]: (
                "/gpumetrics.v1.MetricsPullService/Pull",
                pull_pb2.PullRequest(consumer="x" * at_limit).SerializeToString(),
            ),
            targets[1]: (
                "/gpumetrics.v1.ProfilerIntegrationService/DeclareProcesses",
                ppb.DeclareProcessesRequest(
                    processes=[ppb.ProcessDeclaration(pid=1, profiler_resource=b"\0" * at_limit)]
                ).SerializeToString(),
            ),
        }
        outcomes: dict[str, int] = {}
        lock = threading.Lock()

        def flood(i: int) -> None:
            target = targets[i % 2]
            method, payload = requests[target]
            ch = channels[target][i // 2 % 8]
            call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
            for _ in range(2):
                try:
                    call(payload, timeout=120)
                    key = "answered"
                except grpc.RpcError as err:
                    key = err.code().name
                with lock:
                    outcomes[key] = outcomes.get(key, 0) + 1

        t0 = time.monotonic()
        threads = [threading.Thread(target=flood, args=(i,)) for i in range(callers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - t0
        peak = child.peak_over_idle_mib()
        child.close()
        for chans in channels.values():
            for ch in chans:
                ch.close()
    return {
        "callers": callers,
        "max_receive_message_bytes": child.max_receive,
        "outcomes": outcomes,
        "seconds": round(took, 1),
        "hwm_over_idle_mib": peak,
        "idle_rss_mib": round(child.idle_rss / MiB, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", choices=["held", "flood", "serve"])
    ap.add_argument("directory", nargs="?")
    ap.add_argument("--code", help="directory to import gpumetrics from (default: this checkout)")
    ap.add_argument("--queued", type=int, default=96)
    ap.add_argument("--settle-s", type=float, default=3.0)
    ap.add_argument("--callers", type=int, default=192)
    ap.add_argument(
        "--unary-workers",
        type=int,
        help="held: the child's server.unary_workers (default: the default, 8); 12 holds 16 "
        "requests at once, as many as the default's threads may read (8 unary, 4 + 4 streams)",
    )
    ap.add_argument("--max-receive", type=int, help="the child's server.max_receive_message_bytes")
    args = ap.parse_args()
    if args.scenario == "serve":
        return serve(Path(args.directory), args.unary_workers, args.max_receive)
    if args.scenario == "held":
        result = run_held(
            args.code, args.queued, args.settle_s, args.unary_workers, args.max_receive
        )
    else:
        result = run_flood(args.code, args.callers, args.max_receive)
    emit(f"requests.{args.scenario}", {**result, "code": args.code or "this", **machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
