from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from gpumetrics.service import OVERALL_HEALTH, PROFILER_SERVICE, PULL_SERVICE, SidecarHealth
from gpumetrics.v1 import pull_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .conftest import TIMEOUT, MakeSidecar

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
NAMES = (OVERALL_HEALTH, PULL_SERVICE, PROFILER_SERVICE)


def check(stub: health_pb2_grpc.HealthStub, name: str) -> int:
    return stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=TIMEOUT).status


def test_not_serving_until_ready_then_serving(sidecar: MakeSidecar) -> None:
    sc = sidecar(ready=False)
    stub = sc.health_stub()
    assert [check(stub, n) for n in NAMES] == [NOT_SERVING] * 3
    sc.health.mark_ready()
    assert [check(stub, n) for n in NAMES] == [SERVING] * 3
    sc.health.set_ready(False)
    assert check(stub, OVERALL_HEALTH) == NOT_SERVING


def test_unknown_service_is_not_found(sidecar: MakeSidecar) -> None:
    stub = sidecar().health_stub()
    with pytest.raises(grpc.RpcError) as err:
        check(stub, "no.such.Service")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_stop_sets_not_serving_before_the_listener_goes(sidecar: MakeSidecar) -> None:
    sc = sidecar()
    stub = sc.health_stub()
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=PULL_SERVICE), timeout=TIMEOUT)
    assert next(watch).status == SERVING
    sc.server.stop(grace=0.2)  # the open Watch keeps the server until the grace ends
    statuses = []
    with pytest.raises(grpc.RpcError):
        for resp in watch:  # ends when the server cancels the stream
            statuses.append(resp.status)
            assert len(statuses) < 10
    assert statuses == [NOT_SERVING]
    sc.health.mark_ready()  # ignored after shutdown
    assert sc.health.status(PULL_SERVICE) == NOT_SERVING


def test_added_names_follow_readiness_or_not() -> None:
    health = SidecarHealth()
    health.add_service("plugin", follow_ready=False)
    health.add_service("extra")
    assert (health.status("plugin"), health.status("extra")) == (SERVING, NOT_SERVING)
    health.mark_ready()
    assert health.status("extra") == SERVING
    health.enter_graceful_shutdown()
    assert (health.status("plugin"), health.status("extra")) == (NOT_SERVING, NOT_SERVING)
    assert not health.ready


def test_health_only_listener_is_plaintext_and_serves_only_health(
    sidecar: MakeSidecar, tmp_path: Path
) -> None:
    token = tmp_path / "pull.token"
    token.write_text("p" * 32 + "\n")
    sc = sidecar(health_listen="127.0.0.1:0", pull_token_file=token, ready=False)
    probe_addr = sc.server.addresses.health_listen[0]
    probe = sc.health_stub(address=probe_addr)
    assert check(probe, OVERALL_HEALTH) == NOT_SERVING
    sc.health.mark_ready()
    assert [check(probe, n) for n in NAMES] == [SERVING] * 3  # no token needed
    pull = sc.pull_stub(address=probe_addr)
    with pytest.raises(grpc.RpcError) as err:
        pull.Pull(pull_pb2.PullRequest(), timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_list_reports_every_name(sidecar: MakeSidecar) -> None:
    sc = sidecar(ready=False)
    resp = sc.health_stub().List(health_pb2.HealthListRequest(), timeout=TIMEOUT)
    assert {k: v.status for k, v in resp.statuses.items()} == dict.fromkeys(NAMES, NOT_SERVING)


def test_the_overall_name_changes_after_every_service_it_sums_up() -> None:
    """A client that saw ``""`` change (a Watch, the kubelet's probe) finds each service's own
    status already changed: ``""`` is published last, on readiness and on NVML health."""
    health = SidecarHealth()
    order: list[tuple[str, int]] = []
    set_status = health.servicer.set

    def recording_set(name: str, status: int) -> None:
        order.append((name, status))
        set_status(name, status)

    health.servicer.set = recording_set  # type: ignore[method-assign]
    health.mark_ready()
    health.set_nvml_healthy(False)
    health.set_nvml_healthy(True)
    for start in range(0, len(order), 3):
        names = [name for name, _ in order[start : start + 3]]
        assert names[-1] == OVERALL_HEALTH and sorted(names) == sorted(NAMES), order
    assert set(order[3:6]) == {  # NVML down: "" and the pull service, not the profiler
        (PULL_SERVICE, NOT_SERVING),
        (PROFILER_SERVICE, SERVING),
        (OVERALL_HEALTH, NOT_SERVING),
    }
