"""``gpumetrics.v1.LogsPullService/PullLogs`` through a real SidecarServer on loopback port 0."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpumetrics.events import EventProducer, EventSettings, GpuEvent, count_log_records
from gpumetrics.identity import DeclaredStore
from gpumetrics.selftelemetry import Telemetry, WithAttributes
from gpumetrics.service import LOGS_PULL_SERVICE, ServerSettings, SidecarHealth, SidecarServer
from gpumetrics.store import LOGS, BatchStore, StoreLimits
from gpumetrics.v1 import logs_pull_pb2, logs_pull_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

from .conftest import TIMEOUT

GPU = (("hw.id", "GPU-1"), ("hw.name", "gpu0"))


class Rig:
    def __init__(self, logs_store: BatchStore | None, **settings: Any) -> None:
        settings.setdefault("listen", ["127.0.0.1:0"])
        settings.setdefault("profiler_listen", [])  # never the machine's default socket
        settings.setdefault("allow_unauthenticated_declare", True)
        self.telemetry = Telemetry()
        self.logs_store = logs_store
        self.health = SidecarHealth()
        self.server = SidecarServer(
            ServerSettings(**settings),
            BatchStore(telemetry=self.telemetry),
            DeclaredStore(),
            self.health,
            self.telemetry,
            logs_store=logs_store,
        )
        self.server.start()
        self.health.mark_ready()
        self.channels: list[grpc.Channel] = []

    @property
    def store(self) -> BatchStore:
        """The log store this rig serves (for tests that gave one)."""
        assert self.logs_store is not None
        return self.logs_store

    def stub(self, metadata: Any = None) -> logs_pull_pb2_grpc.LogsPullServiceStub:
        ch = grpc.insecure_channel(self.server.addresses.listen[0])
        self.channels.append(ch)
        return logs_pull_pb2_grpc.LogsPullServiceStub(ch)

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        self.server.stop(0)


MakeRig = Callable[..., Rig]


@pytest.fixture
def rig() -> Iterator[MakeRig]:
    made: list[Rig] = []

    def make(logs_store: BatchStore | None = None, **settings: Any) -> Rig:
        r = Rig(logs_store, **settings)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def store_with(batches: list[list[int]], limits: StoreLimits | None = None) -> BatchStore:
    """A log store holding one batch per list of Xid codes, made by the real EventProducer."""
    tel = Telemetry()
    store = BatchStore(limits, telemetry=WithAttributes(tel, {"signal": "logs"}), signal=LOGS)
    producer = EventProducer(EventSettings(storm_burst=100))
    for i, codes in enumerate(batches):
        for code in codes:
            producer.record(GpuEvent("xid", code, "GPU-1", GPU, 10**18 + i))
        producer.flush_to(store)
    return store


def pull(stub: Any, metadata: Any = None, **kw: Any) -> logs_pull_pb2.PullLogsResponse:
    return stub.PullLogs(logs_pull_pb2.PullLogsRequest(**kw), timeout=TIMEOUT, metadata=metadata)


def codes(resp: logs_pull_pb2.PullLogsResponse) -> list[int]:
    req = logs_service_pb2.ExportLogsServiceRequest.FromString(resp.export_logs_service_request)
    assert count_log_records(req) == resp.log_records
    out = []
    for rl in req.resource_logs:
        for sl in rl.scope_logs:
            for r in sl.log_records:
                code = [
                    kv.value.int_value for kv in r.attributes if kv.key == "nvidia.gpu.xid.code"
                ]
                out += code
    return out


def test_pull_logs_is_at_least_once_with_sequences_and_acks(rig: MakeRig) -> None:
    r = rig(store_with([[48], [94, 95], [13]]))
    stub = r.stub()
    first = pull(stub, consumer="otelcol", max_log_records=3)
    assert (first.first_sequence, first.last_sequence, first.more) == (1, 2, True)
    assert codes(first) == [48, 94, 95] and first.epoch == r.store.epoch
    rest = pull(stub, consumer="otelcol", ack_epoch=first.epoch, read_after_sequence=2)
    assert (rest.first_sequence, rest.last_sequence, rest.more, codes(rest)) == (3, 3, False, [13])
    again = pull(stub, consumer="otelcol")  # nothing acknowledged: sent again from the start
    assert codes(again) == [48, 94, 95, 13]
    done = pull(stub, consumer="otelcol", ack_sequence=3, ack_epoch=first.epoch, ack_only=True)
    assert done.export_logs_service_request == b"" and r.store.stats().held_batches == 0


def test_an_empty_log_store_answers_empty_not_unavailable(rig: MakeRig) -> None:
    r = rig(BatchStore(signal=LOGS))
    resp = pull(r.stub(), consumer="c")
    assert (resp.export_logs_service_request, resp.last_sequence, resp.more) == (b"", 0, False)
    assert resp.epoch == r.store.epoch


def test_drops_are_reported_in_log_records(rig: MakeRig) -> None:
    limits = StoreLimits(max_data_points=2)
    store = BatchStore(limits, signal=LOGS)
    r = rig(store)
    stub = r.stub()
    assert pull(stub, consumer="c").last_sequence == 0  # registers the consumer
    producer = EventProducer(EventSettings())
    for code in (13, 31, 43):
        producer.record(GpuEvent("xid", code, "GPU-1", GPU, 10**18))
        producer.flush_to(store)
    resp = pull(stub, consumer="c")
    assert resp.dropped_log_records == 1 and resp.dropped_log_records_total == 1
    assert list(resp.drop_reasons) == ["max_log_records"]
    assert codes(resp) == [31, 43]


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"consumer": "bad name"}, "consumer:"),
        ({"consumer": "push"}, "consumer: 'push' is reserved"),
        (
            {"consumer": "c", "previous_outcome": {"rejected_log_records": -1}},
            "previous_outcome.rejected_log_records",
        ),
    ],
)
def test_malformed_requests_name_the_field(
    rig: MakeRig, request_fields: dict[str, Any], field: str
) -> None:
    r = rig(BatchStore(signal=LOGS))
    outcome = request_fields.pop("previous_outcome", None)
    if outcome is not None:
        request_fields["previous_outcome"] = logs_pull_pb2.LogsPreviousOutcome(**outcome)
    with pytest.raises(grpc.RpcError) as err:
        pull(r.stub(), **request_fields)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field)


def test_rejections_are_counted_with_signal_logs(rig: MakeRig) -> None:
    r = rig(store_with([[48]]))
    outcome = logs_pull_pb2.LogsPreviousOutcome(
        last_sequence=1, rejected_log_records=1, error_message="exporter full"
    )
    pull(r.stub(), consumer="c", previous_outcome=outcome)
    got = r.telemetry.value("gpumetrics.pull.rejected_points", {"consumer": "c", "signal": "logs"})
    assert got == 1


def test_without_a_log_store_the_service_is_unimplemented(rig: MakeRig) -> None:
    r = rig(None)
    with pytest.raises(grpc.RpcError) as err:
        pull(r.stub(), consumer="c")
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_health_answers_for_the_logs_service(rig: MakeRig) -> None:
    r = rig(BatchStore(signal=LOGS))
    ch = grpc.insecure_channel(r.server.addresses.listen[0])
    r.channels.append(ch)
    resp = health_pb2_grpc.HealthStub(ch).Check(
        health_pb2.HealthCheckRequest(service=LOGS_PULL_SERVICE), timeout=TIMEOUT
    )
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_logs_need_a_pull_token(rig: MakeRig, tmp_path: Path) -> None:
    pull_file, declare_file = tmp_path / "pull", tmp_path / "declare"
    pull_file.write_text("pull-secret-0123456789\n")
    declare_file.write_text("declare-secret-0123456789\n")
    r = rig(
        store_with([[48]]), pull_token_file=str(pull_file), declare_token_file=str(declare_file)
    )
    stub = r.stub()
    for token, code in (
        (None, grpc.StatusCode.UNAUTHENTICATED),
        ("declare-secret-0123456789", grpc.StatusCode.PERMISSION_DENIED),
    ):
        metadata = None if token is None else (("authorization", f"Bearer {token}"),)
        with pytest.raises(grpc.RpcError) as err:
            pull(stub, metadata=metadata, consumer="c")
        assert err.value.code() == code
    ok = pull(stub, metadata=(("authorization", "Bearer pull-secret-0123456789"),), consumer="c")
    assert codes(ok) == [48]
