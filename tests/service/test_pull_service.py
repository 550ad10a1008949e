from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpumetrics.metrics import count_points
from gpumetrics.store import BatchStore, StoreLimits
from gpumetrics.v1 import pull_pb2, pull_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from ..store.conftest import build_request
from .conftest import TIMEOUT, MakeSidecar


def parse(resp: pull_pb2.PullResponse) -> metrics_service_pb2.ExportMetricsServiceRequest:
    req = metrics_service_pb2.ExportMetricsServiceRequest()
    req.ParseFromString(resp.export_metrics_service_request)
    return req


def tags(resp: pull_pb2.PullResponse) -> list[str]:
    return [rm.resource.attributes[0].value.string_value for rm in parse(resp).resource_metrics]


def pull(stub: pull_pb2_grpc.MetricsPullServiceStub, **kw: Any) -> pull_pb2.PullResponse:
    return stub.Pull(pull_pb2.PullRequest(**kw), timeout=TIMEOUT)


def test_unavailable_before_the_first_collection(sidecar: MakeSidecar) -> None:
    sc = sidecar(ready=False)
    with pytest.raises(grpc.RpcError) as err:
        pull(sc.pull_stub(), consumer="c")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    sc.store.append(build_request(1))
    assert pull(sc.pull_stub(), consumer="c").data_points == 1


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_pull_then_ack_releases(sidecar: MakeSidecar, short_tmp: Path, transport: str) -> None:
    listen = ["127.0.0.1:0"] if transport == "tcp" else [f"unix://{short_tmp}/s.sock"]
    sc = sidecar(listen=listen, append=3)
    stub = sc.pull_stub()
    r = pull(stub, consumer="collector")
    assert (r.first_sequence, r.last_sequence, r.data_points, r.more) == (1, 3, 3, False)
    assert r.epoch == sc.store.epoch
    assert tags(r) == ["b0", "b1", "b2"]
    assert count_points(parse(r)) == r.data_points
    again = pull(stub, consumer="collector")  # not acknowledged: sent again
    assert again.export_metrics_service_request == r.export_metrics_service_request
    done = pull(stub, consumer="collector", ack_sequence=3, ack_epoch=r.epoch, ack_only=True)
    assert (done.export_metrics_service_request, done.last_sequence, done.more) == (b"", 0, False)
    assert sc.store.stats().held_batches == 0


def test_two_consumers_keep_independent_cursors(sidecar: MakeSidecar) -> None:
    sc = sidecar(append=4)
    stub = sc.pull_stub()
    a = pull(stub, consumer="a", max_data_points=2)
    b = pull(stub, consumer="b")
    assert (a.last_sequence, a.more, b.last_sequence, b.more) == (2, True, 4, False)
    pull(stub, consumer="b", ack_sequence=4, ack_epoch=b.epoch, ack_only=True)
    a2 = pull(stub, consumer="a", ack_sequence=2, ack_epoch=a.epoch)
    assert tags(a2) == ["b2", "b3"]
    assert sc.store.stats().held_batches == 2  # b acked all; a only up to 2


def test_consumer_that_never_acks_is_charged_alone_and_the_store_stays_bounded(
    sidecar: MakeSidecar,
) -> None:
    sc = sidecar(limits=StoreLimits(max_data_points=20))
    stub = sc.pull_stub()
    sc.store.append(build_request(5))
    ack, epoch = 0, sc.store.epoch
    for _ in range(10):
        pull(stub, consumer="stuck")  # pulls, never acknowledges
        r = pull(stub, consumer="good", ack_sequence=ack, ack_epoch=epoch)
        assert r.dropped_data_points == 0
        ack = r.last_sequence or ack
        sc.store.append(build_request(5))
        assert sc.store.stats().held_points <= 20
    good = pull(stub, consumer="good", ack_sequence=ack, ack_epoch=epoch, ack_only=True)
    stuck = pull(stub, consumer="stuck", ack_only=True)
    assert (good.dropped_data_points_total, good.drop_reasons) == (0, [])
    # 11 batches of 5 appended; the store holds 4 (20 points); stuck lost the other 7.
    assert stuck.dropped_data_points_total == 35
    assert list(stuck.drop_reasons) == ["max_data_points"]
    assert (
        sc.telemetry.value("gpumetrics.store.points.dropped", {"reason": "max_data_points"}) == 35
    )


