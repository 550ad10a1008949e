from __future__ import annotations

import threading

import pytest
from gpumetrics.selftelemetry import Telemetry
from gpumetrics.store import (
    DEFAULT_CONSUMER,
    BatchStore,
    StoreLimits,
    TooManyConsumersError,
)


def tags(parse_request, data: bytes) -> list[str]:
    """The ``service.name`` of each resource entry of a batch or answer, in order."""
    req = parse_request(data)
    entries = req.resource_metrics if hasattr(req, "resource_metrics") else req.resource_logs
    return [e.resource.attributes[0].value.string_value for e in entries]


def assert_accounting(store: BatchStore) -> None:
    s = store.stats()
    assert s.appended_points == s.released_points + sum(s.dropped_points.values()) + s.held_points
    assert s.appended_batches == s.released_batches + s.dropped_batches + s.held_batches
    for c in s.consumers:
        assert (
            c.offered_points == c.acked_points + c.dropped_points_total + c.unacked_held_points
        ), c


def test_sequences_start_at_one_and_pull_concatenates_batches(
    make_request, parse_request, make_store, signal
):
    store = make_store(epoch="e1")
    assert store.last_sequence == 0
    assert [store.append(make_request(2, f"b{i}")) for i in range(3)] == [1, 2, 3]
    r = store.pull("c")
    assert (r.epoch, r.first_sequence, r.last_sequence, r.more) == ("e1", 1, 3, False)
    assert r.data_points == 6 == signal.count(parse_request(r.data))
    assert tags(parse_request, r.data) == ["b0", "b1", "b2"]
    assert_accounting(store)


def test_unacknowledged_batches_are_sent_again_and_an_ack_releases_them(make_request, make_store):
    store = make_store()
    store.append(make_request(1))
    store.append(make_request(1))
    first = store.pull("c")
    again = store.pull("c")  # no ack: at-least-once redelivery
    assert (again.first_sequence, again.last_sequence) == (
        first.first_sequence,
        first.last_sequence,
    )
    assert store.stats().held_batches == 2
    after = store.pull("c", ack_sequence=2, ack_epoch=store.epoch)
    assert (after.first_sequence, after.last_sequence, after.data, after.more) == (0, 0, b"", False)
    s = store.stats()
    assert (s.held_batches, s.released_batches, s.released_points) == (0, 2, 2)
    assert_accounting(store)


def test_empty_consumer_name_is_the_default_consumer(make_request, make_store):
    store = make_store()
    store.append(make_request(1))
    store.pull("")
    assert [c.name for c in store.stats().consumers] == [DEFAULT_CONSUMER]


def test_two_consumers_keep_independent_cursors(make_request, parse_request, make_store):
    store = make_store()
    for i in range(4):
        store.append(make_request(1, f"b{i}"))
    a = store.pull("a", max_points=2)
    b = store.pull("b")
    assert (a.first_sequence, a.last_sequence, a.more) == (1, 2, True)
    assert (b.first_sequence, b.last_sequence, b.more) == (1, 4, False)
    # b acknowledges everything; nothing is released because a has not.
    store.pull("b", ack_sequence=4, ack_epoch=store.epoch, ack_only=True)
    assert store.stats().held_batches == 4
    a2 = store.pull("a", ack_sequence=2, ack_epoch=store.epoch)
    assert tags(parse_request, a2.data) == ["b2", "b3"]
    assert store.stats().held_batches == 2  # 1 and 2 acknowledged by both
    store.pull("a", ack_sequence=4, ack_epoch=store.epoch, ack_only=True)
    assert store.stats().held_batches == 0
    assert_accounting(store)


def test_ack_is_clamped_to_what_was_delivered(make_request, make_store):
    store = make_store()
    for _ in range(3):
        store.append(make_request(1))
    store.pull("c", max_points=1)  # delivered: 1
    store.pull("c", ack_sequence=3, ack_epoch=store.epoch, ack_only=True)
    s = store.stats()
    assert s.consumers[0].acked_sequence == 1
    assert s.held_batches == 2  # 2 and 3 were never seen, so never released


def test_ack_from_another_epoch_is_ignored(make_request, make_store):
    old = make_store(epoch="old")
    old.append(make_request(1))
    r = old.pull("c")
    restarted = make_store(epoch="new")
    restarted.append(make_request(5))
    got = restarted.pull("c", ack_sequence=r.last_sequence, ack_epoch=r.epoch)
    assert (got.epoch, got.first_sequence, got.data_points) == ("new", 1, 5)
    assert restarted.stats().held_batches == 1
    assert restarted.stats().consumers[0].acked_sequence == 0


