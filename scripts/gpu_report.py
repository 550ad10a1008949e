"""Helper of ``scripts/gpu-check.sh``: nvidia-smi readings, the comparison, and the summary.

Subcommands (all read-only; JSON and Markdown into ``--out``):

``smi [--emulate]``
    ``nvidia-smi --query-gpu=index,uuid,FIELD --format=csv,noheader,nounits`` once per field, so
    a field an older ``nvidia-smi`` does not know fails alone; each call under a timeout.
    ``--emulate`` answers the same fields from pynvml instead: only for the dry run on the
    simulated driver, where there is no nvidia-smi (it exercises the comparison code and proves
    nothing about agreement). Writes ``smi.json``.
``compare --pull FILE...``
    Our readings (the newest point of each series in the OTLP/JSON pulls written by
    ``gpumetrics pull --format json``; slow-cadence series such as PCIe and ECC may be only in
    an earlier pull) next to ``smi.json``, converted to nvidia-smi's units; static identity
    attributes next to their nvidia-smi fields. Writes ``compare.json``.
``summary``
    ``<out>/summary.md`` from what the check left in ``--out`` (probe, cycles, comparison,
    sidecar run, GPU state before and after).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SMI_FIELDS: dict[str, tuple[str, dict[str, str], float]] = {
    # nvidia-smi field: (our metric, attribute filter, factor from our unit to nvidia-smi's)
    "memory.total": ("hw.gpu.memory.limit", {}, 1 / 2**20),
    "memory.used": ("hw.gpu.memory.usage", {}, 1 / 2**20),
    "power.draw": ("hw.power", {}, 1.0),
    "enforced.power.limit": ("nvidia.gpu.power.limit", {}, 1.0),
    "temperature.gpu": ("hw.temperature", {}, 1.0),
    "clocks.gr": ("nvidia.gpu.clock.speed", {"nvidia.gpu.clock.domain": "graphics"}, 1e-6),
    "clocks.sm": ("nvidia.gpu.clock.speed", {"nvidia.gpu.clock.domain": "sm"}, 1e-6),
    "clocks.mem": ("nvidia.gpu.clock.speed", {"nvidia.gpu.clock.domain": "memory"}, 1e-6),
    "clocks.video": ("nvidia.gpu.clock.speed", {"nvidia.gpu.clock.domain": "video"}, 1e-6),
    "utilization.gpu": ("hw.gpu.utilization", {"hw.gpu.task": "general"}, 100.0),
    "utilization.memory": ("nvidia.gpu.memory_copy.utilization", {}, 100.0),
    "utilization.encoder": ("hw.gpu.utilization", {"hw.gpu.task": "encoder"}, 100.0),
    "utilization.decoder": ("hw.gpu.utilization", {"hw.gpu.task": "decoder"}, 100.0),
    "ecc.errors.corrected.volatile.total": ("hw.errors", {"error.type": "corrected"}, 1.0),
    "ecc.errors.uncorrected.volatile.total": ("hw.errors", {"error.type": "uncorrected"}, 1.0),
}
"""``--query-gpu`` fields compared with our metrics (units: MiB, W, °C, MHz, %, count)."""
STATIC_FIELDS: dict[str, str] = {
    "name": "hw.model",
    "serial": "hw.serial_number",
    "driver_version": "hw.driver_version",
    "vbios_version": "hw.firmware_version",
}
"""``--query-gpu`` identity fields and the device attribute that should equal them."""
SCOPE = "parca.nvidia_gpu_metrics"


def _write(out: Path, name: str, data: Any) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def _read(out: Path, name: str) -> Any:
    path = out / name
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


# ------------------------------------------------------------------------------------------ smi


def smi_real(timeout_s: float) -> dict[str, Any]:
    """Per GPU uuid, each field's nvidia-smi value (string) or the error of that field."""
    gpus: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    for field in [*SMI_FIELDS, *STATIC_FIELDS]:
        cmd = ["nvidia-smi", f"--query-gpu=index,uuid,{field}", "--format=csv,noheader,nounits"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors[field] = repr(exc)[:200]
            continue
        if res.returncode:
            errors[field] = (res.stdout + res.stderr).strip()[:200]
            continue
        for line in res.stdout.splitlines():
            parts = [p.strip() for p in line.split(",", 2)]
            if len(parts) == 3:
                gpus.setdefault(parts[1], {"index": parts[0]})[field] = parts[2]
    return {"source": "nvidia-smi", "gpus": gpus, "field_errors": errors}


def _read_or_na(fn: Any) -> str:
    try:
        return str(fn())
    except Exception as exc:  # noqa: BLE001 - nvidia-smi prints [N/A] / [Not Supported]
        return f"[{type(exc).__name__}]"


def _emulate_device(p: Any, i: int, h: Any) -> dict[str, str]:
    util = lambda: p.nvmlDeviceGetUtilizationRates(h)  # noqa: E731
    calls: dict[str, Any] = {
        "memory.total": lambda: p.nvmlDeviceGetMemoryInfo(h).total // 2**20,
        "memory.used": lambda: p.nvmlDeviceGetMemoryInfo(h, version=p.nvmlMemory_v2).used // 2**20,
        "power.draw": lambda: p.nvmlDeviceGetPowerUsage(h) / 1000,
        "enforced.power.limit": lambda: p.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
        "temperature.gpu": lambda: p.nvmlDeviceGetTemperature(h, 0),
        "clocks.gr": lambda: p.nvmlDeviceGetClockInfo(h, 0),
        "clocks.sm": lambda: p.nvmlDeviceGetClockInfo(h, 1),
        "clocks.mem": lambda: p.nvmlDeviceGetClockInfo(h, 2),
        "clocks.video": lambda: p.nvmlDeviceGetClockInfo(h, 3),
        "utilization.gpu": lambda: util().gpu,
        "utilization.memory": lambda: util().memory,
        "utilization.encoder": lambda: p.nvmlDeviceGetEncoderUtilization(h)[0],
        "utilization.decoder": lambda: p.nvmlDeviceGetDecoderUtilization(h)[0],
        "ecc.errors.corrected.volatile.total": lambda: p.nvmlDeviceGetTotalEccErrors(h, 0, 0),
        "ecc.errors.uncorrected.volatile.total": lambda: p.nvmlDeviceGetTotalEccErrors(h, 1, 0),
        "name": lambda: p.nvmlDeviceGetName(h),
        "serial": lambda: p.nvmlDeviceGetSerial(h),
        "driver_version": p.nvmlSystemGetDriverVersion,
        "vbios_version": lambda: p.nvmlDeviceGetVbiosVersion(h),
    }
    return {"index": str(i), **{field: _read_or_na(fn) for field, fn in calls.items()}}


def smi_emulated() -> dict[str, Any]:
    """Answer the same fields from pynvml (dry run on the simulated driver only)."""
    import pynvml as p

    p.nvmlInit()
    gpus: dict[str, dict[str, Any]] = {}
    for i in range(p.nvmlDeviceGetCount()):
        h = p.nvmlDeviceGetHandleByIndex(i)
        gpus[p.nvmlDeviceGetUUID(h)] = _emulate_device(p, i, h)
    p.nvmlShutdown()
    return {"source": "emulated from pynvml (dry run; not nvidia-smi)", "gpus": gpus}


# -------------------------------------------------------------------------------------- compare


def _any(v: dict[str, Any]) -> Any:
    for key in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if key in v:
            return int(v[key]) if key == "intValue" else v[key]
    return None


def latest_points(otlp: dict[str, Any]) -> tuple[dict[tuple[str, str, tuple[Any, ...]], float],
                                                 dict[str, dict[str, Any]]]:  # fmt: skip
    """Newest value per (hw.id, metric, attributes) of the GPU scope, and each hw.id's attributes.

    ``otlp`` is protobuf's JSON mapping of an ``ExportMetricsServiceRequest``.
    """
    newest: dict[tuple[str, str, tuple[Any, ...]], tuple[int, float]] = {}
    ids: dict[str, dict[str, Any]] = {}
    for rm in otlp.get("resourceMetrics", []):
        for sm in rm.get("scopeMetrics", []):
            if sm.get("scope", {}).get("name") != SCOPE:
                continue
            for m in sm.get("metrics", []):
                data = m.get("gauge") or m.get("sum") or {}
                for dp in data.get("dataPoints", []):
                    attrs = {a["key"]: _any(a["value"]) for a in dp.get("attributes", [])}
                    hw_id = attrs.pop("hw.id", None)
                    if hw_id is None:
                        continue
                    ident = {k: attrs.pop(k) for k in list(attrs) if k in STATIC_FIELDS.values()}
                    ids.setdefault(hw_id, {}).update(ident)
                    for k in ("hw.name", "hw.vendor", "hw.type", "hw.parent"):
                        attrs.pop(k, None)
                    value = dp["asDouble"] if "asDouble" in dp else int(dp.get("asInt", 0))
                    key = (hw_id, m["name"], tuple(sorted(attrs.items())))
                    t = int(dp.get("timeUnixNano", 0))
                    if key not in newest or t >= newest[key][0]:
                        newest[key] = (t, float(value))
    return {k: v for k, (_, v) in newest.items()}, ids


def compare(pull: dict[str, Any], smi: dict[str, Any]) -> dict[str, Any]:
    """Rows of (GPU, nvidia-smi field, theirs, ours in their unit, difference)."""
    points, ids = latest_points(pull)
    rows = []
    for uuid, fields in smi.get("gpus", {}).items():
        for field, (metric, want, factor) in SMI_FIELDS.items():
            ours = [
                v
                for (hw, name, attrs), v in points.items()
                if hw == uuid and name == metric and all(dict(attrs).get(k) == x
                                                         for k, x in want.items())
            ]  # fmt: skip
            if not ours and "error.type" in want:
                # hw.errors: without any error so far one series without error.type carries 0
                ours = [v for (hw, name, attrs), v in points.items()
                        if hw == uuid and name == metric and "error.type" not in dict(attrs)
                        and v == 0]  # fmt: skip
            theirs = fields.get(field)
            try:
                t = float(theirs) if theirs is not None else None
            except ValueError:
                t = None
            o = ours[0] * factor if len(ours) == 1 else None
            rows.append({
                "gpu": uuid, "field": field, "nvidia_smi": theirs, "ours": o,
                "metric": metric, "series": len(ours),
                "difference": (o - t) if o is not None and t is not None else None,
            })  # fmt: skip
        for field, attr in STATIC_FIELDS.items():
            ours_s = ids.get(uuid, {}).get(attr)
            rows.append({"gpu": uuid, "field": field, "nvidia_smi": fields.get(field),
                         "ours": ours_s, "metric": attr,
                         "equal": ours_s == fields.get(field)})  # fmt: skip
    missing = sorted(set(smi.get("gpus", {})) - set(ids))
    return {"rows": rows, "gpus_without_our_points": missing, "smi_source": smi.get("source")}


# -------------------------------------------------------------------------------------- summary


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "—" if v is None else str(v)


def summary(out: Path) -> str:
    """Markdown summary of everything in ``out``."""
    lines = ["# gpumetrics real-GPU check", ""]
    meta = out / "meta.txt"
    if meta.exists():
        lines += [f"- {line}" for line in meta.read_text().splitlines() if line.strip()]
    diff = out / "state-diff.txt"
    if diff.exists():
        lines.append(f"- GPU state after the check: {diff.read_text().strip()}")
    lines.append("")
    probe = _read(out, "probe.json")
    if probe and "init_error" in probe:
        lines += [f"NVML could not be initialised: {probe['init_error']}", ""]
    if probe and "devices" in probe:
        lines += ["## NVML calls (per-call latency, µs)", "", f"system: {probe.get('system')}", ""]
        lines += [
            "| GPU | call | arg | median µs | max µs | outcome |",
            "|---|---|---|---:|---:|---|",
        ]
        for d in probe.get("devices", []):
            for c in d.get("calls", []):
                outcome = (
                    "ok"
                    if c.get("ok")
                    else ("HUNG" if c.get("hung") else f"{c.get('kind')} {c.get('code', '')}")
                )
                lines.append(
                    f"| {d['index']} | {c['function']} | {c['arg']} | "
                    f"{_fmt(c.get('median_us'))} | {_fmt(c.get('max_us'))} | {outcome} |"
                )
        lines += ["", "## Sample timestamps against the host clocks", ""]
        lines += [
            "| GPU | buffer | lag to wall µs | to CLOCK_BOOTTIME | to CLOCK_MONOTONIC | "
            "closest | collector rule |",
            "|---|---|---:|---:|---:|---|---|",
        ]
        for d in probe.get("devices", []):
            for name, c in d.get("clock_domain", {}).items():
                lag = c["lag_us"]
                lines.append(
                    f"| {d['index']} | {name} | {lag['wall']} | {lag['boottime']} | "
                    f"{lag['monotonic']} | {c['verdict']} | {c['collector_rule']} |"
                )
        lines.append("")
    cycles = _read(out, "cycles.json")
    if cycles:
        lines += [
            "## Collection cycles (real Collector)",
            "",
            f"steady median {cycles['steady_wall_ms_median']:.1f} ms wall, "
            f"{cycles['steady_cpu_ms_median']:.1f} ms CPU; max {cycles['wall_ms_max']:.1f} "
            f"ms (PCIe every {cycles['pcie_interval_s']} s).",
            "",
        ]
    cmp_ = _read(out, "compare.json")
    if cmp_:
        lines += [
            f"## Our readings next to {cmp_.get('smi_source')}",
            "",
            "| GPU | field | nvidia-smi | ours | difference / equal |",
            "|---|---|---|---|---|",
        ]
        for r in cmp_["rows"]:
            d = r.get("difference", r.get("equal"))
            lines.append(
                f"| {r['gpu'][-8:]} | {r['field']} | {_fmt(r['nvidia_smi'])} | "
                f"{_fmt(r['ours'])} | {_fmt(d)} |"
            )
        lines.append("")
    sidecar = _read(out, "sidecar.json")
    if sidecar:
        lines += ["## Sidecar run", "", "```", json.dumps(sidecar, indent=1), "```", ""]
    steps = out / "steps.tsv"
    if steps.exists():
        lines += ["## Steps", "", "```", steps.read_text().strip(), "```", ""]
    return "\n".join(lines)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Parse the subcommand and run it."""
    ap = argparse.ArgumentParser(prog="gpu_report.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    smi = sub.add_parser("smi")
    smi.add_argument("--emulate", action="store_true")
    smi.add_argument("--name", default="smi.json")
    smi.add_argument("--timeout", type=float, default=20.0)
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("--pull", type=Path, nargs="+", required=True, help="OTLP/JSON pulls")
    cmp_.add_argument("--smi", default="smi.json")
    summ = sub.add_parser("summary")
    for p in (smi, cmp_, summ):
        p.add_argument("--out", type=Path, required=True)
    ns = ap.parse_args(argv)
    if ns.command == "smi":
        _write(ns.out, ns.name, smi_emulated() if ns.emulate else smi_real(ns.timeout))
    elif ns.command == "compare":
        pull: dict[str, Any] = {"resourceMetrics": []}  # the newest point of each series wins
        for path in ns.pull:
            text = path.read_text(encoding="utf-8")  # "{}" (or empty, older CLIs): nothing new
            pull["resourceMetrics"] += json.loads(text or "{}").get("resourceMetrics", [])
        _write(ns.out, "compare.json", compare(pull, _read(ns.out, ns.smi) or {}))
    else:
        (ns.out / "summary.md").write_text(summary(ns.out), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
