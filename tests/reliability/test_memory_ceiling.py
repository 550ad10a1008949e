"""Memory attacks against one sidecar with the default limits: ``VmHWM`` stays under the ceiling.

``docs/deployment.md`` ("Memory") states the ceiling for the default limits, :data:`CEILING_MIB`.
Each test runs the sidecar in its own process, so its peak RSS (``VmHWM``) is its own.

Both run the default listeners (their sockets moved into the test's directory): the pull
service on ``gm.sock``, the profiler service on its own ``profiler.sock`` through the
peer-credentials relay, so each listener has a server of its own, as by default.

**Every attack of issue 11 at once** (``memory_sidecar.py``: default configuration, a 40 MB
backlog as a Collector that was away finds it), at the same time, over its unix sockets:

* declarations with every field at its 64 KiB limit and unique attribute names (the most
  memory per wire byte) for live pids, until far past ``identity.declared.max_bytes``;
* 8 threads draining the whole backlog twice each with ``max_bytes`` = 64 MiB (no
  acknowledgement), answering UNAVAILABLE (the pull budget) with a short back-off;
* a resync whose 30,000 declarations are all rejected;
* requests over the receive limit;
* a flood of requests at the receive limit on both sockets, :data:`FLOOD_CALLERS` at once (the
  calls in flight a server accepts), far more than the threads that read them: before BDP
  probing was turned off, gRPC buffered every waiting call's whole request (631 MiB with 4 MiB
  requests); a quarter of them made of empty environment variables, the most parsed memory per
  wire byte (28 times), refused before they are parsed;
* a well-behaved consumer pulling the default answer, which must be served.

**A node of 1 000 GPU processes with large declared resources** (issue 23, item 1;
``memory_node.py``: the simulated driver with 1 000 processes, the real collector driven 10
collections per batch, the default cadence): each process declared once with a ~56 KiB value,
nobody pulling until the store is full, then 8 greedy consumers; ``VmHWM`` under the ceiling and
a flat RSS once the stores are full.

Bounded in count (no duration), loopback only; the bounds are generous, not timings.
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
from gpumetrics.service import ServerSettings
from gpumetrics.v1 import profiler_pb2 as ppb
from gpumetrics.v1 import profiler_pb2_grpc, pull_pb2, pull_pb2_grpc
from gpumetrics.wire import len_field
from opentelemetry.proto.resource.v1 import resource_pb2

CEILING_MIB = 450
"""Peak RSS bound with the default limits (docs/deployment.md, "Memory")."""

BACKLOG_MB = 40
RECEIVE_LIMIT = ServerSettings().max_receive_message_bytes
PER_REQUEST = 5
"""Declarations at every field limit per request (about 197 KB each: 5 fit the receive limit)."""
FLOOD_CALLERS = 192
"""Callers of the flood, half on each socket: ``server.max_concurrent_rpcs`` of one server."""
FLOOD_ROUNDS = 2
FLOOD_CHANNELS = 8
"""Connections they share per socket (the relay serves 64 at once, every client together)."""
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


def empty_environment(entries: int) -> bytes:
    """A DeclareProcessesRequest of one declaration with ``entries`` empty environment variables:
    2 bytes each on the wire, a message each once parsed (about 54 bytes in upb)."""
    return len_field(1, b"\x08\x01" + b"\x22\x00" * entries)  # processes[0]: pid 1, env (4)


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "store.path"])
def test_all_memory_attacks_at_once_stay_under_the_documented_ceiling(short_tmp, figures, durable):
    store = [str(short_tmp / "store")] if durable else []
    child = subprocess.Popen(
        [sys.executable, str(HERE / "memory_sidecar.py"), str(short_tmp), str(BACKLOG_MB), *store],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "READY"
        address = f"unix://{short_tmp / 'gm.sock'}"
        profiler = f"unix://{short_tmp / 'profiler.sock'}"
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

        def channel(target: str = address) -> grpc.Channel:
            return grpc.insecure_channel(
                target, options=[("grpc.max_receive_message_length", 128 * MiB)]
            )

        @guarded
        def declare() -> None:
            stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel(profiler))
            pids = live_pids(150)
            for start in range(0, len(pids), PER_REQUEST):
                batch = [max_declaration(p) for p in pids[start : start + PER_REQUEST]]
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
            stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel(profiler))
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
            stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel(profiler))
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

        flood_channels = {
            target: [channel(target) for _ in range(FLOOD_CHANNELS)]
            for target in (address, profiler)
        }
        at_limit = RECEIVE_LIMIT - 256  # with the envelope, just under the receive limit
        declare_method = "/gpumetrics.v1.ProfilerIntegrationService/DeclareProcesses"
        flood_requests = [
            (  # on the main socket
                "/gpumetrics.v1.MetricsPullService/Pull",
                pull_pb2.PullRequest(consumer="x" * at_limit).SerializeToString(),
                grpc.StatusCode.INVALID_ARGUMENT,  # a consumer name that long
            ),
            (  # on the profiler socket: one field as long as the limit allows
                declare_method,
                ppb.DeclareProcessesRequest(
                    processes=[ppb.ProcessDeclaration(pid=1, profiler_resource=b"\x00" * at_limit)]
                ).SerializeToString(),
                None,  # answered, the entry rejected (the field is over its 64 KiB)
            ),
            (  # on the profiler socket: as many empty environment variables as fit (2 B each)
                declare_method,
                empty_environment((at_limit - 16) // 2),
                grpc.StatusCode.RESOURCE_EXHAUSTED,  # more elements than one per 128 B: unparsed
            ),
        ]

        @guarded
        def flood(i: int) -> None:
            target = (address, profiler)[i % 2]
            method, payload, code = flood_requests[0 if i % 2 == 0 else 1 + i // 2 % 2]
            ch = flood_channels[target][i // 2 % FLOOD_CHANNELS]
            call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
            for _ in range(FLOOD_ROUNDS):
                try:
                    answer = ppb.DeclareProcessesResponse.FromString(call(payload, timeout=TIMEOUT))
                except grpc.RpcError as err:
                    if err.code() is not code:
                        raise
                else:
                    assert code is None and answer.accepted == 0 and len(answer.rejected) == 1
                with lock:
                    counts["flood_calls"] += 1  # read whole and answered as expected

        counts["flood_calls"] = 0
        threads = [threading.Thread(target=declare), threading.Thread(target=resync)]
        threads += [threading.Thread(target=drain, args=(i,)) for i in range(8)]
        threads += [threading.Thread(target=oversized), threading.Thread(target=polite)]
        threads += [threading.Thread(target=flood, args=(i,)) for i in range(FLOOD_CALLERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert not any(t.is_alive() for t in threads)
        for chans in flood_channels.values():
            for ch in chans:
                ch.close()
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
        **{k: v for k, v in stats.items() if k != "durable"},
    }.items():
        figures.set("memory_ceiling" + ("_durable" if durable else ""), name, round(value, 1))
    assert stats["durable"] == ("ok" if durable else "disabled")
    assert served and served[0] > 0  # the well-behaved consumer got its answer
    assert counts["flood_calls"] == FLOOD_CALLERS * FLOOD_ROUNDS
    assert counts["rejected"] > 0 and counts["declared"] > 0  # the byte budget was reached
    assert stats["declared_held_bytes"] <= stats["declared_max_bytes"]
    assert stats["pull_budget_peak"] <= stats["pull_budget_limit"]
    assert stats["resyncs_in_progress"] == 0
    assert peak < CEILING_MIB * MiB, f"peak RSS {peak / MiB:.0f} MiB >= {CEILING_MIB} MiB"


# -- a node with a thousand GPU processes (issue 23, item 1) ------------------------------------

PROCESSES = 1000
"""GPU processes on the simulated node (8 GPUs, 125 each)."""

VALUE_CHARS = 56 * 1024
"""The declared attribute value of each process: the largest round size at which a thousand
declarations fit the default ``identity.declared.max_bytes`` (all accepted)."""

GREEDY = 8
HALF = 8
"""Batches in each half of the pulling phase (80 s of the default cadence each)."""

FILL_MAX = 40
"""At most this many batches for the store to fill (a ``max_bytes`` drop)."""

FLAT_MARGIN_MIB = 32
"""How much the second half's peak RSS may exceed the first half's (allocator slack, the
answers in flight of that moment): less than one 1.1x store refill would add."""

REPLY_TIMEOUT = 600.0


class NodeChild:
    """``memory_node.py`` in a child process: commands on stdin, JSON replies read by a thread."""

    def __init__(self, directory: Path, processes: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.memory_node", str(directory), str(processes)],
            cwd=HERE.parents[1],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.address = f"unix://{directory / 'gm.sock'}"
        self.profiler = f"unix://{directory / 'profiler.sock'}"
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            assert self._line() == "READY"
            self.ready = json.loads(self._line())
        except BaseException:
            self.proc.kill()  # never leave the child behind
            self.close()
            raise

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def _line(self) -> str:
        line = self._lines.get(timeout=REPLY_TIMEOUT)
        assert line is not None, f"the node exited with status {self.proc.wait(60)}"
        return line

    def batches(self, n: int) -> dict:
        """Run ``n`` batches (10 collections each); return the node's figures after them."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"batches {n}\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def hwm(self) -> int:
        return vm(self.proc.pid, "VmHWM")

    def reset_hwm(self) -> None:
        """Reset the child's ``VmHWM`` to its current RSS (``clear_refs`` 5, proc(5))."""
        with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
            f.write("5")

    def close(self) -> int:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        code = self.proc.wait(timeout=120)
        self._reader.join(timeout=60)
        return code