def test_acknowledging_each_answer_also_drains_a_backlog(make_request, parse_request, make_store):
    store = make_store()
    sizes = [len(make_request(10, f"b{i}").SerializeToString()) for i in range(10)]
    for i in range(10):
        store.append(make_request(10, f"b{i}"))
    seen: list[str] = []
    ack = 0
    pulls = 0
    while True:
        r = store.pull("c", ack_sequence=ack, ack_epoch=store.epoch, max_bytes=sizes[0] * 3)
        pulls += 1
        seen += tags(parse_request, r.data)
        ack = r.last_sequence or ack
        if not r.more:
            break
        assert pulls < 20
    assert seen == [f"b{i}" for i in range(10)]
    assert pulls == 4  # 3 + 3 + 3 + 1
    store.pull("c", ack_sequence=ack, ack_epoch=store.epoch, ack_only=True)
    assert store.stats().held_points == 0


def test_read_after_sequence_drains_a_backlog_then_one_ack_releases_it_all(
    make_request, parse_request, make_store
):
    store = make_store(epoch="E")
    for i in range(10):
        store.append(make_request(2, f"b{i}"))
    seen: list[str] = []
    answers: list[tuple[int, int, bool]] = []
    position = 0
    for _ in range(20):
        r = store.pull("c", ack_epoch="E", read_after_sequence=position, max_points=6)
        answers.append((r.first_sequence, r.last_sequence, r.more))
        seen += tags(parse_request, r.data)
        position = r.last_sequence
        if not r.more:
            break
    assert answers == [(1, 3, True), (4, 6, True), (7, 9, True), (10, 10, False)]
    assert seen == [f"b{i}" for i in range(10)]
    s = store.stats()
    assert (s.held_batches, s.consumers[0].acked_sequence) == (10, 0)  # reading releases nothing
    assert s.consumers[0].delivered_sequence == 10
    done = store.pull("c", ack_sequence=position, ack_epoch="E", read_after_sequence=position)
    assert (done.data, done.first_sequence, done.last_sequence, done.more) == (b"", 0, 0, False)
    s = store.stats()
    assert (s.held_batches, s.released_points, s.consumers[0].acked_points) == (0, 20, 20)
    assert_accounting(store)


def test_a_consumer_whose_pipeline_failed_rereads_from_its_ack_cursor(make_request, make_store):
    store = make_store(epoch="E")
    for i in range(4):
        store.append(make_request(1, f"b{i}"))
    first = store.pull("c", ack_epoch="E", max_points=2)
    ahead = store.pull("c", ack_epoch="E", read_after_sequence=first.last_sequence, max_points=2)
    assert (first.last_sequence, ahead.first_sequence, ahead.last_sequence) == (2, 3, 4)
    # the pipeline refused both answers: nothing acknowledged, read from the cursor again
    again = store.pull("c", ack_epoch="E", read_after_sequence=0, max_points=2)
    assert again.data == first.data and (again.first_sequence, again.more) == (1, True)
    rest = store.pull("c", ack_epoch="E", read_after_sequence=again.last_sequence)
    assert rest.data == ahead.data and rest.more is False
    assert store.stats().held_batches == 4
    store.pull("c", ack_sequence=4, ack_epoch="E", ack_only=True)
    assert store.stats().held_batches == 0
    assert_accounting(store)


def test_read_after_sequence_never_reads_behind_the_ack_cursor(make_request, make_store):
    store = make_store(epoch="E")
    for _ in range(3):
        store.append(make_request(1))
    store.pull("c")
    r = store.pull("c", ack_sequence=2, ack_epoch="E", read_after_sequence=1)
    assert (r.first_sequence, r.last_sequence, r.more) == (3, 3, False)


@pytest.mark.parametrize(
    ("read_after", "ack_only", "expect"),
    [
        (3, False, (0, 0, False)),  # the newest batch: nothing after it
        (4, False, (0, 0, False)),  # beyond what exists
        (10**12, False, (0, 0, False)),
        (1, True, (0, 0, True)),  # ack_only: no data; more is about what follows the position
        (3, True, (0, 0, False)),
    ],
)
def test_read_after_sequence_at_or_beyond_the_end(
    make_request, read_after, ack_only, expect, make_store
):
    store = make_store(epoch="E")
    for _ in range(3):
        store.append(make_request(1))
    r = store.pull("c", ack_epoch="E", read_after_sequence=read_after, ack_only=ack_only)
    assert (r.first_sequence, r.last_sequence, r.more) == expect
    assert (r.data, r.data_points) == (b"", 0)
    assert store.stats().consumers[0].delivered_sequence == 0  # nothing was sent
    assert_accounting(store)