def test_full_store_reports_exact_drop_counts(sidecar: MakeSidecar) -> None:
    sc = sidecar(limits=StoreLimits(max_data_points=10))
    sc.store.append(build_request(4))
    stub = sc.pull_stub()
    first = pull(stub, consumer="c")
    for _ in range(5):
        sc.store.append(build_request(3))  # 19 points offered: batches 1-3 (4+3+3) are dropped
    r = pull(stub, consumer="c", ack_sequence=0, ack_epoch=first.epoch)
    s = sc.store.stats()
    assert s.held_points == 9  # the last three batches of 3
    assert r.dropped_data_points == 4 + 3 + 3
    assert (r.first_sequence, r.last_sequence, r.data_points) == (4, 6, 9)
    assert s.appended_points == s.held_points + sum(s.dropped_points.values()) + s.released_points


def test_acknowledging_each_answer_also_drains_a_backlog(sidecar: MakeSidecar) -> None:
    sc = sidecar(append=10)
    stub = sc.pull_stub()
    seen, ack, epoch, pulls = [], 0, sc.store.epoch, 0
    while pulls < 20:
        r = pull(stub, consumer="c", ack_sequence=ack, ack_epoch=epoch, max_data_points=3)
        pulls += 1
        seen += tags(r)
        ack = r.last_sequence or ack
        if not r.more:
            break
    assert seen == [f"b{i}" for i in range(10)]
    assert pulls == 4


def test_read_after_sequence_drains_a_backlog_before_one_ack_releases_it(
    sidecar: MakeSidecar,
) -> None:
    sc = sidecar(append=10)
    stub = sc.pull_stub()
    seen, answers, position, epoch = [], [], 0, ""
    for _ in range(20):  # the scrape loop of docs/protocol.md
        r = pull(
            stub, consumer="c", ack_epoch=epoch, read_after_sequence=position, max_data_points=4
        )
        answers.append((r.first_sequence, r.last_sequence, r.more))
        seen += tags(r)
        position, epoch = r.last_sequence, r.epoch
        if not r.more:
            break
    # the first Pull knew no epoch yet: it read from the (new) consumer's cursor
    assert answers == [(1, 4, True), (5, 8, True), (9, 10, False)]
    assert seen == [f"b{i}" for i in range(10)]
    assert sc.store.stats().held_batches == 10  # read, not acknowledged: nothing released
    done = pull(stub, consumer="c", ack_sequence=position, ack_epoch=epoch, ack_only=True)
    assert (done.last_sequence, done.more) == (0, False)
    assert sc.store.stats().held_batches == 0


def test_a_refused_delivery_is_read_again_from_the_ack_cursor(sidecar: MakeSidecar) -> None:
    sc = sidecar(append=3)
    stub = sc.pull_stub()
    epoch = sc.store.epoch
    first = pull(stub, consumer="c", ack_epoch=epoch, max_data_points=2)
    second = pull(stub, consumer="c", ack_epoch=epoch, read_after_sequence=first.last_sequence)
    assert tags(first) + tags(second) == ["b0", "b1", "b2"]
    # the pipeline refused them: the next scrape reports it and reads from the ack cursor (0)
    outcome = pull_pb2.PreviousOutcome(
        last_sequence=second.last_sequence, rejected_data_points=3, error_message="queue full"
    )
    again = pull(
        stub, consumer="c", ack_epoch=epoch, read_after_sequence=0, previous_outcome=outcome
    )
    assert (again.first_sequence, again.last_sequence, again.more) == (1, 3, False)
    assert tags(again) == ["b0", "b1", "b2"]
    assert sc.telemetry.value("gpumetrics.pull.rejected_points", {"consumer": "c"}) == 3


