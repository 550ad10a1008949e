"""A collection larger than the send limit reaches the consumer (issue: it wedged it), and so
does a batch of GPU events larger than a message (issue 23, item 4: it was lost).

The sidecar as ``serve`` builds it (through :class:`~.rig.Rig`), with a small
``server.max_send_message_bytes``: one batch interval of 3,000 processes is about 430 KB of
OTLP, larger than the 256 KiB the server may send. The store splits it into batches that fit a
default answer, so a plain client drains all of it, and every Pull succeeds.
"""

from __future__ import annotations

import time

from gpumetrics.events import GpuEvent
from gpumetrics.metrics import GPU, names
from gpumetrics.v1 import logs_pull_pb2, logs_pull_pb2_grpc, pull_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from .rig import TIMEOUT

KiB = 1024
MiB = 1024 * KiB
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


def test_a_log_batch_larger_than_a_message_is_split_as_logs_and_delivered_whole(make_rig) -> None:
    """Issue 23, item 4: 800 distinct Xids × 10 in one batch interval (8,000 records, over 4 MiB).

    The batch was parsed as an ``ExportMetricsServiceRequest`` to be split, failed with a
    DecodeError, and all 8,000 records were lost without a count. Now it is split by log
    records into batches that fit a default answer, and a plain client pulls every record.
    """
    rig = make_rig()
    events = rig.sidecar.parts.events
    assert events is not None
    now = time.time_ns()
    gpu = GPU(
        uuid="GPU-7c1e2a90-3f4b-4d21-8e6a-0b9c5d3e1f70",
        index=0,
        name="gpu0",
        model="NVIDIA H100 80GB HBM3",
        serial_number="1654123000000",
        driver_version="570.124.06",
        firmware_version="96.00.99.00.01",
    ).attributes()
    for xid in range(1, 801):
        for k in range(10):  # the storm limit logs 10 identical events per window
            events.record(GpuEvent("xid", xid, gpu[0][1], gpu, now + xid * 1000 + k))
    assert events.queued() == 8000
    rig.batch()
    logs = rig.sidecar.parts.logs_store
    assert logs is not None
    s = logs.stats()
    assert s.appended_bytes > 4 * MiB and s.held_batches > 1  # split into several batches
    assert (s.held_points, sum(s.dropped_points.values())) == (8000, 0)
    stub = logs_pull_pb2_grpc.LogsPullServiceStub(rig.channel())
    xids: list[int] = []
    records, pos, epoch = 0, 0, ""
    for _ in range(100):
        r = stub.PullLogs(
            logs_pull_pb2.PullLogsRequest(consumer="c", ack_epoch=epoch, read_after_sequence=pos),
            timeout=TIMEOUT,
        )
        epoch = r.epoch
        if not r.last_sequence:
            break
        assert len(r.export_logs_service_request) <= 4 * MiB  # a default client receives it
        req = logs_service_pb2.ExportLogsServiceRequest.FromString(r.export_logs_service_request)
        for rl in req.resource_logs:
            for sl in rl.scope_logs:
                for rec in sl.log_records:
                    attrs = {kv.key: kv.value for kv in rec.attributes}
                    xids.append(attrs[names.AttrXidCode].int_value)
        records += r.log_records
        pos = r.last_sequence
        if not r.more:
            break
    assert records == len(xids) == 8000
    assert sorted(set(xids)) == list(range(1, 801)) and all(xids.count(x) == 10 for x in (1, 800))
    assert r.dropped_log_records_total == 0
