"""Pull answers are bounded: per answer, in flight server-wide, and a failed one changes nothing."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from gpumetrics.service.pull import encode_pull_response
from gpumetrics.store import BatchStore, PullResult, StoreLimits
from gpumetrics.v1 import pull_pb2, pull_pb2_grpc

from ..store.conftest import build_request
from .conftest import TIMEOUT, MakeSidecar

KiB = 1024


def pull(stub: pull_pb2_grpc.MetricsPullServiceStub, **fields: Any) -> pull_pb2.PullResponse:
    return stub.Pull(pull_pb2.PullRequest(**fields), timeout=TIMEOUT)


def test_the_hand_written_response_parses_as_protobufs_own() -> None:
    parts = (build_request(3, "a").SerializeToString(), build_request(2, "b").SerializeToString())
    result = PullResult(parts, "e", 4, 5, True, 5, 7, 9, ("max_age", "max_bytes"))
    ours = pull_pb2.PullResponse.FromString(encode_pull_response(result))
    theirs = pull_pb2.PullResponse(
        export_metrics_service_request=b"".join(parts),
        epoch="e",
        first_sequence=4,
        last_sequence=5,
        more=True,
        data_points=5,
        dropped_data_points=7,
        dropped_data_points_total=9,
        drop_reasons=["max_age", "max_bytes"],
    )
    assert ours == theirs
    empty = PullResult((), "e", 0, 0, False, 0, 0, 0, ())
    assert encode_pull_response(empty) == pull_pb2.PullResponse(epoch="e").SerializeToString()


def test_a_request_for_more_is_capped_at_pull_max_bytes(sidecar: MakeSidecar) -> None:
    one = build_request(3000).ByteSize()
    sc = sidecar(pull_default_max_bytes=one, pull_max_bytes=3 * one + 100)
    for _ in range(8):
        sc.store.append(build_request(3000))
    r = pull(sc.pull_stub(), consumer="c", max_bytes=10**12)
    assert (r.first_sequence, r.last_sequence, r.more) == (1, 3, True)


def test_answers_in_flight_share_one_budget_and_wellbehaved_pulls_are_still_served(
    sidecar: MakeSidecar,
) -> None:
    one = build_request(3000).ByteSize()
    store = BatchStore(epoch="E", max_batch_bytes=2 * one)
    sc = sidecar(
        store=store,
        pull_default_max_bytes=2 * one,
        pull_max_bytes=6 * one,
        pull_inflight_bytes=6 * one,
    )
    for _ in range(10):
        store.append(build_request(3000))
    budget = sc.server.pull.budget
    stub = sc.pull_stub()
    held = budget.reserve(3 * one, at_least=3 * one)  # answers of other calls, still being sent
    short = pull(stub, consumer="big", max_bytes=10**9)
    assert (short.first_sequence, short.last_sequence, short.more) == (1, 3, True)  # 3 of 6
    assert budget.wait_used_at_most(held, TIMEOUT)  # its answer's share came back when it ended
    rest = budget.reserve(budget.limit, at_least=1)  # now nothing is left for another answer
    with pytest.raises(grpc.RpcError) as err:
        pull(stub, consumer="small")
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "server.pull_inflight_bytes" in err.value.details()
    assert sc.telemetry.value("gpumetrics.pull.budget_refusals", {"consumer": "small"}) == 1
    assert pull(stub, consumer="acker", ack_only=True).epoch == "E"  # acks need no budget
    budget.release(held + rest)
    ok = pull(stub, consumer="small")  # the refused Pull, resent unchanged, is served
    assert (ok.first_sequence, ok.last_sequence) == (1, 2)
    assert budget.wait_used_at_most(0, TIMEOUT)
    assert budget.peak <= budget.limit


def test_a_pull_whose_answer_cannot_be_sent_changes_nothing(sidecar: MakeSidecar) -> None:
    # A batch larger than the send limit cannot arise from the sidecar's own wiring any more (it
    # splits what it stores); a store built without that bound forces gRPC to refuse the send.
    big = build_request(20000)
    store = BatchStore(StoreLimits(max_data_points=25000), epoch="E", max_batch_bytes=10**7)
    sc = sidecar(store=store, max_send_message_bytes=256 * KiB, pull_default_max_bytes=128 * KiB)
    store.append(build_request(1))
    stub = sc.pull_stub(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    pull(stub, consumer="c", ack_sequence=0)
    pull(stub, consumer="c", ack_sequence=1, ack_epoch="E", ack_only=True)
    store.append(build_request(5000))
    store.append(big)  # 5000 + 20000 = 25000 points held: at the limit
    store.append(build_request(1))  # 25001 > 25000: batch 2 is dropped, charged to "c"
    assert big.ByteSize() > 256 * KiB
    before = {c.name: c for c in store.stats().consumers}["c"]
    assert before.delivered_sequence == 2  # batch 2 was dropped: resolved for "c"
    with pytest.raises(grpc.RpcError) as err:
        pull(stub, consumer="c", ack_sequence=1, ack_epoch="E")
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert sc.server.pull.budget.wait_used_at_most(0, TIMEOUT)
    after = {c.name: c for c in store.stats().consumers}["c"]
    assert after.delivered_sequence == before.delivered_sequence  # batch 3 was never received
    # the next Pull can neither release batch 3 nor miss the drop report the failed one carried
    r = pull(stub, consumer="c", ack_sequence=3, ack_epoch="E", ack_only=True)
    assert (r.dropped_data_points, list(r.drop_reasons)) == (5000, ["max_data_points"])
    assert {c.name: c for c in store.stats().consumers}["c"].acked_sequence == 2
