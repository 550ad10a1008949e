"""Side by side: nvitop-exporter and the gpumetrics sidecar on the same simulated node.

Both run at the same time, each as its own process with the simulated driver installed beneath
nvidia-ml-py by the simulator's launcher (``benchmarks/simexec.py`` around
``python -m nvmlsim exec``), on the same scenario file: 8 H100s of the
``h100-8x-training`` profile (driver 570, 20 ms PCIe window as on hardware) with 8 training
processes each, 64 in all, at a 1 s cadence. **Both consumers ask every 10 s** by default (equal
consumer cadence: each exporter renders the same number of answers); ``--scrape-nvitop-s 1``
gives the earlier setup, where nvitop-exporter renders ten times as many answers as we do, and
its results say so (``cadence``).

* **nvitop-exporter** (``--interval 1``, in the scratch virtualenv ``benchmarks/.venv-peer``):
  every second it reads host metrics (psutil), then per GPU: utilisation, memory, 4 clocks,
  power and limit, temperature, fan, PCIe TX/RX, NVLink throughput, and per process: the
  process lists, per-process utilisation and a psutil host snapshot. It serves Prometheus text;
  this benchmark scrapes its /metrics every ``--scrape-nvitop-s`` (10 s).
* **gpumetrics** (``gpumetrics serve --collection-interval 1``, all other settings default:
  PCIe every 10 s, ECC every 10 s, 10 s batches): every second the catalogue's metrics per GPU
  (sample buffers, memory, power, energy, temperature, clocks, clock-event reasons) and per
  process (lists, one utilisation call per GPU), per-process identity through the
  ProcessResourcer; this benchmark pulls from it every ``--pull-ours-s`` (10 s; drain +
  acknowledgement).
  Its config sets only ``collection.pid_max: 4194304``, so the simulated pids (100000+) are valid
  whatever this host's ``pid_max`` (32768 on the CI machine); everything else is default.

After a warm-up, both processes' CPU (utime + stime of ``/proc/<pid>/stat``, all threads) is
measured over a fixed window, together with the CPU spent inside the simulated driver
(``SimDriver.cpu_in_driver_s``: thread CPU time inside the simulated functions, dumped by
``simexec`` at the window's edges; "own" CPU is the rest) and the C calls made, and RSS
(VmRSS, VmHWM, ``smaps_rollup``) at the window's end. The scrapers run in this process, so their
CPU is in neither figure. A third process, ``benchmarks/sim_idle.py`` under the same launcher
and scenario, holds only the interpreter, nvidia-ml-py and the simulated node: its RSS is the
share of both exporters' RSS that is the simulator's, reported separately.

Run: ``python -m benchmarks.peer_bench [--window 60] [--warmup 15]``; prepare the peer with
``python -m benchmarks.peer_bench --setup-peer`` (needs PyPI once).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import yaml

from benchmarks.harness import (
    emit,
    machine,
    node_scenario,
    proc_cpu_split,
    proc_ctx_switches,
    proc_rss_bytes,
    write_scenario,
)
from benchmarks.profile_report import summarize
from benchmarks.pullclient import PullConsumer, channel

ROOT = Path(__file__).resolve().parents[1]
PEER_VENV = ROOT / "benchmarks" / ".venv-peer"
PEER_PACKAGES = ("nvitop-exporter==1.7.2", "nvidia-ml-py==13.615.71")
BOARD_SOURCES = (
    "nvidia.gpu.power.limit.constraint",
    "nvidia.gpu.performance_state",
    "hw.fan.speed_ratio",
    "nvidia.gpu.bar1.memory.usage",
    "nvidia.gpu.bar1.memory.limit",
    "nvidia.gpu.violation.time",
    "nvidia.gpu.memory.remapped_rows",
    "nvidia.gpu.memory.row_remap.pending",
    "nvidia.gpu.memory.row_remap.failure",
    "nvidia.gpu.memory.retired_pages",
    "nvidia.gpu.memory.retired_pages.pending",
    "nvidia.gpu.encoder.sessions",
    "nvidia.gpu.encoder.fps",
    "nvidia.gpu.encoder.latency",
    "hw.network.up",
    "nvidia.gpu.nvlink.io",
    "nvidia.gpu.prof.graphics_engine.activity",
    "nvidia.gpu.prof.sm.activity",
    "nvidia.gpu.prof.sm.occupancy",
    "nvidia.gpu.prof.pipe.activity",
    "nvidia.gpu.prof.dram.activity",
    "nvidia.gpu.prof.pcie.throughput",
    "nvidia.gpu.prof.nvlink.throughput",
    "nvidia.gpu.prof.engine.activity",
)
"""The metrics issue 14 added (hw.errors's NVLink links go with hw.errors, which stays on)."""
TARGET_RATIO_CPU = 0.20
"""Issue 18: ours/theirs CPU at equal consumer cadence (median of 3 runs, quiet machine)."""


def setup_peer(venv: Path = PEER_VENV) -> None:
    """Create the peer's scratch virtualenv: nvitop-exporter and the simulator (nvmlsim, editable).

    The peer needs nothing of gpumetrics: it runs nvitop-exporter on nvmlsim, as any other
    project testing NVML code would.
    """
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, *PEER_PACKAGES, "py-spy"], check=True)
    subprocess.run([*pip, "-e", str(ROOT / "nvmlsim")], check=True)


