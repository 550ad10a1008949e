"""Every memory attack of issue 11 at once against one sidecar: peak RSS stays under the ceiling.

``docs/deployment.md`` ("Memory") states the ceiling for the default limits, :data:`CEILING_MIB`.
The sidecar runs in its own process (``memory_sidecar.py``: default configuration, a 40 MB
backlog as a Collector that was away finds it) so its peak RSS (``VmHWM``) is its own. Then, at
the same time, over its unix socket:

* declarations with every field at its 64 KiB limit and unique attribute names (the most
  memory per wire byte) for live pids, until far past ``identity.declared.max_bytes``;
* 8 threads draining the whole backlog twice each with ``max_bytes`` = 64 MiB (no
  acknowledgement), answering UNAVAILABLE (the pull budget) with a short back-off;
* a resync whose 30,000 declarations are all rejected;
* requests over the receive limit;
* a well-behaved consumer pulling the default answer, which must be served.

Bounded in count (no duration), loopback only; the bound is generous, not a timing.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from gpumetrics.v1 import profiler_pb2 as ppb
from gpumetrics.v1 import profiler_pb2_grpc, pull_pb2, pull_pb2_grpc
from gpumetrics.wire import len_field
from opentelemetry.proto.resource.v1 import resource_pb2

CEILING_MIB = 450
"""Peak RSS bound with the default limits (docs/deployment.md, "Memory")."""

BACKLOG_MB = 40
HERE = Path(__file__).resolve().parent
TIMEOUT = 120.0
MiB = 1024 * 1024


def vm(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} for {pid}")


def live_pids(n: int) -> list[int]:
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    return pids[:n]


def _fitting(tag: str, limit: int) -> int:
    """How many attributes named like :func:`_resource`'s fit ``limit`` bytes (names are all as
    long: the count is the same for every pid)."""
    res = _resource(tag, 0, 1)
    per = res.ByteSize()
    return (limit - 64) // per


def _resource(tag: str, pid: int, n: int) -> resource_pb2.Resource:
    res = resource_pb2.Resource()
    for i in range(n):
        res.attributes.add(key=f"{tag}{pid:07d}_{i:05d}").value.int_value = 10_000 + i
    return res


def max_declaration(pid: int) -> ppb.ProcessDeclaration:
    """Every field near its 64 KiB limit; names unique to this pid (nothing shared to intern)."""
    ctx = _resource("c", pid, _fitting("c", 65536 - 16))
    env = ",".join(f"k{i}=v" for i in range(9000))[: 65536 - 40]
    return ppb.ProcessDeclaration(
        pid=pid,
        process_context=len_field(1, ctx.SerializeToString()),  # ProcessContext.resource
        environment=[ppb.EnvironmentVariable(name="OTEL_RESOURCE_ATTRIBUTES", value=env.encode())],
        profiler_resource=_resource("p", pid, _fitting("p", 65536)).SerializeToString(),
    )


def test_all_memory_attacks_at_once_stay_under_the_documented_ceiling(short_tmp, figures):
    child = subprocess.Popen(
        [sys.executable, str(HERE / "memory_sidecar.py"), str(short_tmp), str(BACKLOG_MB)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "READY"
        address = f"unix://{short_tmp / 'gm.sock'}"
        rss_ready = vm(child.pid, "VmRSS")
        errors: list[BaseException] = []
        served: list[int] = []
        counts = {"declared": 0, "rejected": 0, "pull_answers": 0, "pull_retries": 0}
        lock = threading.Lock()

        def guarded(fn):
            def run(*args):
                try:
                    fn(*args)
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    errors.append(exc)

            return run

        def channel() -> grpc.Channel:
            return grpc.insecure_channel(
                address, options=[("grpc.max_receive_message_length", 128 * MiB)]
            )

        @guarded
        def declare() -> None:
            stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel())
            pids = live_pids(150)
            for start in range(0, len(pids), 15):
                batch = [max_declaration(p) for p in pids[start : start + 15]]
                r = stub.DeclareProcesses(
                    ppb.DeclareProcessesRequest(processes=batch), timeout=TIMEOUT
                )
                with lock:
                    counts["declared"] += r.accepted
                    counts["rejected"] += len(r.rejected)

        @guarded
        def drain(i: int) -> None:
            stub = pull_pb2_grpc.MetricsPullServiceStub(channel())
            for _ in range(2):
                pos, epoch, retries = 0, "", 0
                while True:
                    try:
                        r = stub.Pull(
                            pull_pb2.PullRequest(
                                consumer=f"greedy-{i}",
                                ack_epoch=epoch,
                                read_after_sequence=pos,
                                max_bytes=64 * MiB,
                            ),
                            timeout=TIMEOUT,
                        )
                    except grpc.RpcError as err:
                        if err.code() is not grpc.StatusCode.UNAVAILABLE or retries > 2000:
                            raise
                        retries += 1
                        with lock:
                            counts["pull_retries"] += 1
                        time.sleep(0.02)  # the client's back-off before it resends
                        continue
                    epoch = r.epoch
                    with lock:
                        counts["pull_answers"] += 1
                    if not r.more:
                        break
                    pos = r.last_sequence

        @guarded
        def resync() -> None:
            stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel())
            out: queue.Queue = queue.Queue()
            responses = stub.StreamDeclarations(iter(out.get, None), timeout=TIMEOUT)
            out.put(ppb.StreamDeclarationsRequest(resync_begin=ppb.ResyncBegin()))
            bad = [ppb.EnvironmentVariable(name="NOT=VALID", value=b"x")]  # "=": never a name
            for pid in range(1, 30_001):  # sent ahead of the answers (gRPC flow control paces)
                decl = ppb.ProcessDeclaration(pid=pid, environment=bad)
                out.put(ppb.StreamDeclarationsRequest(declare=decl))
            out.put(None)
            answers = [r.accepted for r in responses]
            assert answers == [True] + [False] * 30_000

        @guarded
        def oversized() -> None:
            stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel())
            big = ppb.ProcessDeclaration(pid=1, profiler_resource=b"\x00" * (5 * MiB))
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as err:
                    stub.DeclareProcesses(
                        ppb.DeclareProcessesRequest(processes=[big]), timeout=TIMEOUT
                    )
                assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED

        @guarded
        def polite() -> None:
            stub = pull_pb2_grpc.MetricsPullServiceStub(channel())
            for _ in range(2000):
                try:
                    r = stub.Pull(pull_pb2.PullRequest(consumer="polite"), timeout=TIMEOUT)
                except grpc.RpcError as err:
                    if err.code() is not grpc.StatusCode.UNAVAILABLE:
                        raise
                    time.sleep(0.02)
                    continue
                served.append(r.data_points)
                return

        threads = [threading.Thread(target=declare), threading.Thread(target=resync)]
        threads += [threading.Thread(target=drain, args=(i,)) for i in range(8)]
        threads += [threading.Thread(target=oversized), threading.Thread(target=polite)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        peak = vm(child.pid, "VmHWM")
    finally:
        if child.stdin is not None:
            child.stdin.close()
        out_text = child.stdout.read() if child.stdout is not None else ""
        child.wait(timeout=60)
    stats = json.loads(out_text.strip().splitlines()[-1])
    for name, value in {
        "rss_ready_mib": rss_ready / MiB,
        "rss_peak_mib": peak / MiB,
        "ceiling_mib": CEILING_MIB,
        **counts,
        **stats,
    }.items():
        figures.set("memory_ceiling", name, round(value, 1))
    assert served and served[0] > 0  # the well-behaved consumer got its answer
    assert counts["rejected"] > 0 and counts["declared"] > 0  # the byte budget was reached
    assert stats["declared_held_bytes"] <= stats["declared_max_bytes"]
    assert stats["pull_budget_peak"] <= stats["pull_budget_limit"]
    assert stats["resyncs_in_progress"] == 0
    assert peak < CEILING_MIB * MiB, f"peak RSS {peak / MiB:.0f} MiB >= {CEILING_MIB} MiB"