def _declare_large(address: str, pids: list[int]) -> tuple[int, int]:
    """Declare every pid once with a :data:`VALUE_CHARS` attribute value; (accepted, rejected)."""
    with grpc.insecure_channel(address) as ch:  # the profiler socket
        stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(ch)
        accepted = rejected = 0
        for start in range(0, len(pids), 16):  # 16 x 56 KiB: within the receive limit
            batch = []
            for pid in pids[start : start + 16]:
                res = resource_pb2.Resource()
                res.attributes.add(key="service.name").value.string_value = f"trainer-{pid}"
                value = f"{pid:08d}" * (VALUE_CHARS // 8)  # unique per process
                res.attributes.add(key="app.blob").value.string_value = value
                batch.append(
                    ppb.ProcessDeclaration(pid=pid, profiler_resource=res.SerializeToString())
                )
            r = stub.DeclareProcesses(ppb.DeclareProcessesRequest(processes=batch), timeout=60)
            accepted += r.accepted
            rejected += len(r.rejected)
        return accepted, rejected


class GreedyPullers:
    """Consumers that pull 64 MiB answers over and over and never acknowledge."""

    def __init__(self, address: str, n: int) -> None:
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.answers = 0
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(address, f"greedy-{i}")) for i in range(n)
        ]
        for t in self._threads:
            t.start()

    def _run(self, address: str, name: str) -> None:
        try:
            with grpc.insecure_channel(
                address, options=[("grpc.max_receive_message_length", 128 * MiB)]
            ) as ch:
                stub = pull_pb2_grpc.MetricsPullServiceStub(ch)
                pos, epoch = 0, ""
                while not self.stop.is_set():
                    try:
                        r = stub.Pull(
                            pull_pb2.PullRequest(
                                consumer=name,
                                ack_epoch=epoch,
                                read_after_sequence=pos,
                                max_bytes=64 * MiB,
                            ),
                            timeout=TIMEOUT,
                        )
                    except grpc.RpcError as err:
                        if err.code() is not grpc.StatusCode.UNAVAILABLE:
                            raise
                        self.stop.wait(0.02)  # the client's back-off before it resends
                        continue
                    epoch = r.epoch
                    pos = r.last_sequence if r.more else 0  # then from the cursor again
                    with self._lock:
                        self.answers += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in self._threads)


