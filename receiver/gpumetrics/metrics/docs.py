"""Render ``docs/metrics.md`` from the catalogue (``python -m gpumetrics.metrics.docs``).

A test compares the committed file with this output, so the documentation cannot drift from
``catalogue.yaml``.
"""

from __future__ import annotations

from gpumetrics.metrics.spec import Catalogue, MetricSpec, catalogue

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
        spec.description,
    ]
    return "| " + " | ".join(cells) + " |"


def render_metrics_doc(cat: Catalogue) -> str:
    """Return the Markdown text of ``docs/metrics.md`` for ``cat``."""
    head = (
        "| name | instrument | unit | value | attributes beyond the GPU's | NVML source "
        "| nvidia-smi | description |\n|---|---|---|---|---|---|---|---|\n"
    )
    host = [s for s in cat.metrics.values() if s.resource == "host"]
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
        "## Per-process metrics (one resource per process)",
        "",
        "Points carry only the GPU's identity attributes (`hw.id`, and `hw.parent` for a MIG",
        "instance); the process is identified by its resource (see docs/identity.md).",
        "",
        head + "\n".join(_row(s) for s in proc),
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
