from typing import Any

from gpumetrics.metrics import GPU, Producer, count_points, names
from gpumetrics.selftelemetry import Telemetry
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

T = 1_700_000_000_000_000_000
GPU0 = GPU(uuid="GPU-0", index=0, name="gpu0", model="NVIDIA H100")
GPU1 = GPU(uuid="GPU-1", index=1, name="gpu1", model="NVIDIA H100")


def attrs_of(resource):
    out = {}
    for kv in resource.attributes:
        out[kv.key] = getattr(kv.value, kv.value.WhichOneof("value"))
    return out


def record_power(p, gpu, watts, t=T):
    p.record_host(
        lambda b: b.add(names.MetricPower, watts, t, gpu.attributes() + (("hw.type", "gpu"),))
    )


def test_one_metric_per_name_per_scope_with_a_point_per_device():
    p = Producer(host_attributes={"host.name": "node-1"})
    record_power(p, GPU0, 300.0)
    record_power(p, GPU1, 310.0)
    record_power(p, GPU0, 305.0, T + 1)
    req = p.collect()
    assert len(req.resource_metrics) == 1
    metrics = req.resource_metrics[0].scope_metrics[0].metrics
    assert [m.name for m in metrics] == ["hw.power"]
    assert [dp.as_double for dp in metrics[0].gauge.data_points] == [300.0, 310.0, 305.0]
    assert attrs_of(req.resource_metrics[0].resource) == {"host.name": "node-1"}
    assert req.resource_metrics[0].scope_metrics[0].scope.name == names.ScopeName


def test_produce_drains_so_a_second_collect_is_empty():
    p = Producer()
    record_power(p, GPU0, 300.0)
    assert count_points(p.collect()) == 1
    assert p.collect() == metrics_service_pb2.ExportMetricsServiceRequest()


def test_process_without_resourcer_gets_only_int_pid_resource():
    p = Producer()
    p.record_process(
        4242,
        lambda b: b.add(names.MetricProcessMemoryUsage, 8 << 30, T, GPU0.id_attributes(), T - 1),
    )
    req = p.collect()
    assert len(req.resource_metrics) == 1
    rm = req.resource_metrics[0]
    assert attrs_of(rm.resource) == {"process.pid": 4242}
    assert rm.resource.attributes[0].value.WhichOneof("value") == "int_value"
    dp = rm.scope_metrics[0].metrics[0].sum.data_points[0]
    assert [kv.key for kv in dp.attributes] == ["hw.id"]


def test_process_that_stopped_using_the_gpu_gets_no_resource_next_time():
    p = Producer()
    p.record_process(
        1, lambda b: b.add(names.MetricProcessUtilization, 0.5, T, GPU0.id_attributes())
    )
    p.record_process(
        2, lambda b: b.add(names.MetricProcessUtilization, 0.25, T, GPU0.id_attributes())
    )
    assert len(p.collect().resource_metrics) == 2
    p.record_process(
        2, lambda b: b.add(names.MetricProcessUtilization, 0.5, T + 1, GPU0.id_attributes())
    )
    req = p.collect()
    assert [attrs_of(rm.resource)["process.pid"] for rm in req.resource_metrics] == [2]


class Resourcer:
    def __init__(self, drop=()):
        self.drop = set(drop)
        self.calls = []

    def put_resource(self, pid, attrs):
        self.calls.append(pid)
        if pid in self.drop:
            return False
        attrs["service.name"] = f"svc-{pid}"
        attrs["process.pid"] = str(pid)  # a misbehaving resourcer cannot turn pid into a string
        return True

    def schema_url(self, pid):
        return f"https://example.com/schemas/{pid}" if pid % 2 else ""