def test_a_thousand_gpu_processes_with_large_declared_resources_stay_under_the_ceiling(
    short_tmp, figures
):
    """Issue 23, item 1: 1 000 GPU processes, each declared once with a ~56 KiB attribute value.

    Nobody pulls until the store is full, then 8 consumers pull 64 MiB answers and never
    acknowledge, for 16 more batches (160 s of the default cadence). Asserted: the sidecar's
    ``VmHWM`` stays under the documented ceiling throughout, and its RSS is flat once the stores
    are full: the peak over the second half of the pulling phase is at most the first half's
    plus :data:`FLAT_MARGIN_MIB` (``VmHWM`` is reset between the halves).
    """
    node = NodeChild(short_tmp, PROCESSES)
    pullers = None
    try:
        assert len(node.ready["pids"]) == PROCESSES
        accepted, rejected = _declare_large(node.profiler, node.ready["pids"])
        assert (accepted, rejected) == (PROCESSES, 0)  # within identity.declared.max_bytes
        hwm_declared = node.hwm()
        fill = 0
        st = node.batches(1)
        while not st["dropped_points"]["max_bytes"] and fill < FILL_MAX:
            st = node.batches(2)
            fill += 2
        assert st["dropped_points"]["max_bytes"], "the store never filled"
        st = node.batches(2)  # full, nobody pulling
        hwm_full = node.hwm()
        pullers = GreedyPullers(node.address, GREEDY)
        node.batches(HALF)
        hwm_first = node.hwm()
        node.reset_hwm()
        st = node.batches(HALF)
        hwm_second = node.hwm()
        pullers.close()
        assert pullers.errors == []
        answers = pullers.answers
        pullers = None
    finally:
        if pullers is not None:
            pullers.close()
        code = node.close()
    assert code == 0
    peak = max(hwm_first, hwm_second)
    for name, value in {
        "node_hwm_declared_mib": vm_mib(hwm_declared),
        "node_hwm_store_full_mib": vm_mib(hwm_full),
        "node_hwm_pulling_first_half_mib": vm_mib(hwm_first),
        "node_hwm_pulling_second_half_mib": vm_mib(hwm_second),
        "node_store_batches": st["appended_batches"],
        "node_store_held_mib": st["held_bytes"] / MiB,
        "node_greedy_answers": answers,
    }.items():
        figures.set("memory_ceiling", name, round(value, 1))
    assert peak < CEILING_MIB * MiB, f"VmHWM {vm_mib(peak):.0f} MiB >= {CEILING_MIB} MiB"
    assert hwm_second <= hwm_first + FLAT_MARGIN_MIB * MiB, (
        f"RSS not flat: peak {vm_mib(hwm_second):.0f} MiB in the second half of the pulling "
        f"phase, {vm_mib(hwm_first):.0f} MiB in the first"
    )
    assert st["telemetry"]["gpumetrics.identity.attributes.limited"] >= PROCESSES  # each cut
    dropped = sum(st["dropped_points"].values())
    assert st["appended_points"] == st["released_points"] + dropped + st["held_points"]
    assert st["held_bytes"] <= st["max_bytes"]
    assert st["declared_held_bytes"] <= st["declared_max_bytes"]
    assert st["pull_budget_peak"] <= st["pull_budget_limit"]
    assert answers > 0


def vm_mib(n: int) -> float:
    return n / MiB
