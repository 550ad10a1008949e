"""Render ``docs/metrics.md`` from the catalogue (``python -m gpumetrics.metrics.docs``).

A test compares the committed file with this output, so the documentation cannot drift from
``catalogue.yaml``.
"""

from __future__ import annotations

from gpumetrics.metrics.spec import Catalogue, MetricSpec, catalogue

_CADENCE = {
    "errors": " Read every `errors_interval_s`.",
    "accounting": " Read every `accounting_interval_s`.",
}

_SHAPE = {
    "gauge": "Gauge",
    "updowncounter": "UpDownCounter (cumulative non-monotonic Sum)",
    "counter": "Counter (cumulative monotonic Sum)",
}


def _attrs(spec: MetricSpec) -> str:
    parts = []
    for key, values in spec.attributes.items():
        parts.append(f"`{key}`" + (f" = {' / '.join(values)}" if values else ""))
    return "; ".join(parts) or "—"


def _row(spec: MetricSpec) -> str:
    cells = [
        f"`{spec.name}`",
        _SHAPE[spec.instrument.value],
        f"`{spec.unit}`",
        spec.value_type.value,
        _attrs(spec),
        spec.nvml.replace("|", "\\|") or "—",
        f"`{spec.nvidia_smi}`" if spec.nvidia_smi else "—",
        spec.description
        + _CADENCE.get(spec.cadence, "")
        + ("" if spec.enabled else " Off by default: list it in `collection.enabled_metrics`."),
    ]
    return "| " + " | ".join(cells) + " |"


def _pairs(pairs: tuple[tuple[str, str | int], ...]) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in pairs)


def _dcgm_rows(cat: Catalogue) -> list[str]:
    """One row per DCGM field: the GPM ones from their metrics, then ``dcgm_exporter``."""
    rows = []
    for spec in cat.metrics.values():
        for src in spec.gpm:
            if src.dcgm:
                where = f"`{spec.name}`" + (
                    f" {{{_pairs(src.attributes)}}}" if src.attributes else ""
                )
                rows.append(f"| `{src.dcgm}` | {where} | GPM `NVML_GPM_METRIC_{src.metric}` |")
    for d in cat.dcgm_exporter:
        where = f"`{d.metric}`" + (f" {{{_pairs(d.attributes)}}}" if d.attributes else "")
        rows.append(f"| `{d.field}` | {where} | {d.note or '—'} |")
    return rows


def render_metrics_doc(cat: Catalogue) -> str:
    """Return the Markdown text of ``docs/metrics.md`` for ``cat``."""
    head = (
        "| name | instrument | unit | value | attributes beyond the GPU's | NVML source "
        "| nvidia-smi | description |\n|---|---|---|---|---|---|---|---|\n"
    )
    host = [s for s in cat.metrics.values() if s.resource == "host" and s.component == "gpu"]
    parts = [s for s in cat.metrics.values() if s.resource == "host" and s.component != "gpu"]
    proc = [s for s in cat.metrics.values() if s.resource == "process"]
    out = [
        "# Metric catalogue",
        "",
        "Generated from `receiver/gpumetrics/metrics/catalogue.yaml` by",
        "`python -m gpumetrics.metrics.docs > docs/metrics.md`; a test fails when they differ.",
        "",
        f"Scope `{cat.scope.name}`, schema `{cat.scope.schema_url}`. `hw.*` metrics follow the",
        "OpenTelemetry hardware semantic conventions exactly; `nvidia.*` cover what the "
        "conventions",
        "do not. Ratios are fractions 0–1 (NVML percentages divided by 100). A reading NVML "
        "could not",
        "give produces no point, never a 0.",
        "",
        "## Device metrics (host resource)",
        "",
        "Every point carries `hw.id` (the NVML UUID) and, where known, `hw.name`, `hw.vendor`,",
        "`hw.model`, `hw.serial_number`, `hw.driver_version`, `hw.firmware_version`. A MIG "
        "instance",
        "has its own `hw.id` (the MIG UUID) and `hw.parent` = the physical GPU's UUID. Where MIG",
        "is supported, device points also carry `nvidia.gpu.mig.mode` (`enabled`/`disabled`).",
        "With pod attribution (Kubernetes), device points of a GPU the kubelet allocated also",
        "carry `k8s.namespace.name`, `k8s.pod.name`, `k8s.container.name` and, when several",
        "containers share it, `nvidia.gpu.k8s.shared` = true (docs/kubernetes.md).",
        "",
        head + "\n".join(_row(s) for s in host),
        "",
        "The `nvidia.gpu.prof.*` metrics come from NVML's GPU Performance Monitoring (GPM,",
        "Hopper and newer): two samples one tick apart, so each point describes the tick",
        "before it. On a MIG-enabled GPU the parent's points describe the whole GPU and each",
        "MIG instance's points its own GPU instance (`nvmlGpmMigSampleGet`); a GPU instance",
        "split into several compute instances reports on the parent's `hw.id` with",
        "`nvidia.gpu.mig.gpu_instance.id`. GPUs without GPM report none of them.",
        "",
        "## Component metrics (fans, NVLink links)",
        "",
        "A fan or NVLink link is a component of its GPU: `hw.id` = `<GPU UUID>:fan:<n>` or",
        "`<GPU UUID>:nvlink:<n>`, `hw.name` = `gpu<i>/fan<n>` or `gpu<i>/nvlink<n>`, `hw.parent`",
        "= the GPU's UUID. NVLink link errors are `hw.errors{hw.type=network}` on the link",
        "(see `hw.errors` above).",
        "",
        head + "\n".join(_row(s) for s in parts),
        "",
        "## Per-process metrics (one resource per process)",
        "",
        "Points carry only the GPU's identity attributes (`hw.id`, and `hw.parent` for a MIG",
        "instance); the process is identified by its resource (see docs/identity.md).",
        "",
        head + "\n".join(_row(s) for s in proc),
        "",
        "## dcgm-exporter fields and their equivalents",
        "",
        "For a dashboard built on dcgm-exporter: the metric (and attributes) that answers each",
        "DCGM field. Units differ where DCGM's do: DCGM reports percent, MiB, mJ and µs where",
        "these report ratios 0–1, bytes, J and s; DCGM's `_PROF_` rates are bytes per second",
        "like these.",
        "",
        "**Error counts have no zero series per type.** `hw.errors` follows the semantic",
        'conventions\' rule that `error.type` is present "if and only if an error has occurred":',
        "while a GPU (or link) has had no error of any type, one series *without* `error.type`",
        "carries the 0; a type's own series appears with its count when that count goes above 0",
        '(and the series without `error.type` ends). So `error_type="uncorrected"` does not',
        "exist before the first uncorrected error, and `increase()`/`rate()` over it miss that",
        'first error. Alert on the count itself (`hw_errors_total{hw_type="gpu",',
        'error_type="uncorrected"} > 0`) or on the per-GPU total, which is continuous',
        '(`increase(sum without (error_type) (hw_errors_total{hw_type="gpu"})[1h:])`).',
        "",
        "| DCGM field | metric | source or note |",
        "|---|---|---|",
        *_dcgm_rows(cat),
        "",
        f"## Self-telemetry (scope `{cat.self_scope.name}`, host resource)",
        "",
        "| name | instrument | unit | attributes | description |",
        "|---|---|---|---|---|",
    ]
    for s in cat.self_metrics.values():
        attrs = ", ".join(f"`{k}`" for k in s.attributes) or "—"
        shape = _SHAPE[s.instrument.value]
        out.append(f"| `{s.name}` | {shape} | `{s.unit}` | {attrs} | {s.description} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render_metrics_doc(catalogue()), end="")
