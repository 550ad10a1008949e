"""Summaries of a py-spy profile of a running exporter (hot spots for ``docs/performance.md``).

``py-spy record --format raw`` writes collapsed stacks, one ``frame;frame;...;leaf COUNT`` line
per distinct stack, each frame ``function (file:line)``; py-spy samples every thread and, by
default, leaves idle threads out, so the samples are where CPU went. :func:`summarize` reports:

* ``areas``: share of samples whose stack passes through each area, first match from the leaf
  up (the simulated driver, nvidia-ml-py, collection, OTLP encoding, identity, store, gRPC,
  logging, the Prometheus client, psutil, nvitop, other);
* ``self``: the leaf functions with the most samples;
* ``inclusive``: the functions of the exporter's own packages on most stacks.

Run: ``python -m benchmarks.profile_report PROFILE.txt``.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

AREAS: tuple[tuple[str, str], ...] = (
    ("simulated driver", "nvmlsim/"),
    ("nvidia-ml-py", "pynvml.py"),
    ("OTLP encoding", "gpumetrics/metrics/encode"),
    ("OTLP encoding", "gpumetrics/metrics/bulk"),
    ("OTLP encoding", "gpumetrics/metrics/kernels"),
    ("producer", "gpumetrics/metrics/"),
    ("identity", "gpumetrics/identity/"),
    ("store", "gpumetrics/store/"),
    ("gRPC service", "gpumetrics/service/"),
    ("self-telemetry", "gpumetrics/selftelemetry"),
    ("collection", "gpumetrics/nvml/"),
    ("logging", "logging/"),
    ("prometheus_client", "prometheus_client/"),
    ("psutil", "psutil/"),
    ("nvitop", "nvitop"),
    ("grpc", "grpc/"),
)
"""(area, path fragment); a sample belongs to the first area found walking from its leaf up."""

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^:()]*):?(?P<line>\d*)\)$")
OWN = ("gpumetrics/", "nvitop", "prometheus_client/")


def _frames(stack: str) -> list[tuple[str, str]]:
    out = []
    for raw in stack.split(";"):
        m = _FRAME.match(raw)
        out.append((m["func"], m["file"]) if m else (raw, ""))
    return out


def summarize(text: str, top: int = 15) -> dict[str, Any]:
    """Summarize py-spy raw output ``text`` (see the module docstring)."""
    total = 0
    areas: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = _frames(stack)
        func, file = frames[-1]
        leaf[f"{func} ({file})"] += n
        area = "other"
        for _func, f_file in reversed(frames):
            hit = next((a for a, frag in AREAS if frag in f_file), None)
            if hit:
                area = hit
                break
        areas[area] += n
        seen = set()
        for f_func, f_file in frames:
            if any(o in f_file for o in OWN):
                key = f"{f_func} ({f_file})"
                if key not in seen:
                    seen.add(key)
                    inclusive[key] += n
    share = (lambda n: round(n / total, 4)) if total else (lambda n: 0.0)
    return {
        "samples": total,
        "areas": {a: share(n) for a, n in areas.most_common()},
        "self": {k: share(n) for k, n in leaf.most_common(top)},
        "inclusive": {k: share(n) for k, n in inclusive.most_common(top)},
    }


if __name__ == "__main__":
    print(json.dumps(summarize(Path(sys.argv[1]).read_text()), indent=2))
