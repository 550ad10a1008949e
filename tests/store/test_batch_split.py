"""A collection larger than a message is split when stored, so every batch is deliverable.

Every test runs for both signals (``signal``: metrics, and the log store's logs), as the store
splits each batch as the request type of its own signal (issue 23, item 4: a log batch over
4 MiB was parsed as metrics, failed, and was lost uncounted).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from gpumetrics.store import LOGS, METRICS, BatchStore, Signal
from gpumetrics.store.split import split_request
from hypothesis import given, settings
from hypothesis import strategies as st

SCHEMA = "https://opentelemetry.io/schemas/1.44.0"


def units_of(signal: Signal, request: Any) -> list[tuple]:
    """Every data point or log record as (resource, scope, metric header, item), in order."""
    out: list[tuple] = []
    for entry in getattr(request, signal.resources):
        res = (entry.resource.SerializeToString(deterministic=True), entry.schema_url)
        for sc in getattr(entry, signal.scopes):
            scope = (sc.scope.SerializeToString(deterministic=True), sc.schema_url)
            for item in getattr(sc, signal.items):
                if signal is LOGS:
                    out.append((res, scope, None, item.SerializeToString(deterministic=True)))
                    continue
                kind = item.WhichOneof("data")
                data = getattr(item, kind)
                header = (
                    item.name,
                    item.unit,
                    item.description,
                    kind,
                    getattr(data, "aggregation_temporality", None),
                    getattr(data, "is_monotonic", None),
                )
                for p in data.data_points:
                    out.append((res, scope, header, p.SerializeToString(deterministic=True)))
    return out


def build(signal: Signal, shape: list[list[list[int]]], attr_bytes: int = 40) -> Any:
    """``shape[resource][scope][item]`` = units: data points of one metric (kinds alternate
    gauge/sum/histogram), or for logs that many log records (the item level is flattened)."""
    req = signal.request()
    for r, scopes in enumerate(shape):
        entry = getattr(req, signal.resources).add(schema_url=SCHEMA)
        kv = entry.resource.attributes.add(key="service.name")
        kv.value.string_value = f"r{r}-" + "x" * attr_bytes
        for s, items in enumerate(scopes):
            sc = getattr(entry, signal.scopes).add()
            sc.scope.name = f"scope{s}"
            for i, n in enumerate(items):
                if signal is LOGS:
                    for j in range(n):
                        rec = sc.log_records.add(time_unix_nano=1_700_000_000_000_000_000 + j)
                        rec.body.string_value = f"m{i}-{j}"
                    continue
                m = sc.metrics.add(name=f"m{i}", unit="1", description="d")
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


@pytest.mark.parametrize("signal", [METRICS, LOGS], ids=["metrics", "logs"])
@settings(max_examples=80, deadline=None, derandomize=True)
@given(shape=shapes, cap=st.integers(150, 6000))
def test_pieces_fit_and_hold_every_unit_once_in_order(signal, shape, cap):
    request = build(signal, shape)
    pieces = list(split_request(request, cap, signal))
    assert sum((units_of(signal, p) for p in pieces), []) == units_of(signal, request)
    for p in pieces:
        assert isinstance(p, signal.request)
        if p.ByteSize() > cap:  # only a single data point or record with its envelope
            assert len(units_of(signal, p)) == 1, p
        if request.ByteSize() > cap:  # resource entries that hold nothing are left out
            assert all(signal.count_resource(e) for e in getattr(p, signal.resources))
    if request.ByteSize() <= cap:
        assert pieces == [request]


def _drain(store: BatchStore, cap: int) -> list[tuple]:
    got: list[tuple] = []
    pos = 0
    while True:
        r = store.pull("c", ack_epoch="E", read_after_sequence=pos, max_bytes=1)  # one by one
        if not r.last_sequence:
            return got
        assert r.size <= cap
        got += units_of(store.signal, store.signal.parse(r.data))
        pos = r.last_sequence


def test_an_oversized_collection_becomes_consecutive_deliverable_batches(signal):
    request = build(signal, [[[300, 300]], [[300]]])
    cap = request.ByteSize() // 5
    store = BatchStore(epoch="E", max_batch_bytes=cap, signal=signal)
    last = store.append(request)
    s = store.stats()
    assert last == s.last_sequence == s.held_batches > 5
    assert s.held_points == signal.count(request) and sum(s.dropped_points.values()) == 0
    assert _drain(store, cap) == units_of(signal, request)


def test_oversized_serialized_data_is_split_as_the_stores_signal(signal):
    """``append_serialized`` (the log store's path from the event producer) splits as well."""
    request = build(signal, [[[300, 300]], [[300]]])
    data = request.SerializeToString()
    cap = len(data) // 5
    store = BatchStore(epoch="E", max_batch_bytes=cap, signal=signal)
    store.append_serialized(data, signal.count(request))
    s = store.stats()
    assert s.held_batches > 5 and s.held_points == signal.count(request)
    assert sum(s.dropped_points.values()) == 0
    assert _drain(store, cap) == units_of(signal, request)


def test_parts_are_packed_into_batches_in_order(signal):
    """``append_parts``: consecutive small requests share a batch up to the cap."""
    requests = [build(signal, [[[3]]], attr_bytes=10 + i) for i in range(12)]
    sizes = [r.ByteSize() for r in requests]
    cap = sum(sizes[:4])  # four fit a batch
    store = BatchStore(epoch="E", max_batch_bytes=cap, signal=signal)
    store.append_parts([(r.SerializeToString(), signal.count(r)) for r in requests])
    s = store.stats()
    assert 3 <= s.held_batches <= 4 and s.held_points == 36
    expected = sum((units_of(signal, r) for r in requests), [])
    assert _drain(store, cap) == expected


def test_a_unit_whose_envelope_alone_is_too_large_is_dropped_and_charged(signal):
    store = BatchStore(epoch="E", max_batch_bytes=4096, signal=signal)
    store.append(build(signal, [[[1]]]))
    store.pull("c")
    store.append(build(signal, [[[1]]], attr_bytes=8000))  # one unit on an 8 KB resource
    store.append(build(signal, [[[2]]]))
    s = store.stats()
    assert s.dropped_points["max_batch_bytes"] == 1 and s.held_batches == 2
    r = store.pull("c", ack_sequence=1, ack_epoch="E")
    assert (r.dropped_data_points, r.drop_reasons) == (1, ("max_batch_bytes",))
    assert (r.first_sequence, r.last_sequence, r.data_points) == (2, 2, 2)
    s = store.stats()
    assert s.appended_points == s.released_points + sum(s.dropped_points.values()) + s.held_points
    (c,) = s.consumers
    assert c.offered_points == c.acked_points + c.dropped_points_total + c.unacked_held_points


def test_data_that_cannot_be_split_is_counted_as_split_error_and_logged_once(signal, caplog):
    """Oversized bytes that are not the store's request type: counted, never silently lost."""
    garbage = b"\xff" * 9000  # a varint that never ends: DecodeError
    store = BatchStore(epoch="E", max_batch_bytes=4096, signal=signal)
    store.pull("c")
    with caplog.at_level(logging.DEBUG, logger="gpumetrics.store.batchstore"):
        store.append_serialized(garbage, 7)
        store.append_serialized(garbage, 5)
    store.append_serialized(build(signal, [[[2]]]).SerializeToString(), 2)
    s = store.stats()
    assert s.dropped_points["split_error"] == 12
    assert s.held_points == 2
    assert s.appended_points == s.released_points + sum(s.dropped_points.values()) + s.held_points
    r = store.pull("c")
    assert (r.dropped_data_points, r.drop_reasons) == (12, ("split_error",))
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 1 and "split_error" in errors[0].getMessage()


def test_a_failure_half_way_counts_only_what_was_not_stored(signal, monkeypatch):
    """A split that fails after some pieces were stored: those stay; the rest is split_error."""
    import gpumetrics.store.batchstore as bs

    request = build(signal, [[[50]], [[300, 300]], [[50]]])
    cap = request.ByteSize() // 5
    real = bs.split_entry

    def failing(entry: Any, max_bytes: int, sig: Signal) -> Any:
        for n, part in enumerate(real(entry, max_bytes, sig)):
            if n == 3:  # after a few pieces, some already stored
                raise RuntimeError("boom")
            yield part

    monkeypatch.setattr(bs, "split_entry", failing)
    store = BatchStore(epoch="E", max_batch_bytes=cap, signal=signal)
    store.append(request)
    s = store.stats()
    total = signal.count(request)
    assert 0 < s.held_points < total
    assert s.held_points + s.dropped_points["split_error"] == total == s.appended_points