def training_node(gpus: int, processes_per_gpu: int, path: Path) -> Path:
    """Write the side-by-side's scenario file: ``gpus`` H100s of ``h100-8x-training``, each
    with ``processes_per_gpu`` training processes (square-wave load, 8 GiB each)."""
    rank_util = {"pattern": "square", "first": 99, "rest": 41, "period_s": 2.0, "duty": 0.8}
    return write_scenario(
        node_scenario(
            gpus,
            processes_per_gpu,
            profile="h100-8x-training",
            pcie_window_ms=None,  # the profile's 20 ms, as on hardware
            process_fields={
                "name": "/usr/bin/python3",
                "used_memory_bytes": 8_589_934_592,
                "utilization": {"sm": rank_util, "mem": {**rank_util, "first": 63, "rest": 18}},
            },
        ),
        path,
    )


def sidecar_config(path: Path, disabled_metrics: list[str] | None = None) -> Path:
    """Write the sidecar's config: ``collection.pid_max`` 4194304 (the simulated pids are valid
    whatever this host's ``pid_max``), optionally some metrics disabled; all else default."""
    collection: dict[str, Any] = {"pid_max": 4_194_304}
    if disabled_metrics:
        collection["disabled_metrics"] = sorted(disabled_metrics)
    path.write_text(yaml.safe_dump({"collection": collection}), encoding="utf-8")
    return path


def free_port() -> int:
    """A loopback TCP port free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Exporter:
    """One exporter process under ``benchmarks.simexec``; stats dumps on SIGUSR1."""

    def __init__(
        self,
        name: str,
        python: str,
        scenario: Path,
        target: list[str],
        out: Path,
        env: dict[str, str] | None = None,
    ):
        self.name = name
        self.stats_dir = out / name
        self.stats_dir.mkdir(parents=True, exist_ok=True)
        for old in self.stats_dir.glob("stats-*"):  # a previous run's dumps
            old.unlink()
        self.dumps = 0
        log = open(out / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
        self._log = log
        self.proc = subprocess.Popen(
            [
                python, "-m", "benchmarks.simexec", "--stats-dir", str(self.stats_dir), "--",
                "--simulate", str(scenario), "--", *target,
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )  # fmt: skip

    def dump_stats(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Ask for a stats dump and return it."""
        self.dumps += 1
        self.proc.send_signal(signal.SIGUSR1)
        done = self.stats_dir / f"stats-{self.dumps}.done"
        end = time.monotonic() + timeout_s
        while not done.exists():
            if time.monotonic() > end or self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: no stats dump within {timeout_s}s")
            time.sleep(0.05)
        data: dict[str, Any] = json.loads((self.stats_dir / f"stats-{self.dumps}.json").read_text())
        return data

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; return the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode


def sidecar(
    scenario: Path,
    config: Path,
    listen: str,
    out: Path,
    interval_s: float = 1.0,
    env: dict[str, str] | None = None,
) -> Exporter:
    """Start ``gpumetrics serve`` (``config``, one ``listen`` address) on ``scenario``."""
    return Exporter(
        "gpumetrics",
        sys.executable,
        scenario,
        ["gpumetrics", "serve", "--config", str(config), "--listen", listen,
         "--profiler-listen", f"unix:{config.parent / 'profiler.sock'}",
         "--collection-interval", f"{interval_s:g}", "--log-level", "warn"],
        out,
        env=env,
    )  # fmt: skip