def test_resourcer_fills_resources_and_can_drop_processes():
    tel = Telemetry()
    p = Producer(telemetry=tel)
    r = Resourcer(drop={2})
    p.set_process_resourcer(r)
    for pid in (1, 2):
        p.record_process(
            pid, lambda b: b.add(names.MetricProcessUtilization, 0.5, T, GPU0.id_attributes())
        )
    req = p.collect()
    assert sorted(r.calls) == [1, 2]
    assert [attrs_of(rm.resource) for rm in req.resource_metrics] == [
        {"process.pid": 1, "service.name": "svc-1"}
    ]
    assert tel.value("gpumetrics.processes.dropped_by_relabel") == 1


def test_each_process_resource_carries_its_resourcers_schema_url():
    # issue 27: the declared resource's schema URL is the per-process ResourceMetrics' schema_url
    # (the host resource has none; the GPU scope keeps the catalogue's)
    p = Producer()
    p.set_process_resourcer(Resourcer())
    for pid in (1, 2, 3):
        p.record_process(
            pid, lambda b: b.add(names.MetricProcessUtilization, 0.5, T, GPU0.id_attributes())
        )
    record_power(p, GPU0, 300.0)
    req = p.collect()
    host, *procs = req.resource_metrics
    assert host.schema_url == ""
    assert host.scope_metrics[0].schema_url == "https://opentelemetry.io/schemas/1.44.0"
    assert [(attrs_of(rm.resource)["process.pid"], rm.schema_url) for rm in procs] == [
        (1, "https://example.com/schemas/1"),
        (2, ""),
        (3, "https://example.com/schemas/3"),
    ]
    assert all(
        rm.scope_metrics[0].schema_url == "https://opentelemetry.io/schemas/1.44.0" for rm in procs
    )


def test_disabled_metrics_are_not_emitted():
    p = Producer(disabled_metrics=[names.MetricPower])
    assert not p.enabled(names.MetricPower) and p.enabled(names.MetricTemperature)
    record_power(p, GPU0, 300.0)
    p.record_host(lambda b: b.add(names.MetricTemperature, 40.0, T, GPU0.attributes()))
    req = p.collect()
    assert [m.name for m in req.resource_metrics[0].scope_metrics[0].metrics] == ["hw.temperature"]


def test_unknown_disabled_metric_is_a_configuration_error():
    import pytest

    with pytest.raises(ValueError, match="disabled_metrics"):
        Producer(disabled_metrics=["hw.bogus"])


def test_self_telemetry_goes_under_its_own_scope_on_the_host_resource():
    tel = Telemetry(clock_ns=lambda: T)
    tel.add(
        "gpumetrics.nvml.errors",
        2,
        {"nvml.function": "nvmlDeviceGetPowerUsage", "nvml.return_code": "NOT_SUPPORTED"},
    )
    p = Producer(self_telemetry=tel)
    record_power(p, GPU0, 300.0)
    req = p.collect()
    scopes = [sm.scope.name for sm in req.resource_metrics[0].scope_metrics]
    assert scopes == [names.ScopeName, names.SelfScopeName]
    m = req.resource_metrics[0].scope_metrics[1].metrics[0]
    assert m.name == "gpumetrics.nvml.errors" and m.sum.is_monotonic
    assert m.sum.data_points[0].as_int == 2


def test_pid_must_be_positive():
    import pytest

    p = Producer()
    bads: tuple[Any, ...] = (0, -1, True, "12")  # wrong on purpose: mypy would refuse them
    for bad in bads:
        with pytest.raises(ValueError, match="pid"):
            p.record_process(bad, lambda b: None)


def _processes(p, n):
    for pid in range(1, n + 1):
        p.record_process(
            pid,
            lambda b: b.add(
                names.MetricProcessMemoryUsage, 1 << 20, T, GPU0.id_attributes(), T - 1
            ),
        )


