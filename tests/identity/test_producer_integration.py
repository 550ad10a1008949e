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


def test_producer_uses_the_resourcer() -> None:
    procfs = ProcfsReader(str(PROC / "host"), user_name=lambda uid: None)
    resourcer = new_process_resourcer(
        None,
        None,
        "node-a",
        True,
        [{"source_labels": ["comm"], "regex": "kworker/.*", "action": "drop"}],
        procfs=procfs,
        read_process_context=False,
    )
    producer = Producer()
    producer.set_process_resourcer(resourcer)
    for pid in (4242, 5000):
        producer.record_process(
            pid,
            lambda buf: buf.points(names.MetricProcessMemoryUsage).append(
                Point(1024, 1_700_000_000_000_000_000, (("hw.id", "GPU-0"),))
            ),
        )
    request = producer.collect()
    per_process = [
        _resource(rm) for rm in request.resource_metrics if "process.pid" in _resource(rm)
    ]
    assert len(per_process) == 1  # pid 5000 (a kworker) was dropped by the relabel rule
    res = per_process[0]
    assert res["process.pid"] == 4242
    assert res["service.name"] == "trainer"  # OTEL_SERVICE_NAME from its environ
    assert res["deployment.environment.name"] == "prod"
    assert res["k8s.node.name"] == "node-a"
    assert res["container.id"].startswith("3f2b8e1c")
    assert res["process.executable.name"] == "python3.11"
