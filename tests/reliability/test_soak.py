"""Soak: random simulated faults while consumers pull and a profiler declares, through gRPC.

One seeded run (``GPUMETRICS_SEED``; printed) of ``form.soak_cycles`` simulated cycles on a
``form.soak_gpus``-GPU node. Every cycle: planned faults start or end (GPU lost and back, error
codes, slow and hung calls, the NVML session taken down), processes start and exit with pid
reuse, the profiler declares and reports exits, one collection and one batch are made, and the
consumers scrape with randomly drawn behaviour; two more actors run in their own threads (a
consumer that drains continuously, a profiler stream of short-lived declarations).

Asserted every cycle: ``hw.status`` has exactly one state at 1 per GPU, a lost GPU reads
``failed`` = 1 under its own ``hw.id`` and every GPU reads ``ok`` = 1 again by the end of each
quiet gap; health stays SERVING; no per-process resource carries the identity of a dead
process that had the same pid; the store and declared store stay within their limits; the
store's accounting holds. At the end, after every consumer settled: points produced (counted
when each batch was made) = released (delivered and acknowledged by every consumer) + dropped
(by reason) + held (0), and for every consumer acknowledged + dropped = offered, with every
point it never received reported to it as dropped. Memory growth is bounded (tracemalloc).
"""

from __future__ import annotations

import random
import tracemalloc

from gpumetrics.metrics import names
from grpc_health.v1 import health_pb2

from .soak_clients import HAS_READ_AFTER, BackgroundConsumer, BackgroundStreamer, Consumer, Profiler
from .soak_node import (
    DECLARED_MAX,
    STATES,
    STORE_MAX_BYTES,
    STORE_MAX_POINTS,
    SoakNode,
    hw_status,
    node_uuids,
    process_metrics,
    process_services,
    soak_node,
)
from .soak_plan import Episode, make_plan

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
CHURN_PIDS = range(50001, 50011)
"""Pids the churn reuses (a small pool, so reuse is frequent)."""
NOISE_PIDS = range(900001, 900201)
"""Pids the profiler declares that never use a GPU (they push the declared store to its max)."""
MEMORY_GROWTH_LIMIT = 8 * 1024 * 1024
"""Bytes (tracemalloc) the whole process may grow between the end of the warm-up and the end.

Most of it is the test's own bookkeeping, which grows with the run by design (the ledger, each
consumer's set of received sequences, pytest's log capture, the simulator's ended processes)."""
SIDECAR_GROWTH_LIMIT = 1024 * 1024
"""Bytes the sidecar's own code (allocations whose innermost frame is in ``gpumetrics``, the
simulator excluded) may hold beyond what it held after the warm-up."""
SIDECAR_CODE = [
    tracemalloc.Filter(True, "*/gpumetrics/*"),
    tracemalloc.Filter(False, "*/nvmlsim/*"),
]


def _sidecar_bytes(snapshot: tracemalloc.Snapshot) -> int:
    return sum(s.size for s in snapshot.filter_traces(SIDECAR_CODE).statistics("filename"))


class Churn:
    """Starts and ends simulated processes, reusing pids from :data:`CHURN_PIDS`."""

    def __init__(self, node: SoakNode, rng: random.Random) -> None:
        self.node, self.rng = node, rng
        self.running: dict[int, str] = {}  # pid -> GPU UUID (indices move when a GPU comes back)
        self.started = self.ended = self.reused = 0
        self._seen: set[int] = set()
        self.reused_pids: set[int] = set()

    def step(self) -> None:
        drv, rng = self.node.drv, self.rng
        if self.running and rng.random() < 0.3:
            pid = rng.choice(sorted(self.running))
            assert drv.remove_process(self.running.pop(pid), pid) == 1
            self.ended += 1
        free = [p for p in CHURN_PIDS if p not in self.running]
        if free and rng.random() < 0.4:
            pid = rng.choice(free)
            device = rng.choice(self.node.uuids)
            drv.add_process(
                device,
                pid,
                name=f"/usr/bin/job{pid % 7}",
                used_memory_bytes=rng.randrange(1, 8) << 30,
                utilization={"sm": rng.randrange(1, 100), "mem": rng.randrange(1, 50)},
                start_time_unix=drv.now_us / 1e6,
            )
            self.running[pid] = device
            self.started += 1
            if pid in self._seen:
                self.reused += 1
                self.reused_pids.add(pid)
            self._seen.add(pid)


