"""A collection larger than a message is split when stored, so every batch is deliverable."""

from __future__ import annotations

from gpumetrics.metrics import count_points
from gpumetrics.metrics.split import split_request
from gpumetrics.store import BatchStore
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2


def points_of(request) -> list[tuple]:
    """Every data point as (resource, scope, metric header, point), in order."""
    out = []
    for rm in request.resource_metrics:
        res = (rm.resource.SerializeToString(deterministic=True), rm.schema_url)
        for sm in rm.scope_metrics:
            scope = (sm.scope.SerializeToString(deterministic=True), sm.schema_url)
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                data = getattr(m, kind)
                header = (
                    m.name,
                    m.unit,
                    m.description,
                    kind,
                    getattr(data, "aggregation_temporality", None),
                    getattr(data, "is_monotonic", None),
                )
                for p in data.data_points:
                    out.append((res, scope, header, p.SerializeToString(deterministic=True)))
    return out


def build(shape: list[list[list[int]]], attr_bytes: int = 40) -> metrics_pb2.ResourceMetrics:
    """shape[resource][scope][metric] = number of points; kinds alternate gauge/sum/histogram."""
    req = metrics_service_pb2.ExportMetricsServiceRequest()
    for r, scopes in enumerate(shape):
        rm = req.resource_metrics.add(schema_url="https://opentelemetry.io/schemas/1.44.0")
        kv = rm.resource.attributes.add(key="service.name")
        kv.value.string_value = f"r{r}-" + "x" * attr_bytes
        for s, metrics in enumerate(scopes):
            sm = rm.scope_metrics.add()
            sm.scope.name = f"scope{s}"
            for i, n in enumerate(metrics):
                m = sm.metrics.add(name=f"m{i}", unit="1", description="d")
                kind = ("gauge", "sum", "histogram")[i % 3]
                data = getattr(m, kind)
                data.SetInParent()
                if kind == "sum":
                    m.sum.is_monotonic = True
                    m.sum.aggregation_temporality = 2
                for j in range(n):
                    dp = data.data_points.add(time_unix_nano=1_700_000_000_000_000_000 + j)
                    if kind == "histogram":
                        dp.count, dp.sum = j, float(j)
                        dp.bucket_counts.extend([j, 1])
                        dp.explicit_bounds.append(1.0)
                    else:
                        dp.as_int = j
    return req


shapes = st.lists(
    st.lists(st.lists(st.integers(0, 40), max_size=4), max_size=3), min_size=1, max_size=4
)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(shape=shapes, cap=st.integers(150, 6000))
def test_pieces_fit_and_hold_every_point_once_in_order(shape, cap):
    request = build(shape)
    pieces = split_request(request, cap)
    assert sum((points_of(p) for p in pieces), []) == points_of(request)
    for p in pieces:
        if p.ByteSize() > cap:  # only a single data point with its envelope may not fit
            assert len(points_of(p)) == 1, p
    if request.ByteSize() <= cap:
        assert pieces == [request]


def test_an_oversized_collection_becomes_consecutive_deliverable_batches():
    request = build([[[300, 300]], [[300]]])
    cap = request.ByteSize() // 5
    store = BatchStore(epoch="E", max_batch_bytes=cap)
    last = store.append(request)
    s = store.stats()
    assert last == s.last_sequence == s.held_batches > 5
    assert s.held_points == count_points(request) and sum(s.dropped_points.values()) == 0
    got, pos = [], 0
    while True:
        r = store.pull("c", ack_epoch="E", read_after_sequence=pos, max_bytes=1)  # one by one
        if not r.last_sequence:
            break
        assert r.size <= cap
        got += points_of(metrics_service_pb2.ExportMetricsServiceRequest.FromString(r.data))
        pos = r.last_sequence
    assert got == points_of(request)


def test_a_point_whose_envelope_alone_is_too_large_is_dropped_and_charged():
    store = BatchStore(epoch="E", max_batch_bytes=4096)
    store.append(build([[[1]]]))
    store.pull("c")
    store.append(build([[[1]]], attr_bytes=8000))  # one point on an 8 KB resource
    store.append(build([[[2]]]))
    s = store.stats()
    assert s.dropped_points["max_batch_bytes"] == 1 and s.held_batches == 2
    r = store.pull("c", ack_sequence=1, ack_epoch="E")
    assert (r.dropped_data_points, r.drop_reasons) == (1, ("max_batch_bytes",))
    assert (r.first_sequence, r.last_sequence, r.data_points) == (2, 2, 2)
    s = store.stats()
    assert s.appended_points == s.released_points + sum(s.dropped_points.values()) + s.held_points
    (c,) = s.consumers
    assert c.offered_points == c.acked_points + c.dropped_points_total + c.unacked_held_points
