"""Run every benchmark and write a report: ``benchmarks/results/<date>.json`` and ``.md``.

``python -m benchmarks [--quick] [--only NAME ...]`` (or ``python benchmarks/run_all.py``).

Each benchmark runs in its own process (so one's memory cannot colour another's RSS), one after
another (so they never compete for the CPUs), under a time limit. A benchmark that prints a
``BENCHMARK-RESULT`` JSON line contributes that; the others contribute their text output. A
failed or timed-out benchmark is recorded as such and the run goes on: benchmarks never fail on
a number, and this command exits 0 unless it could not write the report.

About 13 minutes on the 2-core CI machine (``--quick``: about 3), plus about 9 (quick: 1) for the
durable store's comparison (``store``); the side-by-side run needs the peer's virtualenv
(``python -m benchmarks.peer_bench --setup-peer``) and is skipped without it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a file: make the `benchmarks` package importable
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import RESULT_PREFIX, machine  # noqa: E402
from benchmarks.report import markdown  # noqa: E402

# name, module, arguments, quick arguments, time limit (s)
BENCHMARKS: tuple[tuple[str, str, list[str], list[str], int], ...] = (
    ("collection", "benchmarks.collection_bench", ["--cycles", "30"], ["--cycles", "10"], 600),
    ("collection-scale", "benchmarks.collection_bench", ["--scale"],
     ["--scale", "--batches", "1"], 1200),
    ("sim_overhead", "benchmarks.sim_overhead_bench", [],
     ["--calls", "2000", "--cycles", "3"], 300),
    ("pull", "benchmarks.pull_bench", ["--repetitions", "20"], ["--repetitions", "5"], 300),
    ("profiler", "benchmarks.profiler_bench", [], ["--processes", "20000"], 600),
    ("identity", "benchmarks.identity_bench", [],
     ["--processes", "20000", "--seconds", "0.5"], 600),
    ("memory", "benchmarks.memory_bench", [], [], 600),
    ("events", "benchmarks.events_bench", [],
     ["--storm", "2000", "--records", "500", "--idle-s", "2"], 300),
    ("encode", "benchmarks.encode_bench", [],
     ["--batches", "5", "--warmup", "5", "--window", "20", "--repeat", "1"], 900),
    ("peer", "benchmarks.peer_bench", ["--repeat", "3"],
     ["--repeat", "1", "--warmup", "5", "--window", "20", "--profile-s", "10"], 1200),
    ("rss", "benchmarks.rss_bench", [], ["--warmup", "15"], 300),
    ("store", "benchmarks.store_bench", [],
     ["--window", "30", "--warmup", "10", "--repeat", "1", "--appends", "20"], 900),
    ("receiver", "benchmarks.receiver_bench", [], ["--warmup", "5", "--window", "30"], 1200),
    ("peer-1s", "benchmarks.peer_bench",
     ["--repeat", "3", "--scrape-nvitop-s", "1", "--profile-s", "0",
      "--out", "benchmarks/results/peer-1s"],
     ["--repeat", "1", "--scrape-nvitop-s", "1", "--warmup", "5", "--window", "20",
      "--profile-s", "0", "--out", "benchmarks/results/peer-1s"], 1200),
)  # fmt: skip


def run_one(module: str, args: list[str], limit_s: int) -> dict[str, Any]:
    """Run one benchmark module; return its JSON result (or its text), status and duration."""
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=limit_s,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return {"status": f"timed out after {limit_s}s", "text": out[-4000:]}
    took = time.monotonic() - start
    result: dict[str, Any] = {"status": "ok" if proc.returncode == 0 else f"exit {proc.returncode}"}
    text = []
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result["result"] = json.loads(line[len(RESULT_PREFIX) :])
        else:
            text.append(line)
    result["text"] = "\n".join(text)[-6000:]
    if proc.returncode:
        result["stderr"] = proc.stderr[-4000:]
    result["seconds"] = round(took, 1)
    return result


def main() -> int:
    """Run the selected benchmarks and write the JSON and Markdown report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller, shorter runs")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ns = ap.parse_args()
    names = {b[0] for b in BENCHMARKS}
    unknown = set(ns.only or ()) - names
    if unknown:
        ap.error(f"--only: unknown benchmark(s) {sorted(unknown)}; known: {sorted(names)}")
    report: dict[str, Any] = {"machine": machine(), "quick": ns.quick, "benchmarks": {}}
    for name, module, args, quick, limit in BENCHMARKS:
        if ns.only and name not in ns.only:
            continue
        print(f"== {name} ...", flush=True)
        r = run_one(module, quick if ns.quick else args, limit)
        report["benchmarks"][name] = r
        print(f"   {r['status']} in {r.get('seconds', '?')} s", flush=True)
    ns.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    json_path = ns.out / f"{stamp}.json"
    json_path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    md_path = ns.out / f"{stamp}.md"
    md_path.write_text(markdown(report), encoding="utf-8")
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