class Declarer:
    """The profiler's side: declares live processes (with lag), reports most exits, resyncs."""

    def __init__(self, profiler: Profiler, rng: random.Random) -> None:
        self.profiler, self.rng = profiler, rng
        self.declared: dict[int, int] = {}  # pid -> ticks declared
        self.noise: list[int] = []
        self.resyncs = 0

    def step(self, live: dict[int, tuple[int, str]]) -> None:
        rng = self.rng
        gone = [(p, t) for p, t in self.declared.items() if live.get(p, (None,))[0] != t]
        reported = [(p, t if rng.random() < 0.5 else 0) for p, t in gone if rng.random() < 0.7]
        reported += [(p, 0) for p in self.noise]
        for p, _ in gone:
            del self.declared[p]
        if reported:
            self.profiler.report_exits(reported)
        new = [
            (p, t) for p, (t, _) in live.items() if self.declared.get(p) != t and rng.random() < 0.6
        ]
        # Now and then a burst of non-GPU processes pushes the declared store past its maximum.
        noise = rng.sample(NOISE_PIDS, rng.randrange(20, 60)) if rng.random() < 0.08 else []
        self.noise = noise
        entries = [Profiler.declaration(p, t, f"svc-{p}-{t}") for p, t in new]
        entries += [Profiler.declaration(p, 0, f"noise-{p}") for p in noise]
        if rng.random() < 0.05:
            full = [Profiler.declaration(p, t, f"svc-{p}-{t}") for p, (t, _) in live.items()]
            self.profiler.declare(full, replace_all=True)
            self.declared = {p: t for p, (t, _) in live.items()}
            self.resyncs += 1
        elif entries:
            self.profiler.declare(entries)
            self.declared.update(new)


def _check_status(node: SoakNode, cycle: int, report, request, lost: set[str]) -> dict[str, int]:
    """Check one cycle's ``hw.status``; return how many GPUs were in each state (or down)."""
    statuses = hw_status(request)
    if not report.up:
        assert not statuses, f"cycle {cycle}: hw.status emitted while NVML is down"
        return {"nvml_down": 1}
    assert set(statuses) == set(node.uuids), f"cycle {cycle}: hw.ids {sorted(statuses)}"
    for uuid, states in statuses.items():
        assert set(states) == set(STATES) and sum(states.values()) == 1, (cycle, uuid, states)
    for uuid in lost:
        assert statuses[uuid]["failed"] == 1, f"cycle {cycle}: lost {uuid} reads {statuses[uuid]}"
    seen: dict[str, int] = {}
    for states in statuses.values():
        current = next(s for s, v in states.items() if v == 1)
        seen[current] = seen.get(current, 0) + 1
    return seen


ACCOUNTING_RECORD = {names.MetricProcessTime, names.MetricProcessMemoryMax}
"""What an ended process's resource may carry: its final NVML accounting record (issue 26)."""


def _check_identity(cycle: int, request, live: dict[int, tuple[int, str]]) -> dict[int, str]:
    """No per-process resource carries the identity of another process with the same pid."""
    services = process_services(request)
    metrics = process_metrics(request)
    for pid, service in services.items():
        if pid not in live:
            # an ended process's final accounting record (issue 26), and nothing else; its
            # resource is its own declaration or none, never another process's
            assert metrics[pid] <= ACCOUNTING_RECORD, (
                f"cycle {cycle}: points for pid {pid}, which is not running: {metrics[pid]}"
            )
            assert service == "" or service.startswith(f"svc-{pid}-"), (cycle, pid, service)
            continue  # not counted as a running process's resource below
        ticks, _ = live[pid]
        # declared: the profiler's service.name; not declared (yet): none (profiler mode)
        assert service in (f"svc-{pid}-{ticks}", ""), (
            f"cycle {cycle}: pid {pid} (start {ticks}) reported as {service!r}: another "
            "process's identity"
        )
    return {pid: s for pid, s in services.items() if pid in live}


