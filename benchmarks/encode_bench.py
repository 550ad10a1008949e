"""Hand-written protobuf wire tags against the protobuf API in the metric encoder, side by side.

``gpumetrics.metrics.encode.encode_metric`` (the sidecar's) builds each ``Metric`` through the
protobuf API; ``benchmarks.encode_variant.encode_metric_wire`` writes each ``NumberDataPoint`` as
wire bytes by hand and merges them into the ``Metric`` once, as the sidecar did before this
measurement. Both use the same attribute cache (serialized attribute entries per attribute tuple,
shared by one ``produce``). Three measurements, each with both encoders in the same run:

* **encode only**: one batch's ``encode_metric`` calls replayed with each encoder;
* **encode**: the store's sizing node (8 H100 with 64 processes, 1 s samples, 10 s batches,
  realistic declared resources; ``benchmarks.workload``) on the simulated driver in this
  process; ``Producer.collect()`` (the encode) is timed per batch, the encoders alternating
  batch by batch, after checking that they serialize every metric of a batch identically;
* **sidecar**: two whole sidecars (``gpumetrics serve``, one with each encoder) run at the same
  time on the same simulated node, each pulled every 10 s; their CPU (utime + stime, all
  threads) over the same window, repeated with the start order swapped.

The rule was: keep the hand-written tags only if their whole-sidecar CPU gain is at least 10 %.
It was not (docs/performance.md, "Encoding"): the sidecar uses the protobuf API.

Run: ``python -m benchmarks.encode_bench [--window 60] [--warmup 20] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from gpumetrics.metrics import encode, producer
from opentelemetry.proto.metrics.v1 import metrics_pb2

import nvmlsim as sim
from benchmarks.encode_variant import encode_metric_wire
from benchmarks.harness import emit, machine, node_scenario, proc_cpu_split, write_scenario
from benchmarks.peer_bench import Exporter, Scraper, _wait, free_port
from benchmarks.pullclient import PullConsumer, channel
from benchmarks.workload import sizing_node

ROOT = Path(__file__).resolve().parents[1]
API = encode.encode_metric
HAND = encode_metric_wire
ENCODERS = {"hand": HAND, "api": API}


def _use(fn: Any) -> None:
    producer.encode_metric = fn  # type: ignore[attr-defined]


def measure_encode(batches: int, gpus: int, per_gpu: int) -> dict[str, Any]:
    """Time ``Producer.collect()`` per 10 s batch with each encoder, alternating batch by batch."""
    drv, col, prod = sizing_node(gpus, per_gpu)
    times: dict[str, list[float]] = {"hand": [], "api": []}
    checked = 0

    def both(target: Any, spec: Any, points: Any, cache: Any = None) -> int:
        nonlocal checked
        n = HAND(target, spec, points, cache)
        other = metrics_pb2.Metric()
        API(other, spec, points, {})
        if other.SerializeToString() != target.SerializeToString():
            raise AssertionError(f"{spec.name}: the encoders differ")
        checked += 1
        return n

    captured: list[tuple[Any, Any]] = []

    def capture(target: Any, spec: Any, points: Any, cache: Any = None) -> int:
        captured.append((spec, list(points)))
        return HAND(target, spec, points, cache)

    points = 0
    try:
        col.collect_once()
        drv.next_cycle()
        prod.collect()
        for i in range(2 * batches + 1):
            for _ in range(10):
                col.collect_once()
                drv.next_cycle()
            name = "check" if i == 0 else ("hand", "api")[i % 2]
            _use(both if name == "check" else capture if i == 1 else ENCODERS[name])
            t0 = time.process_time()
            req = prod.collect()
            dt = time.process_time() - t0
            if name != "check":
                times[name].append(dt)
            points = max(points, encode.count_points(req))
        col.stop(5.0)
    finally:
        _use(API)
        sim.uninstall()
    hand, api = (statistics.median(times[k]) for k in ("hand", "api"))
    only = encode_only(captured, rounds=4 * batches)
    return {
        "encode_only_ms_median": only,
        "encode_only_gain_vs_api": (only["api"] - only["hand"]) / only["api"],
        "batches_each": batches,
        "points_per_batch": points,
        "metrics_checked_identical": checked,
        "collect_ms_median": {"hand": 1000 * hand, "api": 1000 * api},
        "collect_ms_all": {k: [round(1000 * v, 2) for v in vs] for k, vs in times.items()},
        "gain_vs_api": (api - hand) / api,
    }


def encode_only(calls: list[tuple[Any, Any]], rounds: int) -> dict[str, float]:
    """The encoder alone: one batch's ``encode_metric`` calls (as one ``collect()`` made them,
    each batch with a fresh attribute cache), replayed ``rounds`` times per encoder, alternating;
    the median CPU ms per batch."""
    times: dict[str, list[float]] = {"hand": [], "api": []}
    for i in range(2 * rounds):
        name = ("hand", "api")[i % 2]
        fn, cache = ENCODERS[name], {}
        t0 = time.process_time()
        for spec, pts in calls:
            fn(metrics_pb2.Metric(), spec, pts, cache)
        times[name].append(time.process_time() - t0)
    return {k: 1000 * statistics.median(v) for k, v in times.items()}


def measure_sidecars(args: argparse.Namespace, out: Path, order: tuple[str, str]) -> dict[str, Any]:
    """Run both sidecars at once (started in ``order``), pull each every 10 s, measure CPU."""
    scenario = write_scenario(
        node_scenario(args.gpus, args.processes_per_gpu, profile="h100-8x-training"),
        out / "scenario.yaml",
    )
    config = out / "gpumetrics.yaml"
    config.write_text(yaml.safe_dump({"collection": {"pid_max": 4_194_304}}), encoding="utf-8")
    ports = {name: free_port() for name in order}
    sidecars: dict[str, Exporter] = {}
    consumers: dict[str, PullConsumer] = {}
    channels = []
    for name in order:
        target = "benchmarks.encode_variant" if name == "hand" else "gpumetrics"
        sidecars[name] = Exporter(
            f"sidecar-{name}",
            sys.executable,
            scenario,
            [target, "serve", "--config", str(config), "--listen", f"127.0.0.1:{ports[name]}",
             "--profiler-listen", f"unix:{config.parent / f'profiler-{name}.sock'}",
             "--collection-interval", str(args.interval), "--log-level", "warn"],
            out,
        )  # fmt: skip
        ch = channel(f"127.0.0.1:{ports[name]}")
        channels.append(ch)
        consumers[name] = PullConsumer(ch, "bench")
    try:
        for name in order:
            _wait(name, lambda n=name: consumers[n].drain().pulls > 0, 90, sidecars[name].proc)
        scrapers = [
            Scraper(f"pull-{n}", 10.0, lambda n=n: consumers[n].drain().size_bytes) for n in order
        ]
        for s in scrapers:
            s.start()
        time.sleep(args.warmup)
        load0 = os.getloadavg()
        cpu0 = {n: proc_cpu_split(sidecars[n].proc.pid) for n in order}
        t0 = time.monotonic()
        time.sleep(args.window)
        cpu1 = {n: proc_cpu_split(sidecars[n].proc.pid) for n in order}
        secs = time.monotonic() - t0
        load1 = os.getloadavg()
        for s in scrapers:
            s.stop_event.set()
        for s in scrapers:
            s.join(15)
    finally:
        for ch in channels:
            ch.close()
        codes = {n: sidecars[n].stop() for n in order}
    per_min = {n: 60.0 * (sum(cpu1[n]) - sum(cpu0[n])) / secs for n in order}
    return {
        "order": list(order),
        "window_s": secs,
        "loadavg_1m": [load0[0], load1[0]],
        "cpu_s_per_min": per_min,
        "gain_vs_api": (per_min["api"] - per_min["hand"]) / per_min["api"],
        "pulls": {s.name: s.summary() for s in scrapers},
        "exit_codes": codes,
    }


def main() -> int:
    """Run both measurements, print and emit the result."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--processes-per-gpu", type=int, default=8)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--batches", type=int, default=15, help="encode: timed batches per encoder")
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--repeat", type=int, default=3, help="sidecar runs (start order alternates)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "encode")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    enc = measure_encode(args.batches, args.gpus, args.processes_per_gpu)
    print(
        f"encode only: {enc['encode_only_ms_median']['hand']:.2f} ms hand-written, "
        f"{enc['encode_only_ms_median']['api']:.2f} ms protobuf API per batch: gain "
        f"{100 * enc['encode_only_gain_vs_api']:.1f} %"
    )
    print(
        f"encode: collect() median {enc['collect_ms_median']['hand']:.1f} ms hand-written, "
        f"{enc['collect_ms_median']['api']:.1f} ms protobuf API per batch of "
        f"{enc['points_per_batch']} points: gain {100 * enc['gain_vs_api']:.1f} %"
    )
    runs = []
    for i in range(args.repeat):
        order = ("hand", "api") if i % 2 == 0 else ("api", "hand")
        r = measure_sidecars(args, args.out, order)
        runs.append(r)
        print(
            f"sidecar run {i + 1} ({'/'.join(order)}): CPU {r['cpu_s_per_min']['hand']:.2f} s/min "
            f"hand-written, {r['cpu_s_per_min']['api']:.2f} s/min protobuf API: gain "
            f"{100 * r['gain_vs_api']:.1f} % "
            f"(load {r['loadavg_1m'][0]:.2f}-{r['loadavg_1m'][1]:.2f})"
        )
    gains = sorted(r["gain_vs_api"] for r in runs) or [float("nan")]
    result = {
        "machine": machine(),
        "encode": enc,
        "sidecar_runs": runs,
        "sidecar_gain_median": gains[len(gains) // 2],
        "sidecar_gain_range": [gains[0], gains[-1]],
        "keep_hand_written_if_gain_at_least": 0.10,
    }
    print(
        "whole-sidecar CPU gain of the hand-written tags: median "
        f"{100 * result['sidecar_gain_median']:.1f} % "
        f"(range {100 * gains[0]:.1f} to {100 * gains[-1]:.1f} %, {len(runs)} runs)"
    )
    emit("encode", result)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