class Scraper(threading.Thread):
    """Calls ``fn`` every ``period_s`` until stopped; records durations, bytes and failures."""

    def __init__(self, name: str, period_s: float, fn: Any) -> None:
        super().__init__(name=name, daemon=True)
        self.period_s, self.fn = period_s, fn
        self.stop_event = threading.Event()
        self.durations: list[float] = []
        self.sizes: list[int] = []
        self.failures: list[str] = []

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            start = time.perf_counter()
            try:
                self.sizes.append(self.fn())
                self.durations.append(time.perf_counter() - start)
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                self.failures.append(f"{type(exc).__name__}: {exc}"[:200])
            next_at += self.period_s
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))

    def summary(self) -> dict[str, Any]:
        d = sorted(self.durations)
        return {
            "period_s": self.period_s,
            "count": len(d),
            "failures": len(self.failures),
            "first_failures": self.failures[:3],
            "median_ms": 1000 * d[len(d) // 2] if d else None,
            "max_ms": 1000 * d[-1] if d else None,
            "mean_bytes": sum(self.sizes) / len(self.sizes) if self.sizes else None,
        }


def _wait(what: str, check: Any, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}")
        try:
            if check():
                return
        except (OSError, grpc.RpcError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{what}: not ready within {timeout_s}s")


def _edge(ex: Exporter) -> tuple[tuple[float, float], tuple[int, int]]:
    return proc_cpu_split(ex.proc.pid), proc_ctx_switches(ex.proc.pid)


def _window(ex: Exporter, before: dict[str, Any], after: dict[str, Any], e0: Any, e1: Any,
            secs: float) -> dict[str, Any]:  # fmt: skip
    per_min = 60.0 / secs
    user, system = e1[0][0] - e0[0][0], e1[0][1] - e0[0][1]
    cpu = user + system
    sim_s = after["time_in_driver_s"] - before["time_in_driver_s"]
    calls = {
        f: n - before["by_function"].get(f, 0)
        for f, n in after["by_function"].items()
        if n - before["by_function"].get(f, 0)
    }
    rss, hwm = proc_rss_bytes(ex.proc.pid)
    sim_cpu_s = after.get("cpu_in_driver_s", after["time_in_driver_s"]) - before.get(
        "cpu_in_driver_s", before["time_in_driver_s"]
    )
    return {
        "cpu_s_per_min": cpu * per_min,
        "user_s_per_min": user * per_min,
        "system_s_per_min": system * per_min,
        "voluntary_ctx_switches_per_s": (e1[1][0] - e0[1][0]) / secs,
        "involuntary_ctx_switches_per_s": (e1[1][1] - e0[1][1]) / secs,
        "sim_s_per_min": sim_cpu_s * per_min,
        "sim_wall_s_per_min": sim_s * per_min,  # inside the simulator, waits included
        "own_cpu_s_per_min": (cpu - sim_cpu_s) * per_min,
        "c_calls_per_s": sum(calls.values()) / secs,
        "top_calls_per_s": dict(
            sorted(((f, n / secs) for f, n in calls.items()), key=lambda kv: -kv[1])[:12]
        ),
        "rss_bytes": rss,
        "hwm_bytes": hwm,
        "smaps_rollup_kb": after.get("smaps_rollup_kb", {}),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start both, warm up, measure the window, stop both; return the result."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    peer_python = str(args.peer_venv / "bin" / "python")
    scenario = training_node(args.gpus, args.processes_per_gpu, out / "scenario.yaml")
    config = sidecar_config(out / "gpumetrics.yaml", args.disabled_metrics)
    nv_port, our_port = free_port(), free_port()
    nvitop = Exporter(
        "nvitop-exporter",
        peer_python,
        scenario,
        ["nvitop-exporter", "--bind-address", "127.0.0.1", "--port", str(nv_port),
         "--interval", str(args.interval)],
        out,
    )  # fmt: skip
    ours = sidecar(scenario, config, f"127.0.0.1:{our_port}", out, interval_s=args.interval)
    baseline = Exporter("simulator-alone", sys.executable, scenario, ["benchmarks.sim_idle"], out)
    ch = channel(f"127.0.0.1:{our_port}")
    consumer = PullConsumer(ch, "bench")
    url = f"http://127.0.0.1:{nv_port}/metrics"

    def scrape_nvitop() -> int:
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = resp.read()
        (out / "nvitop-last-scrape.txt").write_bytes(body)
        return len(body)

    def pull_ours() -> int:
        return consumer.drain().size_bytes

    try:
        _wait("nvitop-exporter", lambda: b"gpu_utilization" in urllib.request.urlopen(
            url, timeout=2).read(), 90, nvitop.proc)  # fmt: skip
        _wait("gpumetrics", lambda: consumer.drain().pulls > 0, 90, ours.proc)
        scrapers = [
            Scraper("scrape-nvitop", args.scrape_nvitop_s, scrape_nvitop),
            Scraper("pull-ours", args.pull_ours_s, pull_ours),
        ]
        for s in scrapers:
            s.start()
        time.sleep(args.warmup)
        before = {e.name: e.dump_stats() for e in (nvitop, ours)}
        load0 = os.getloadavg()
        edge0 = {e.name: _edge(e) for e in (nvitop, ours)}
        t0 = time.monotonic()
        time.sleep(args.window)
        edge1 = {e.name: _edge(e) for e in (nvitop, ours)}
        secs = time.monotonic() - t0
        load1 = os.getloadavg()
        after = {e.name: e.dump_stats() for e in (nvitop, ours)}
        results = {
            e.name: _window(e, before[e.name], after[e.name], edge0[e.name], edge1[e.name], secs)
            for e in (nvitop, ours)
        }
        for s in scrapers:
            s.stop_event.set()
        for s in scrapers:
            s.join(15)
        results["nvitop-exporter"]["scrapes"] = scrapers[0].summary()
        results["gpumetrics"]["pulls"] = scrapers[1].summary()
        alone = baseline.dump_stats()
        results["simulator-alone"] = {
            "rss_bytes": proc_rss_bytes(baseline.proc.pid)[0],
            "smaps_rollup_kb": alone.get("smaps_rollup_kb", {}),
        }
        if args.profile_s > 0 and args.profile_this_run:
            profile(args, (nvitop, ours), results, out)
    finally:
        ch.close()
        codes = {e.name: e.stop() for e in (nvitop, ours, baseline)}
    a, b = results["gpumetrics"], results["nvitop-exporter"]
    sim_rss = results["simulator-alone"]["rss_bytes"]
    return {
        "machine": machine(),
        "peer_versions": _peer_versions(peer_python),
        "scenario": {"gpus": args.gpus, "processes": args.gpus * args.processes_per_gpu,
                     "profile": "h100-8x-training", "interval_s": args.interval},
        "cadence": _cadence(args),
        "scrape_nvitop_s": args.scrape_nvitop_s,
        "pull_ours_s": args.pull_ours_s,
        "warmup_s": args.warmup,
        "loadavg_1m_at_window_start": load0[0],
        "loadavg_1m_at_window_end": load1[0],
        "loadavg_at_window_end": list(load1),
        "window_s": secs,
        "exporters": results,
        "exit_codes": codes,
        "ratio_cpu": a["cpu_s_per_min"] / b["cpu_s_per_min"],
        "ratio_own_cpu": a["own_cpu_s_per_min"] / b["own_cpu_s_per_min"],
        "ratio_rss": a["rss_bytes"] / b["rss_bytes"],
        "rss_above_simulator_bytes": {"gpumetrics": a["rss_bytes"] - sim_rss,
                                      "nvitop-exporter": b["rss_bytes"] - sim_rss},
        "target_ratio_cpu": TARGET_RATIO_CPU,
    }  # fmt: skip


def _cadence(args: argparse.Namespace) -> str:
    if args.scrape_nvitop_s == args.pull_ours_s:
        return f"equal: both consumers every {args.pull_ours_s:g} s"
    return (
        f"unequal: nvitop-exporter scraped every {args.scrape_nvitop_s:g} s, "
        f"gpumetrics pulled every {args.pull_ours_s:g} s"
    )


def profile(args: argparse.Namespace, exporters: Any, results: dict[str, Any], out: Path) -> None:
    """Sample both exporters with py-spy (``--gil``: the thread holding the GIL, i.e. Python CPU)
    for ``args.profile_s`` seconds, after the measured window so it cannot disturb it."""
    spy = args.peer_venv / "bin" / "py-spy"
    if not spy.exists():
        for e in exporters:
            results[e.name]["profile"] = {"skipped": f"{spy} not installed"}
        return
    procs = {}
    for e in exporters:
        path = out / f"{e.name}.pyspy.txt"
        cmd = [str(spy), "record", "--pid", str(e.proc.pid), "--duration", str(int(args.profile_s)),
               "--rate", "250", "--gil", "--nonblocking", "--full-filenames", "--format", "raw",
               "--output", str(path)]  # fmt: skip
        procs[e.name] = (
            path,
            subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        )
    for name, (path, proc) in procs.items():
        try:
            proc.wait(args.profile_s + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
        results[name]["profile"] = (
            summarize(path.read_text()) if path.exists() else {"skipped": "py-spy wrote nothing"}
        )


def _peer_versions(python: str) -> dict[str, str]:
    code = (
        "import json; from importlib import metadata as m; print(json.dumps({p: m.version(p) "
        "for p in ('nvitop', 'nvitop-exporter', 'nvidia-ml-py', 'prometheus-client', 'psutil')}))"
    )
    res = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    return json.loads(res.stdout) if res.returncode == 0 else {"error": res.stderr[-300:]}


def main() -> int:
    """Parse arguments, run (or set up the peer), print and emit the result."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup-peer", action="store_true", help="create the peer venv and exit")
    ap.add_argument("--peer-venv", type=Path, default=PEER_VENV)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--processes-per-gpu", type=int, default=8)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument(
        "--scrape-nvitop-s", type=float, default=10.0, help="1: the earlier, unequal setup"
    )
    ap.add_argument("--pull-ours-s", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=3, help="independent runs (median reported)")
    ap.add_argument("--profile-s", type=float, default=30.0, help="py-spy after the window")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "peer")
    ap.add_argument(
        "--disabled-metrics",
        type=lambda text: [m for m in text.split(",") if m],
        default=[],
        metavar="A,B",
        help="catalogue metrics the sidecar does not collect (measures what they cost)",
    )
    ap.add_argument(
        "--without-board-sources",
        action="store_true",
        help="disable the GPM, NVLink and board-health metrics of issue 14 (their cost)",
    )
    args = ap.parse_args()
    if args.without_board_sources:
        args.disabled_metrics = [*args.disabled_metrics, *BOARD_SOURCES]
    if args.setup_peer:
        setup_peer(args.peer_venv)
        return 0
    if not (args.peer_venv / "bin" / "nvitop-exporter").exists():
        emit("peer", {"skipped": f"no nvitop-exporter in {args.peer_venv}; run with --setup-peer"})
        return 0
    runs = []
    for i in range(args.repeat):
        args.profile_this_run = i == args.repeat - 1
        r = run(args)
        runs.append(r)
        for name, e in r["exporters"].items():
            if "cpu_s_per_min" not in e:  # the simulator-alone baseline: memory only
                continue
            print(
                f"run {i + 1}: {name:16} CPU {e['cpu_s_per_min']:5.2f} s/min (user "
                f"{e['user_s_per_min']:.2f}, system {e['system_s_per_min']:.2f}; sim "
                f"{e['sim_s_per_min']:.2f}, own {e['own_cpu_s_per_min']:.2f})  RSS "
                f"{e['rss_bytes'] / 2**20:5.1f} MiB  {e['c_calls_per_s']:4.0f} C calls/s"
            )
        alone = r["exporters"]["simulator-alone"]["rss_bytes"] / 2**20
        print(
            f"run {i + 1}: ours/theirs CPU {r['ratio_cpu']:.3f} (own {r['ratio_own_cpu']:.3f}); "
            f"simulator alone {alone:.1f} MiB; load {r['loadavg_1m_at_window_start']:.2f}-"
            f"{r['loadavg_1m_at_window_end']:.2f}; {r['cadence']}"
        )
    ratios = sorted(r["ratio_cpu"] for r in runs)
    own = sorted(r["ratio_own_cpu"] for r in runs)
    result = {
        "machine": runs[0]["machine"],
        "runs": runs,
        "ratio_cpu_median": ratios[len(ratios) // 2],
        "ratio_cpu_range": [ratios[0], ratios[-1]],
        "ratio_own_cpu_median": own[len(own) // 2],
        "cadence": runs[0]["cadence"],
        "target_ratio_cpu": TARGET_RATIO_CPU,
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(
        f"ours/theirs CPU: median {result['ratio_cpu_median']:.3f} over {len(runs)} runs "
        f"(range {ratios[0]:.3f}-{ratios[-1]:.3f}); target <= {TARGET_RATIO_CPU}; "
        f"{result['cadence']}"
    )
    emit("peer", result)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