def test_read_after_sequence_from_another_epoch_is_ignored(make_request, make_store):
    store = make_store(epoch="new")
    for _ in range(3):
        store.append(make_request(1))
    for epoch in ("old", ""):
        r = store.pull(f"c-{epoch or 'none'}", ack_epoch=epoch, read_after_sequence=2)
        assert (r.epoch, r.first_sequence, r.last_sequence) == ("new", 1, 3)


def test_an_ack_after_read_ahead_is_clamped_to_what_was_sent(make_request, make_store):
    store = make_store(epoch="E")
    for _ in range(4):
        store.append(make_request(1))
    r = store.pull("c", ack_epoch="E", max_points=2)  # sent: 1..2
    store.pull(
        "c", ack_sequence=4, ack_epoch="E", read_after_sequence=r.last_sequence, ack_only=True
    )
    s = store.stats()
    assert (s.consumers[0].acked_sequence, s.held_batches) == (2, 2)
    assert_accounting(store)


def test_a_single_oversized_batch_is_returned_alone(make_request, make_store):
    store = make_store()
    store.append(make_request(50))
    store.append(make_request(1))
    r = store.pull("c", max_points=10, max_bytes=10)
    assert (r.first_sequence, r.last_sequence, r.data_points, r.more) == (1, 1, 50, True)


def test_points_limit_drops_oldest_and_charges_only_consumers_that_had_not_acked(
    make_request, make_store
):
    store = make_store(StoreLimits(max_data_points=30))
    store.append(make_request(10))
    store.pull("fast")
    store.pull("slow")  # registers; never acknowledges
    store.pull("fast", ack_sequence=1, ack_epoch=store.epoch, ack_only=True)
    store.append(make_request(10))
    store.append(make_request(10))
    store.append(make_request(10))  # 40 held > 30: batch 1 (acked by fast only) is dropped
    s = store.stats()
    assert s.dropped_points == {
        "max_age": 0,
        "max_data_points": 10,
        "max_bytes": 0,
        "max_batch_bytes": 0,
        "max_collection_bytes": 0,
        "split_error": 0,
    }
    fast = store.pull("fast", ack_only=True)
    slow = store.pull("slow", ack_only=True)
    assert (fast.dropped_data_points, fast.drop_reasons) == (0, ())
    assert (slow.dropped_data_points, slow.dropped_data_points_total) == (10, 10)
    assert slow.drop_reasons == ("max_data_points",)
    again = store.pull("slow", ack_only=True)
    assert (again.dropped_data_points, again.dropped_data_points_total) == (0, 10)
    assert_accounting(store)


def test_a_consumer_that_never_acks_is_bounded_and_does_not_hurt_others(make_request, make_store):
    store = make_store(StoreLimits(max_data_points=50))
    fast_received = 0
    ack = 0
    for _ in range(100):
        store.append(make_request(5))
        r = store.pull("fast", ack_sequence=ack, ack_epoch=store.epoch)
        fast_received += r.data_points
        ack = r.last_sequence or ack
        store.pull("stuck")  # pulls, never acknowledges
        assert store.stats().held_points <= 50
    store.pull("fast", ack_sequence=ack, ack_epoch=store.epoch, ack_only=True)
    s = store.stats()
    by_name = {c.name: c for c in s.consumers}
    assert fast_received == 500
    assert by_name["fast"].dropped_points_total == 0
    assert by_name["fast"].acked_points == 500
    # stuck registered after the first append: everything beyond what is held was dropped.
    assert by_name["stuck"].dropped_points_total == 500 - 50
    assert s.dropped_points["max_data_points"] == 450
    assert_accounting(store)


def test_full_store_with_byte_limit_reports_exact_drops(make_request, make_store):
    one = len(make_request(3).SerializeToString())
    store = make_store(StoreLimits(max_bytes=one * 4))
    store.pull("c")  # registered on an empty store
    for _ in range(10):
        store.append(make_request(3))
    r = store.pull("c")
    assert (r.first_sequence, r.last_sequence) == (7, 10)
    assert (r.dropped_data_points, r.drop_reasons) == (18, ("max_bytes",))
    assert store.stats().held_bytes == one * 4
    assert_accounting(store)


def test_age_limit_drops_old_batches(make_request, clock, make_store):
    store = make_store(StoreLimits(max_age_s=60, consumer_ttl_s=1e6), clock=clock)
    store.pull("c")
    store.append(make_request(2))
    clock.advance(30)
    store.append(make_request(3))
    clock.advance(31)  # the first batch is now 61 s old
    r = store.pull("c")
    assert (r.first_sequence, r.dropped_data_points, r.drop_reasons) == (2, 2, ("max_age",))
    clock.advance(100)
    store.expire()
    assert store.stats().held_batches == 0
    assert store.stats().dropped_points["max_age"] == 5
    assert_accounting(store)