def test_the_store_packs_the_parts_into_the_batches_it_makes_of_the_whole_request():
    """The bulk parts and the protobuf request give one store the same batches, byte for byte
    once parsed (whole resources packed in order, none split below max_batch_bytes)."""
    from gpumetrics.store import BatchStore

    a, b = (
        Producer(host_attributes={"host.name": "n"}),
        Producer(host_attributes={"host.name": "n"}),
    )
    for p in (a, b):
        record_power(p, GPU0, 300.0)
        _processes(p, 50)
    whole = a.collect()
    max_bytes = whole.ByteSize() // 4
    from_request, from_parts = (BatchStore(epoch="E", max_batch_bytes=max_bytes) for _ in "ab")
    from_request.append(whole)
    from_parts.append_parts(b.collect_parts().parts)
    got, want = (s.pull("c", max_bytes=1 << 30) for s in (from_parts, from_request))
    assert len(got.parts) == len(want.parts) > 1 and got.data_points == want.data_points
    parse = metrics_service_pb2.ExportMetricsServiceRequest.FromString
    for g, w in zip(got.parts, want.parts, strict=True):
        assert len(g) <= max_bytes and parse(g) == parse(w)


def test_collect_parts_is_empty_when_nothing_was_recorded():
    c = Producer().collect_parts(1 << 20)
    assert (c.parts, c.dropped_points, c.dropped_resources) == ([], 0, 0)


def test_each_process_resource_is_keyed_by_its_attributes_and_schema_url():
    """The cached resource bytes are rebuilt when only the schema URL changes (a declaration
    with the same attributes under another semconv version), and kept while neither does."""

    class Resourcer:
        url = "https://opentelemetry.io/schemas/1.37.0"

        def put_resource(self, pid: int, attrs: dict[str, Any]) -> bool:
            attrs["service.name"] = "svc"
            return True

        def schema_url(self, pid: int) -> str:
            return self.url

    r = Resourcer()
    p = Producer()
    p.set_process_resourcer(r)
    for want in ("https://opentelemetry.io/schemas/1.37.0", "", "https://example.com/s/2"):
        r.url = want
        _processes(p, 2)
        rms = p.collect().resource_metrics
        assert [rm.schema_url for rm in rms] == [want, want]
        assert [attrs_of(rm.resource)["service.name"] for rm in rms] == ["svc", "svc"]


def test_resources_are_built_once_and_only_the_kept_ones_are_kept(monkeypatch):
    """A process's resource is serialized once while its resourcer's answer stays, and the cache
    holds only what the collection kept: a process left out for the budget is rebuilt later."""
    from gpumetrics.metrics import bulk

    built: list[int] = []
    real = bulk.resource_bytes

    def counting(attributes: Any) -> bytes:
        attrs = dict(attributes)
        built.append(attrs["process.pid"])
        return real(attrs.items())

    monkeypatch.setattr(bulk, "resource_bytes", counting)

    class Resourcer:
        def put_resource(self, pid: int, attrs: dict[str, Any]) -> bool:
            attrs["app.padding"] = "x" * (2000 if pid == 3 else 10)
            return True

    p = Producer()
    p.set_process_resourcer(Resourcer())
    _processes(p, 3)
    small = sum(len(d) for d, _ in p.collect_parts().parts[:2])
    assert built == [1, 2, 3]
    for _ in range(3):
        _processes(p, 3)
        c = p.collect_parts(small + 100)  # pid 3's resource does not fit
        assert (c.dropped_resources, c.dropped_points) == (1, 1)
    # 1 and 2 always from the cache; 3 from it once (kept by the first collection), then, left
    # out each time and so not kept, built again each time
    assert built == [1, 2, 3, 3, 3]


def test_a_process_resource_is_rebuilt_when_the_resourcer_answer_changes():
    class Resourcer:
        service = "a"

        def put_resource(self, pid: int, attrs: dict[str, Any]) -> bool:
            attrs["service.name"] = self.service
            return True

    r = Resourcer()
    p = Producer()
    p.set_process_resourcer(r)
    _processes(p, 1)
    assert attrs_of(p.collect().resource_metrics[0].resource)["service.name"] == "a"
    r.service = "b"  # same pid, a new answer (a declaration arrived): a new resource
    _processes(p, 1)
    assert attrs_of(p.collect().resource_metrics[0].resource)["service.name"] == "b"