def test_soak(form, figures, timed) -> None:
    rng = random.Random(form.seed)
    print(f"soak: {form.name} form, seed {form.seed}, read_after_sequence={HAS_READ_AFTER}")
    uuids = node_uuids(form.soak_gpus)
    plan = make_plan(rng, uuids, form.soak_cycles)
    assert plan.episodes and plan.checkpoints
    by_start: dict[int, list[Episode]] = {}
    by_end: dict[int, list[Episode]] = {}
    for e in plan.episodes:
        by_start.setdefault(e.start, []).append(e)
        by_end.setdefault(e.end, []).append(e)
    checkpoints = set(plan.checkpoints)
    session_cycles = {
        c for e in plan.episodes if e.kind == "session" for c in range(e.start, e.end + e.recovery)
    }

    with soak_node(form.soak_gpus, plan) as node:
        drv = node.drv
        assert node.health_status() == NOT_SERVING
        churn, declarer = Churn(node, rng), Declarer(Profiler(node.channel()), rng)
        consumers = {
            name: Consumer(name, node.dial, node.ledger) for name in ("steady", "flaky", "laggard")
        }
        late = Consumer("late", node.dial, node.ledger)
        hammer = BackgroundConsumer(Consumer("hammer", node.dial, node.ledger))
        streamer = BackgroundStreamer(node.channel(), NOISE_PIDS)
        lost: set[str] = set()
        peak = {"store_bytes": 0, "store_points": 0, "declared": 0, "process_resources": 0}
        warm_mem = warm_sidecar = 0
        states_seen: dict[str, int] = {}
        lost_checked = 0
        reused_checks: dict[str, int] = {}
        hangs_fired = 0
        for step in range(form.soak_cycles):
            cycle = drv.cycle
            assert cycle == step + 1, f"simulated time skipped a cycle: step {step}, cycle {cycle}"
            for e in by_end.get(cycle, ()):
                if e.kind == "lose":
                    assert e.device is not None
                    extra = {} if e.new_index is None else {"new_index": e.new_index}
                    drv.trigger("restore_gpu", device=e.device, **extra)
                    lost.discard(e.device)
                elif e.kind == "hang":
                    hangs_fired += drv.wait_until_held(1, timeout_s=0)  # did its call come?
                    drv.release_hangs()
                    assert node.collector.wait_idle(10), "a released hang did not return"
            for e in by_start.get(cycle, ()):
                if e.kind == "lose":
                    assert e.device is not None
                    drv.trigger("lose_gpu", device=e.device)
                    lost.add(e.device)
            churn.step()
            live = node.proc.sync(drv.live_processes())
            declarer.step(live)

            report, request = node.cycle()

            if cycle not in session_cycles:
                assert report.up, f"cycle {cycle}: NVML down outside a session episode"
            for state, count in _check_status(node, cycle, report, request, lost).items():
                states_seen[state] = states_seen.get(state, 0) + count
            lost_checked += len(lost) if report.up else 0
            if cycle in checkpoints:
                assert report.up and all(s["ok"] == 1 for s in hw_status(request).values()), (
                    f"cycle {cycle}: not every GPU recovered: {hw_status(request)}; "
                    f"timed out this cycle: {report.timed_out}"
                )
            services = _check_identity(cycle, request, live)
            n = len(services)
            for pid, service in services.items():
                if pid in churn.reused_pids:
                    key = "declared" if service.startswith("svc-") else "undeclared"
                    reused_checks[key] = reused_checks.get(key, 0) + 1
            assert node.health_status() == SERVING
            stats = node.store.stats()
            assert stats.held_bytes <= STORE_MAX_BYTES and stats.held_points <= STORE_MAX_POINTS
            assert (
                stats.appended_points
                == sum(node.ledger.values())
                == (stats.released_points + sum(stats.dropped_points.values()) + stats.held_points)
            )
            assert len(node.declared) <= DECLARED_MAX
            for key, value in (
                ("store_bytes", stats.held_bytes),
                ("store_points", stats.held_points),
                ("declared", len(node.declared)),
                ("process_resources", n),
            ):
                peak[key] = max(peak[key], value)

            if step == 0:
                hammer.start()
                streamer.start()
            if step == 5:
                tracemalloc.start()
                warm_mem = tracemalloc.get_traced_memory()[0]
                warm_sidecar = _sidecar_bytes(tracemalloc.take_snapshot())
            consumers["steady"].scrape(rng, "drain")
            consumers["flaky"].scrape(rng)
            if rng.random() < 0.06:
                consumers["laggard"].scrape(rng)
            if step >= form.soak_cycles // 2:
                late.scrape(rng)
            drv.next_cycle()

        hammer.join(30)
        streamer.join(30)
        assert not hammer.errors and not streamer.errors, (hammer.errors, streamer.errors)
        assert drv.violations == [], drv.violations

        everyone = [*consumers.values(), late, hammer.consumer]
        for c in everyone:
            c.settle()
        # Measured once every consumer has drained the store (it holds nothing now), so what
        # remains is what the run accumulated, not the store's bounded backlog.
        end_mem = tracemalloc.get_traced_memory()[0]
        sidecar_growth = _sidecar_bytes(tracemalloc.take_snapshot()) - warm_sidecar
        tracemalloc.stop()
        stats = node.store.stats()
        produced = sum(node.ledger.values())
        dropped = sum(stats.dropped_points.values())
        assert stats.appended_points == produced == stats.released_points + dropped
        assert stats.held_points == 0, "every consumer acknowledged everything, yet points held"
        by_name = {s.name: s for s in stats.consumers}
        for c in everyone:
            s = by_name[c.name]
            offered = sum(p for seq, p in node.ledger.items() if seq > s.base_sequence)
            assert s.offered_points == offered
            assert s.unacked_held_points == 0
            assert s.acked_points + s.dropped_points_total == offered
            assert c.dropped == s.dropped_points_total
            never = sum(
                p
                for seq, p in node.ledger.items()
                if seq > s.base_sequence and seq not in c.received
            )
            assert never <= c.dropped, (
                f"{c.name}: {never} points never received, {c.dropped} reported"
            )
        assert by_name["steady"].dropped_points_total == 0
        for c in everyone:
            c.close()
        growth = end_mem - warm_mem
        assert growth < MEMORY_GROWTH_LIMIT, f"memory grew {growth} bytes over the soak"
        assert sidecar_growth < SIDECAR_GROWTH_LIMIT, f"the sidecar's code grew {sidecar_growth} B"
        timeouts = node.telemetry.total("gpumetrics.collection.timeouts")
        nvml_errors = node.telemetry.total("gpumetrics.nvml.errors")
        assert timeouts >= hangs_fired, "a hung call was not counted as a timeout"

    f = "soak"
    figures.add(f, "runs")
    figures.add(f, "cycles", form.soak_cycles)
    figures.add(f, "gpus", form.soak_gpus)
    for kind, count in plan.count().items():
        figures.add(f, f"faults_injected.{kind}", count)
    figures.add(f, "faults_injected.total", len(plan.episodes))
    figures.add(f, "faults_survived.total", len(plan.episodes))
    figures.add(f, "recovery_checkpoints_passed", len(plan.checkpoints))
    figures.add(f, "processes_started", churn.started)
    figures.add(f, "processes_ended", churn.ended)
    figures.add(f, "pids_reused", churn.reused)
    for key, count in reused_checks.items():
        figures.add(f, f"reused_pid_resources_checked.{key}", count)
    figures.add(f, "declarations_accepted", declarer.profiler.accepted + streamer.events)
    figures.add(f, "exits_reported", declarer.profiler.exits)
    figures.add(f, "resyncs", declarer.resyncs)
    figures.add(f, "points_produced", produced)
    figures.add(f, "points_released", stats.released_points)
    for reason, points in stats.dropped_points.items():
        figures.add(f, f"points_dropped.{reason}", points)
    figures.add(f, "points_held_at_end", stats.held_points)
    for c in everyone:
        figures.add(f, f"consumer.{c.name}.pulls", c.pulls)
        figures.add(f, f"consumer.{c.name}.dropped_points", c.dropped)
        figures.add(f, f"consumer.{c.name}.reconnects", c.reconnects)
        for how, count in c.behaviours.items():
            figures.add(f, f"consumer_behaviour.{how}", count)
    figures.add(f, "collection_timeouts", timeouts)
    figures.add(f, "hangs_fired", hangs_fired)
    figures.add(f, "nvml_errors_counted", nvml_errors)
    figures.add(f, "lost_gpu_cycles_checked_failed", lost_checked)
    for state, count in states_seen.items():
        figures.add(f, f"gpu_cycles_in_state.{state}", count)
    figures.set(f, "peak_store_bytes", peak["store_bytes"])
    figures.set(f, "peak_declared", peak["declared"])
    figures.set(f, "memory_growth_bytes", growth)
    figures.set(f, "sidecar_memory_growth_bytes", sidecar_growth)