def test_a_batch_larger_than_the_store_is_dropped_and_counted(make_request, make_store):
    store = make_store(StoreLimits(max_data_points=5))
    assert store.append(make_request(6)) == 1
    s = store.stats()
    assert (s.held_batches, s.dropped_points["max_data_points"]) == (0, 6)


def test_idle_consumers_are_forgotten_and_stop_pinning(make_request, clock, make_store):
    store = make_store(StoreLimits(consumer_ttl_s=60), clock=clock)
    store.append(make_request(1))
    store.pull("gone")
    r = store.pull("live")
    store.pull("live", ack_sequence=r.last_sequence, ack_epoch=store.epoch, ack_only=True)
    assert store.stats().held_batches == 1  # pinned by "gone"
    clock.advance(61)
    store.pull("live", ack_only=True)
    s = store.stats()
    assert [c.name for c in s.consumers] == ["live"]
    assert (s.held_batches, s.forgotten_consumers, s.released_points) == (0, 1, 1)


def test_the_number_of_consumers_is_bounded(make_request, make_store):
    store = make_store(StoreLimits(max_consumers=2))
    store.pull("a")
    store.pull("b")
    with pytest.raises(TooManyConsumersError, match="consumer: 'c'"):
        store.pull("c")
    store.pull("a")  # known consumers still work
    assert len(store.stats().consumers) == 2


def test_first_pull_registers_from_the_oldest_batch_held(make_request, make_store):
    store = make_store()
    store.append(make_request(1))
    r = store.pull("a")
    store.pull("a", ack_sequence=r.last_sequence, ack_epoch=store.epoch, ack_only=True)
    store.append(make_request(2))
    late = store.pull("late")
    assert (late.first_sequence, late.data_points) == (2, 2)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"consumer": "bad name"}, "consumer"),
        ({"consumer": "x" * 129}, "consumer"),
        ({"consumer": "é"}, "consumer"),
        ({"consumer": "c", "ack_sequence": -1}, "ack_sequence"),
        ({"consumer": "c", "max_points": -1}, "max_points"),
        ({"consumer": "c", "max_bytes": -1}, "max_bytes"),
        ({"consumer": "c", "read_after_sequence": -1}, "read_after_sequence"),
        ({"consumer": "c", "read_after_sequence": True}, "read_after_sequence"),
    ],
)
def test_bad_pull_arguments_name_the_field_and_change_nothing(
    kwargs, field, make_request, make_store
):
    store = make_store()
    store.append(make_request(1))
    before = store.stats()
    with pytest.raises(ValueError, match=f"^{field}:"):
        store.pull(**kwargs)
    assert store.stats() == before


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_bytes": 0}, "max_bytes"),
        ({"max_data_points": -5}, "max_data_points"),
        ({"max_age_s": 0}, "max_age_s"),
        ({"consumer_ttl_s": float("nan")}, "consumer_ttl_s"),
        ({"max_consumers": True}, "max_consumers"),
    ],
)
def test_bad_limits_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^'{field}':"):
        StoreLimits(**kwargs)


def test_self_telemetry_gauges_and_drop_counters(make_request, make_store):
    t = Telemetry()
    store = make_store(StoreLimits(max_data_points=4), telemetry=t)
    store.pull("c")
    store.append(make_request(3))
    store.append(make_request(3))  # 6 > 4: first batch dropped
    held = store.stats()
    assert t.value("gpumetrics.store.batches") == held.held_batches == 1
    assert t.value("gpumetrics.store.bytes") == held.held_bytes
    assert t.value("gpumetrics.store.points") == 3
    assert t.value("gpumetrics.store.consumers") == 1
    assert t.value("gpumetrics.store.points.dropped", {"reason": "max_data_points"}) == 3


def test_concurrent_appends_and_pulls_keep_exact_accounting(make_request, make_store):
    store = make_store(StoreLimits(max_data_points=200))
    start = threading.Barrier(3)
    req = make_request(7)

    def producer() -> None:
        start.wait()
        for _ in range(300):
            store.append(req)

    def consumer(name: str) -> None:
        start.wait()
        ack = 0
        for _ in range(300):
            r = store.pull(name, ack_sequence=ack, ack_epoch=store.epoch, max_points=50)
            ack = r.last_sequence or ack

    threads = [threading.Thread(target=producer)] + [
        threading.Thread(target=consumer, args=(n,)) for n in ("a", "b")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    s = store.stats()
    assert s.appended_points == 2100
    assert_accounting(store)
