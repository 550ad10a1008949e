"""The batch under construction has a byte budget (issue 23, item 1: store.max_collection_bytes).

``Producer.collect_parts(max_bytes)`` builds one collection resource by resource, each serialized
at once; the host resource is always kept, then processes in pid order while they fit. The
batcher charges what was left out to the store as ``max_collection_bytes``, so every point that
was recorded is stored or counted. The performance redesign of the producer keeps this contract.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from gpumetrics.metrics import GPU, CollectionParts, Producer, count_points, names
from gpumetrics.runtime import Batcher
from gpumetrics.selftelemetry import Telemetry
from gpumetrics.store import BatchStore
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

T = 1_700_000_000_000_000_000
GPU0 = GPU(uuid="GPU-0", index=0, name="gpu0", model="NVIDIA H100")


class Resourcer:
    """Gives pid ``p`` a resource with a ``p``-byte value (so sizes differ by pid)."""

    def put_resource(self, pid: int, attrs: dict[str, Any]) -> bool:
        attrs["service.name"] = f"svc-{pid}"
        attrs["app.padding"] = "x" * pid
        return True


def record(p: Producer, pids: list[int], points: int = 3) -> None:
    p.record_host(lambda b: b.add(names.MetricPower, 300.0, T, GPU0.attributes()))

    def samples(buf: Any) -> None:
        for i in range(points):
            buf.add(names.MetricProcessUtilization, 0.5, T + i, GPU0.id_attributes())

    for pid in pids:
        p.record_process(pid, samples)


def producer() -> Producer:
    p = Producer(host_attributes={"host.name": "node-1"})
    p.set_process_resourcer(Resourcer())
    return p


def parse(c: CollectionParts) -> metrics_service_pb2.ExportMetricsServiceRequest:
    return metrics_service_pb2.ExportMetricsServiceRequest.FromString(
        b"".join(d for d, _ in c.parts)
    )


def pids_of(req: Any) -> list[int]:
    out = []
    for rm in req.resource_metrics:
        for kv in rm.resource.attributes:
            if kv.key == "process.pid":
                out.append(kv.value.int_value)
    return out


def test_without_a_budget_the_parts_are_what_collect_makes():
    a, b = producer(), producer()
    record(a, [10, 20, 30])
    record(b, [10, 20, 30])
    c = a.collect_parts()
    assert parse(c) == b.collect()
    assert [n for _, n in c.parts] == [1, 3, 3, 3] and c.points == 10
    for data, n in c.parts:  # each part is one resource, a request of its own
        part = metrics_service_pb2.ExportMetricsServiceRequest.FromString(data)
        assert len(part.resource_metrics) == 1 and count_points(part) == n
    assert (c.dropped_points, c.dropped_resources) == (0, 0)


def test_processes_beyond_the_budget_are_left_out_and_counted():
    full = producer()
    record(full, [100, 2000, 300, 400])
    sizes = [len(d) for d, _ in full.collect_parts().parts]  # host, 100, 2000, 300, 400
    budget = sizes[0] + sizes[1] + sizes[3] + sizes[4] + 10  # pid 2000 does not fit
    p = producer()
    record(p, [100, 2000, 300, 400])
    c = p.collect_parts(budget)
    assert c.size <= budget
    assert pids_of(parse(c)) == [100, 300, 400]  # first fit: later, smaller ones still fit
    assert (c.dropped_resources, c.dropped_points) == (1, 3)
    assert c.points + c.dropped_points == 1 + 4 * 3  # every recorded point is one or the other


def test_the_host_resource_is_kept_even_over_the_budget():
    p = producer()
    record(p, [10])
    c = p.collect_parts(1)
    assert len(c.parts) == 1 and c.points == 1  # the GPU's point
    assert (c.dropped_resources, c.dropped_points) == (1, 3)


def test_a_negative_budget_names_the_argument():
    with pytest.raises(ValueError, match="^max_bytes:"):
        producer().collect_parts(-1)


def test_the_batcher_charges_what_was_left_out_to_the_store_and_logs_once(caplog):
    tel = Telemetry()
    p, store, ready = producer(), BatchStore(epoch="E", telemetry=tel), threading.Event()
    store.pull("c")  # a consumer registered before: it is told
    batcher = Batcher(p, store, 10.0, ready, max_collection_bytes=2000)
    caplog.set_level(logging.DEBUG, logger="gpumetrics.runtime.batcher")
    for _ in range(2):
        record(p, [10, 5000])  # pid 5000's resource alone is over the budget
        batcher.run_once()
    s = store.stats()
    assert s.dropped_points["max_collection_bytes"] == 6
    assert s.held_points == 2 * (1 + 3)
    assert s.appended_points == s.released_points + sum(s.dropped_points.values()) + s.held_points
    r = store.pull("c")
    assert (r.dropped_data_points, r.drop_reasons) == (6, ("max_collection_bytes",))
    assert r.data_points == 8
    assert tel.value("gpumetrics.store.points.dropped", {"reason": "max_collection_bytes"}) == 6
    warned = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warned) == 1 and "store.max_collection_bytes" in warned[0].getMessage()
