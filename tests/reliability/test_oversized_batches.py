"""A collection larger than the send limit reaches the consumer (issue: it wedged it).

The sidecar as ``serve`` builds it (through :class:`~.rig.Rig`), with a small
``server.max_send_message_bytes``: one batch interval of 3,000 processes is about 430 KB of
OTLP, larger than the 256 KiB the server may send. The store splits it into batches that fit a
default answer, so a plain client drains all of it, and every Pull succeeds.
"""

from __future__ import annotations

from gpumetrics.v1 import pull_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from .rig import TIMEOUT

KiB = 1024
PIDS = range(1_000_000, 1_003_000)


def test_a_collection_larger_than_the_send_limit_is_delivered_whole(make_rig) -> None:
    rig = make_rig(
        {
            "server": {"max_send_message_bytes": 256 * KiB, "pull_default_max_bytes": 192 * KiB},
            "identity": {
                "declared": {
                    "max_process_context_bytes": 8 * KiB,
                    "max_environment_bytes": 8 * KiB,
                    "max_profiler_resource_bytes": 8 * KiB,
                }
            },
        }
    )
    rig.batch(PIDS)
    appended = rig.store.stats().appended_bytes
    assert appended > 256 * KiB  # the collection alone exceeds the send limit
    stub = rig.pull_stub()
    points, pulls, pos, epoch = 0, 0, 0, ""
    pids: set[int] = set()
    while pulls < 100:
        r = stub.Pull(
            pull_pb2.PullRequest(consumer="c", ack_epoch=epoch, read_after_sequence=pos),
            timeout=TIMEOUT,
        )
        pulls += 1
        epoch = r.epoch
        if not r.last_sequence:
            break
        req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(
            r.export_metrics_service_request
        )
        points += r.data_points
        for rm in req.resource_metrics:
            for kv in rm.resource.attributes:
                if kv.key == "process.pid":
                    pids.add(kv.value.int_value)
        pos = r.last_sequence
        if not r.more:
            break
    assert pids == set(PIDS)
    assert points == len(PIDS) + 1  # one per process and the GPU's
    ack = stub.Pull(
        pull_pb2.PullRequest(consumer="c", ack_sequence=pos, ack_epoch=epoch, ack_only=True),
        timeout=TIMEOUT,
    )
    assert ack.dropped_data_points_total == 0
    s = rig.store.stats()
    assert (s.held_batches, s.released_points, sum(s.dropped_points.values())) == (0, points, 0)
