"""What a consumer was sent bounds what it may release (docs/protocol.md, "Sequences")."""

from __future__ import annotations

from gpumetrics.store import StoreLimits

from .test_batchstore import assert_accounting, tags


def test_skipping_ahead_and_acknowledging_releases_nothing_skipped(make_request, make_store):
    store = make_store(epoch="E")
    for i in range(10):
        store.append(make_request(2, f"b{i}"))
    ahead = store.pull("c", ack_epoch="E", read_after_sequence=7)  # never received 1..7
    assert (ahead.first_sequence, ahead.last_sequence) == (8, 10)
    store.pull("c", ack_sequence=10, ack_epoch="E", ack_only=True)
    s = store.stats()
    assert (s.held_batches, s.released_points) == (10, 0)
    assert (s.consumers[0].acked_sequence, s.consumers[0].delivered_sequence) == (0, 0)
    # once it has been sent everything from its cursor, the same acknowledgement releases it all
    full = store.pull("c", ack_epoch="E")
    assert (full.first_sequence, full.last_sequence) == (1, 10)
    store.pull("c", ack_sequence=10, ack_epoch="E", ack_only=True)
    assert store.stats().held_batches == 0
    assert_accounting(store)


def test_skipped_batches_that_the_limits_drop_are_charged_to_the_consumer(
    make_request, make_store, parse_request
):
    store = make_store(StoreLimits(max_data_points=6), epoch="E")
    for i in range(3):
        store.append(make_request(2, f"b{i}"))
    store.pull("c", ack_epoch="E", read_after_sequence=2)  # receives 3, skips 1 and 2
    store.pull("c", ack_sequence=3, ack_epoch="E", ack_only=True)
    store.append(make_request(2, "b3"))  # 8 points > 6: batch 1 goes
    nxt = store.pull("c", ack_epoch="E")
    assert nxt.dropped_data_points == 2 and nxt.drop_reasons == ("max_data_points",)
    assert tags(parse_request, nxt.data) == [
        "b1",
        "b2",
        "b3",
    ]  # from its cursor, skipped ones included
    assert_accounting(store)


def test_a_consumer_draining_in_several_pulls_may_acknowledge_all_of_it(make_request, make_store):
    store = make_store(epoch="E")
    for _ in range(6):
        store.append(make_request(1))
    pos = 0
    for _ in range(3):
        r = store.pull("c", ack_epoch="E", read_after_sequence=pos, max_points=2)
        pos = r.last_sequence
    assert pos == 6 and store.stats().consumers[0].delivered_sequence == 6
    store.pull("c", ack_sequence=6, ack_epoch="E", ack_only=True)
    assert store.stats().held_batches == 0


def test_a_forgotten_consumer_that_returns_may_acknowledge_what_it_was_sent(
    make_request, clock, make_store
):
    store = make_store(StoreLimits(consumer_ttl_s=10), clock=clock, epoch="E")
    for _ in range(4):
        store.append(make_request(1))
    store.pull("pin")  # another consumer keeps every batch held
    assert store.pull("c").last_sequence == 4
    clock.advance(11)
    store.pull("pin")  # "c" is forgotten
    assert [c.name for c in store.stats().consumers] == ["pin"]
    store.append(make_request(1))
    back = store.pull("c", ack_sequence=4, ack_epoch="E", read_after_sequence=4)
    assert (back.first_sequence, back.last_sequence) == (5, 5)
    (c,) = [c for c in store.stats().consumers if c.name == "c"]
    assert (c.acked_sequence, c.delivered_sequence) == (4, 5)
    assert_accounting(store)


def test_undo_pull_takes_the_delivery_back_and_reports_the_drops_again(make_request, make_store):
    store = make_store(StoreLimits(max_data_points=4), epoch="E")
    store.append(make_request(2))
    store.pull("c")
    store.pull("c", ack_sequence=1, ack_epoch="E", ack_only=True)
    for _ in range(3):
        store.append(make_request(2))  # 6 points > 4: batch 2 dropped, charged to "c"
    lost = store.pull("c", ack_epoch="E")
    assert (lost.first_sequence, lost.last_sequence, lost.dropped_data_points) == (3, 4, 2)
    assert store.stats().consumers[0].delivered_sequence == 4
    assert store.undo_pull(lost) is True  # the answer never reached the consumer
    s = store.stats().consumers[0]
    assert (s.acked_sequence, s.delivered_sequence) == (2, 2)
    ack = store.pull("c", ack_sequence=4, ack_epoch="E", ack_only=True)
    assert store.stats().held_batches == 2  # it cannot release 3..4: they never reached it
    assert (ack.dropped_data_points, ack.drop_reasons) == (2, ("max_data_points",))
    again = store.pull("c", ack_epoch="E")
    assert (again.first_sequence, again.last_sequence, again.dropped_data_points) == (3, 4, 0)
    assert_accounting(store)


def test_undo_pull_leaves_a_later_delivery_alone(make_request, make_store):
    store = make_store(epoch="E")
    for _ in range(3):
        store.append(make_request(1))
    first = store.pull("c", ack_epoch="E", max_points=1)
    store.pull("c", ack_epoch="E", read_after_sequence=1)  # delivered up to 3 since
    store.undo_pull(first)
    assert store.stats().consumers[0].delivered_sequence == 3
    other = make_store(epoch="F")
    other.append(make_request(1))
    assert other.undo_pull(first) is False  # another store life
