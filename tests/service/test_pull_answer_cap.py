"""With the default settings no Pull answer exceeds 16 MiB, whatever ``max_bytes`` asks.

Issue: ``max_bytes`` was clamped only to the send limit (64 MiB), so eight concurrent Pulls on a
large backlog held eight answers of its whole size, each copied by protobuf and gRPC.
"""

from __future__ import annotations

from gpumetrics.store import StoreLimits
from gpumetrics.v1 import pull_pb2

from ..store.conftest import build_request
from .conftest import TIMEOUT, MakeSidecar

MiB = 1024 * 1024


def test_default_settings_cap_an_answer_whatever_is_asked(sidecar: MakeSidecar) -> None:
    sc = sidecar(limits=StoreLimits(max_data_points=10**7))  # the other limits at their defaults
    one = build_request(20000)  # 0.4 MB
    for _ in range(60):
        sc.store.append(one)
    assert sc.store.stats().held_bytes > 20 * MiB
    r = sc.pull_stub(options=[("grpc.max_receive_message_length", 128 * MiB)]).Pull(
        pull_pb2.PullRequest(consumer="greedy", max_bytes=2**62), timeout=TIMEOUT
    )
    assert len(r.export_metrics_service_request) <= 16 * MiB
    assert r.more and r.first_sequence == 1
