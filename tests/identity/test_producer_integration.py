"""The resourcer plugged into the metrics Producer: per-process resources end up in OTLP."""

from __future__ import annotations

from gpumetrics.identity.procfs import ProcfsReader
from gpumetrics.identity.resourcer import new_process_resourcer
from gpumetrics.metrics import names
from gpumetrics.metrics.buffer import Point
from gpumetrics.metrics.producer import Producer

from .conftest import PROC


def _resource(rm) -> dict:
    out = {}
    for kv in rm.resource.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind)
    return out


def _per_process(mode: str) -> list[dict]:
    procfs = ProcfsReader(
        str(PROC / "host"), user_name=lambda uid: None, include_env_vars=["OTEL_SERVICE_NAME"]
    )
    resourcer = new_process_resourcer(
        None,
        None,
        "node-a",
        True,
        [{"source_labels": ["comm"], "regex": "kworker/.*", "action": "drop"}],
        procfs=procfs,
        read_process_context=False,
        mode=mode,
    )
    producer = Producer()
    producer.set_process_resourcer(resourcer)
    for pid in (4242, 5000):
        producer.record_process(
            pid,
            lambda buf: buf.points(names.MetricProcessMemoryUsage).append(
                Point(
                    1024,
                    1_700_000_000_000_000_000,
                    (("hw.id", "GPU-0"),),
                    1_600_000_000_000_000_000,
                )
            ),
        )
    request = producer.collect()
    return [_resource(rm) for rm in request.resource_metrics if "process.pid" in _resource(rm)]


def test_producer_uses_the_resourcer() -> None:
    """Profiler mode (the default): the eBPF profiler's keys, nothing else."""
    per_process = _per_process("profiler")
    assert len(per_process) == 1  # pid 5000 (a kworker) was dropped by the relabel rule
    assert per_process[0] == {
        "process.pid": 4242,
        "process.executable.path": "/usr/bin/python3.11",
        "process.executable.name": "python3.11",
        "container.id": "3f2b8e1c9d7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c",
        "process.environment_variable.OTEL_SERVICE_NAME": "second",  # the last occurrence
    }


def test_producer_uses_the_resourcer_enriched() -> None:
    per_process = _per_process("enriched")
    assert len(per_process) == 1
    res = per_process[0]
    assert res["process.pid"] == 4242
    assert res["service.name"] == "trainer"  # OTEL_SERVICE_NAME from its environ (as getenv)
    assert res["deployment.environment.name"] == "prod"
    assert res["k8s.node.name"] == "node-a"
    assert res["container.id"].startswith("3f2b8e1c")
    assert res["process.environment_variable.OTEL_SERVICE_NAME"] == "second"
