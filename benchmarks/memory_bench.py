"""Memory: RSS with a full batch store at its default limits, and after it drains.

Batches (built in a child process) are those the sidecar appends for the store's sizing node
(``benchmarks/workload.py``: 8 GPUs of ``h100-8x-training``, 64 processes with realistic
identities, 10 one-second cycles per batch), serialized once; ten distinct ones are cycled, each
append a fresh copy of the bytes (as the batcher's serialization would make). The real
``BatchStore`` with **default** ``StoreLimits`` (96 MiB, 500 000 points, 900 s) is filled until
its limits have bound for a while (appended bytes = 1.5 x ``max_bytes``); the age limit cannot
bind in a fill this fast, so the byte or point limit does. Then one consumer drains it (Pull +
acknowledgement until ``more`` is false, then ``ack_only``), which releases every batch.

Reported: this process's RSS before filling (imports, workload templates), full, after the
drain (plus ``gc.collect()``), and after glibc ``malloc_trim(0)`` (a diagnostic: whether freed
memory was only kept by the allocator), with the store's own accounting (bytes, points, batches
held; drops by reason).

Run: ``python -m benchmarks.memory_bench``.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpumetrics.store import BatchStore, StoreLimits

from benchmarks.harness import emit, machine, malloc_trim, self_rss_bytes
from benchmarks.server_fixture import read_batches

ROOT = Path(__file__).resolve().parents[1]


def run() -> dict[str, Any]:
    """Fill, measure, drain, measure; return the figures."""
    with tempfile.TemporaryDirectory() as tmp:  # built in a child: its heap stays out of ours
        path = Path(tmp) / "batches.bin"
        subprocess.run(
            [sys.executable, "-m", "benchmarks.workload", "--out", str(path), "--batches", "10"],
            cwd=ROOT,
            check=True,
            timeout=600,
        )
        templates = read_batches(path)
    gc.collect()
    limits = StoreLimits()
    store = BatchStore(limits)
    rss_empty = self_rss_bytes()
    appended = 0
    t0 = time.perf_counter()
    i = 0
    while appended < 1.5 * limits.max_bytes:
        points, data = templates[i % len(templates)]
        store.append_serialized(bytes(memoryview(data)), points)
        appended += len(data)
        i += 1
    fill_s = time.perf_counter() - t0
    gc.collect()
    rss_full = self_rss_bytes()
    full = store.stats()
    t0 = time.perf_counter()
    ack, epoch, pulls = 0, "", 0
    while True:
        r = store.pull("drain", ack_sequence=ack, ack_epoch=epoch, max_bytes=4_128_768)
        pulls += 1
        epoch = r.epoch
        if r.last_sequence:
            ack = r.last_sequence
        if not r.more:
            break
    store.pull("drain", ack_sequence=ack, ack_epoch=epoch, ack_only=True)
    drain_s = time.perf_counter() - t0
    del r
    gc.collect()
    rss_drained = self_rss_bytes()
    drained = store.stats()
    trimmed = malloc_trim()
    rss_trimmed = self_rss_bytes()
    return {
        "machine": machine(),
        "limits": {
            "max_bytes": limits.max_bytes,
            "max_data_points": limits.max_data_points,
            "max_age_s": limits.max_age_s,
        },
        "batch_bytes": sum(len(d) for _, d in templates) / len(templates),
        "batch_points": sum(p for p, _ in templates) / len(templates),
        "appended_batches": i,
        "fill_s": fill_s,
        "drain_s": drain_s,
        "drain_pulls": pulls,
        "full": _stats(full),
        "drained": _stats(drained),
        "rss_bytes": {
            "before_fill": rss_empty,
            "full": rss_full,
            "after_drain": rss_drained,
            "after_malloc_trim": rss_trimmed,
        },
        "malloc_trim_released": trimmed,
    }


def _stats(s: Any) -> dict[str, Any]:
    return {
        "held_batches": s.held_batches,
        "held_points": s.held_points,
        "held_bytes": s.held_bytes,
        "released_batches": s.released_batches,
        "dropped_points": dict(s.dropped_points),
    }


def main() -> int:
    """Print and emit the figures."""
    r = run()
    m = r["rss_bytes"]
    mib = 2**20
    print(
        f"store full ({r['full']}): RSS {m['full'] / mib:.1f} MiB "
        f"(+{(m['full'] - m['before_fill']) / mib:.1f} over {m['before_fill'] / mib:.1f}); "
        f"after drain {m['after_drain'] / mib:.1f} MiB; after malloc_trim "
        f"{m['after_malloc_trim'] / mib:.1f} MiB"
    )
    emit("memory", r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