def test_read_after_sequence_of_another_epoch_is_ignored(sidecar: MakeSidecar) -> None:
    sc = sidecar(store=BatchStore(epoch="fresh"), append=3)
    stub = sc.pull_stub()
    got = pull(stub, consumer="c", ack_epoch="before-restart", read_after_sequence=2)
    assert (got.epoch, got.first_sequence, got.last_sequence) == ("fresh", 1, 3)
    beyond = pull(stub, consumer="c", ack_epoch="fresh", read_after_sequence=99)
    assert (beyond.export_metrics_service_request, beyond.last_sequence, beyond.more) == (
        b"",
        0,
        False,
    )


def test_a_new_epoch_ignores_the_old_ack(sidecar: MakeSidecar) -> None:
    old = sidecar(append=2)
    r = pull(old.pull_stub(), consumer="c")
    restarted = sidecar(store=BatchStore(epoch="fresh"), append=1)
    got = pull(restarted.pull_stub(), consumer="c", ack_sequence=r.last_sequence, ack_epoch=r.epoch)
    assert got.epoch == "fresh" != r.epoch
    assert (got.first_sequence, got.last_sequence) == (1, 1)
    assert restarted.store.stats().held_batches == 1


@pytest.mark.parametrize(
    ("request_kwargs", "field"),
    [
        ({"consumer": "no spaces"}, "consumer"),
        ({"consumer": "x" * 129}, "consumer"),
        ({"consumer": "push"}, "consumer"),  # the push exporter's cursor
        (
            {
                "consumer": "c",
                "previous_outcome": pull_pb2.PreviousOutcome(rejected_data_points=-1),
            },
            "previous_outcome.rejected_data_points",
        ),
    ],
)
def test_invalid_requests_name_the_field_and_change_nothing(
    sidecar: MakeSidecar, request_kwargs: dict[str, Any], field: str
) -> None:
    sc = sidecar(append=1)
    before = sc.store.stats()
    with pytest.raises(grpc.RpcError) as err:
        pull(sc.pull_stub(), **request_kwargs)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"{field}:")
    assert sc.store.stats() == before


def test_too_many_consumers_is_resource_exhausted(sidecar: MakeSidecar) -> None:
    sc = sidecar(limits=StoreLimits(max_consumers=1), append=1)
    pull(sc.pull_stub(), consumer="one")
    with pytest.raises(grpc.RpcError) as err:
        pull(sc.pull_stub(), consumer="two")
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_consumers" in err.value.details()


def test_previous_outcome_rejections_are_counted_and_logged(
    sidecar: MakeSidecar, caplog: pytest.LogCaptureFixture
) -> None:
    sc = sidecar(append=1)
    stub = sc.pull_stub()
    r = pull(stub, consumer="col")
    outcome = pull_pb2.PreviousOutcome(
        last_sequence=r.last_sequence, rejected_data_points=7, error_message="exporter queue full"
    )
    with caplog.at_level(logging.WARNING, logger="gpumetrics.service.pull"):
        pull(
            stub,
            consumer="col",
            ack_sequence=r.last_sequence,
            ack_epoch=r.epoch,
            previous_outcome=outcome,
        )
    assert sc.telemetry.value("gpumetrics.pull.rejected_points", {"consumer": "col"}) == 7
    assert any(
        "rejected 7 data points" in m and "exporter queue full" in m for m in caplog.messages
    )
    # the outcome does not change what is released: the ack does
    assert sc.store.stats().held_batches == 0


def test_default_answer_size_and_clamped_requests(sidecar: MakeSidecar) -> None:
    one = build_request(3000).ByteSize()  # > 22 KiB, so 3 batches + envelope >= 128 KiB
    sc = sidecar(pull_default_max_bytes=one * 2, max_send_message_bytes=one * 3 + 64 * 1024)
    for _ in range(6):
        sc.store.append(build_request(3000))
    stub = sc.pull_stub()
    assert pull(stub, consumer="d").last_sequence == 2  # default cap: 2 batches
    big = pull(stub, consumer="e", max_bytes=10**9)  # clamped to the send limit minus envelope
    assert big.last_sequence == 3 and big.more


def test_the_push_exporters_consumer_name_is_reserved() -> None:
    from gpumetrics.service.pull import RESERVED_CONSUMERS
    from gpumetrics.service.push import PUSH_CONSUMER

    assert PUSH_CONSUMER in RESERVED_CONSUMERS
