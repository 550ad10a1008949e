"""Markdown rendering of a ``run_all`` report (the JSON is the record; this is for reading)."""

from __future__ import annotations

from typing import Any

MIB = 2**20


def _machine(m: dict[str, Any]) -> list[str]:
    pk = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v)
    mem = m["mem_total_bytes"] / 2**30 if m.get("mem_total_bytes") else float("nan")
    return [
        f"- date: {m['date']}",
        f"- machine: {m['nproc']} CPUs ({m['cpu_model']}), {mem:.1f} GiB RAM, Linux {m['kernel']}",
        f"- Python {m['python']}; {pk}",
    ]


def _collection(r: dict[str, Any]) -> list[str]:
    out = [
        "| GPUs | processes/GPU | CPU ms/cycle | in simulator | ours | encode ms | calls | min |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        out.append(
            f"| {row['gpus']} | {row['processes_per_gpu']} | {row['cpu_ms']:.2f} | "
            f"{row['sim_ms']:.2f} | {row['ours_ms']:.2f} | {row['encode_ms']:.2f} | "
            f"{row['calls']:.1f} | {row['min']:.1f} |"
        )
    return out


def _peer(r: dict[str, Any]) -> list[str]:
    if "skipped" in r:
        return [f"skipped: {r['skipped']}"]
    out = [
        "| run | exporter | CPU s/min | user | system | in simulator | own | RSS MiB | C calls/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, run in enumerate(r["runs"], 1):
        for name, e in run["exporters"].items():
            if "cpu_s_per_min" not in e:
                out.append(f"| {i} | {name} | | | | | | {e['rss_bytes'] / MIB:.1f} | |")
                continue
            out.append(
                f"| {i} | {name} | {e['cpu_s_per_min']:.2f} | {e['user_s_per_min']:.2f} | "
                f"{e['system_s_per_min']:.2f} | {e['sim_s_per_min']:.2f} | "
                f"{e['own_cpu_s_per_min']:.2f} | {e['rss_bytes'] / MIB:.1f} | "
                f"{e['c_calls_per_s']:.0f} |"
            )
    out.append("")
    out.append(
        f"ours/theirs CPU: median **{r['ratio_cpu_median']:.3f}** (range "
        f"{r['ratio_cpu_range'][0]:.3f}-{r['ratio_cpu_range'][1]:.3f}); without the simulator's "
        f"share {r['ratio_own_cpu_median']:.3f}; target <= {r.get('target_ratio_cpu', 1 / 3):.3f}; "
        f"{r.get('cadence', 'nvitop-exporter scraped every 1 s, gpumetrics pulled every 10 s')}."
    )
    last = r["runs"][-1]["exporters"]
    for name, e in last.items():
        prof = e.get("profile") or {}
        if "areas" in prof:
            areas = ", ".join(f"{a} {100 * v:.0f} %" for a, v in prof["areas"].items())
            out.append(f"- {name} profile ({prof['samples']} GIL samples): {areas}")
    return out


def _pull(r: dict[str, Any]) -> list[str]:
    b, d = r["backlog"], r["delivery_ms"]
    return [
        f"60 s backlog ({b['batches']} batches, {b['points']} points, {b['bytes'] / MIB:.2f} MiB) "
        f"in {r['pulls_per_delivery']} pulls: median **{d['median']:.1f} ms** (min {d['min']:.1f},"
        f" p90 {d['p90']:.1f}, max {d['max']:.1f}); ack-only pull {r['ack_only_ms_median']:.1f} "
        f"ms; server CPU {r['server_cpu_ms_per_delivery']:.1f} ms per delivery; client decode "
        f"{r['client_decode_ms']:.1f} ms; target < {r['target_ms']:.0f} ms."
    ]


def _profiler(r: dict[str, Any]) -> list[str]:
    m = r["memory"]
    return [
        f"{r['processes']} declarations of {r['wire_bytes_per_declaration']:.0f} B: batched "
        f"({r['batch']} per request) **{r['batched']['per_s']:,.0f}/s**, streamed "
        f"**{r['streamed']['per_s']:,.0f}/s**; server RSS per tracked process "
        f"**{m['bytes_per_process']:,.0f} B** (targets >= {r['target_per_s']:,}/s, < "
        f"{r['target_bytes_per_process']} B)."
    ]


def _memory(r: dict[str, Any]) -> list[str]:
    m = r["rss_bytes"]
    return [
        f"store at default limits, full: {r['full']['held_bytes'] / MIB:.1f} MiB, "
        f"{r['full']['held_points']} points, {r['full']['held_batches']} batches held "
        f"(drops {r['full']['dropped_points']}); RSS before {m['before_fill'] / MIB:.1f} MiB, "
        f"full **{m['full'] / MIB:.1f} MiB**, after draining **{m['after_drain'] / MIB:.1f} MiB**"
        f", after malloc_trim {m['after_malloc_trim'] / MIB:.1f} MiB."
    ]


RENDER = {
    "collection": _collection,
    "peer": _peer,
    "peer-1s": _peer,
    "pull": _pull,
    "profiler": _profiler,
    "memory": _memory,
}


def markdown(report: dict[str, Any]) -> str:
    """Render a ``run_all`` report."""
    lines = ["# gpumetrics benchmark report", "", *_machine(report["machine"]), ""]
    for name, b in report["benchmarks"].items():
        lines += [f"## {name}", "", f"status: {b['status']} ({b.get('seconds', '?')} s)", ""]
        render = RENDER.get(name)
        if render is not None and "result" in b:
            try:
                lines += render(b["result"])
            except (KeyError, TypeError, ZeroDivisionError) as exc:
                lines += [f"(could not render: {exc!r})", "", "```", b.get("text", ""), "```"]
        else:
            lines += ["```", b.get("text", "").strip(), "```"]
        lines.append("")
    return "\n".join(lines)
