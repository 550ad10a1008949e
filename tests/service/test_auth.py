from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpumetrics.service import AuthPolicy, TokenAuth, read_token_file
from gpumetrics.v1 import profiler_pb2 as pb
from gpumetrics.v1 import pull_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from .conftest import TIMEOUT, MakeSidecar, Sidecar

PULL_TOKEN = "pull-" + "a" * 27
DECLARE_TOKEN = "declare-" + "b" * 24


@pytest.fixture
def tokens(tmp_path: Path) -> dict[str, Path]:
    pull = tmp_path / "pull.token"
    pull.write_text(f"# rotated weekly\n{PULL_TOKEN}\n\n")
    declare = tmp_path / "declare.token"
    declare.write_text(DECLARE_TOKEN + "\n")
    return {"pull_token_file": pull, "declare_token_file": declare}


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def declare(sc: Sidecar, metadata: Sequence[tuple[str, str]] = ()) -> Any:
    return sc.profiler_stub().DeclareProcesses(
        pb.DeclareProcessesRequest(processes=[pb.ProcessDeclaration(pid=42)]),
        metadata=metadata,
        timeout=TIMEOUT,
    )


def pull(sc: Sidecar, metadata: Sequence[tuple[str, str]] = ()) -> Any:
    return sc.pull_stub().Pull(
        pull_pb2.PullRequest(consumer="c"), metadata=metadata, timeout=TIMEOUT
    )


@pytest.mark.parametrize(
    ("call", "metadata", "code"),
    [
        (pull, (), grpc.StatusCode.UNAUTHENTICATED),
        (pull, bearer("wrong-token-wrong-token"), grpc.StatusCode.UNAUTHENTICATED),
        (pull, (("authorization", PULL_TOKEN),), grpc.StatusCode.UNAUTHENTICATED),  # no scheme
        (pull, bearer(DECLARE_TOKEN), grpc.StatusCode.PERMISSION_DENIED),
        (declare, (), grpc.StatusCode.UNAUTHENTICATED),
        (declare, bearer("x" * 32), grpc.StatusCode.UNAUTHENTICATED),
        (declare, bearer(PULL_TOKEN), grpc.StatusCode.PERMISSION_DENIED),
    ],
)
def test_refused_calls_get_the_right_status_and_change_nothing(
    sidecar: MakeSidecar, tokens: dict[str, Path], call: Any, metadata: Any, code: grpc.StatusCode
) -> None:
    sc = sidecar(append=1, **tokens)
    before = sc.store.stats()
    with pytest.raises(grpc.RpcError) as err:
        call(sc, metadata)
    assert err.value.code() == code
    assert PULL_TOKEN not in err.value.details() and DECLARE_TOKEN not in err.value.details()
    assert sc.store.stats() == before  # no consumer registered, nothing acknowledged
    assert len(sc.declared) == 0
    reason = "permission_denied" if code == grpc.StatusCode.PERMISSION_DENIED else "unauthenticated"
    assert sc.telemetry.total("gpumetrics.server.rejected_calls") == 1
    method = (
        "gpumetrics.v1.MetricsPullService/Pull"
        if call is pull
        else ("gpumetrics.v1.ProfilerIntegrationService/DeclareProcesses")
    )
    assert (
        sc.telemetry.value(
            "gpumetrics.server.rejected_calls", {"rpc.method": method, "reason": reason}
        )
        == 1
    )


def test_the_right_tokens_are_accepted(sidecar: MakeSidecar, tokens: dict[str, Path]) -> None:
    sc = sidecar(append=1, **tokens)
    assert pull(sc, bearer(PULL_TOKEN)).data_points == 1
    assert declare(sc, (("authorization", f"bearer {DECLARE_TOKEN}"),)).accepted == 1
    assert sc.declared.lookup(42)[1]


def test_health_needs_no_token_and_reflection_needs_one(
    sidecar: MakeSidecar, tokens: dict[str, Path]
) -> None:
    sc = sidecar(**tokens)
    h = sc.health_stub().Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
    assert h.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(sc.channel())
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    with pytest.raises(grpc.RpcError) as err:
        list(refl.ServerReflectionInfo(iter([req]), timeout=TIMEOUT))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    answers = list(
        refl.ServerReflectionInfo(iter([req]), metadata=bearer(PULL_TOKEN), timeout=TIMEOUT)
    )
    names = {s.name for s in answers[0].list_services_response.service}
    assert {
        "gpumetrics.v1.MetricsPullService",
        "gpumetrics.v1.ProfilerIntegrationService",
        "grpc.health.v1.Health",
    } <= names


def test_without_tokens_everything_is_open(sidecar: MakeSidecar) -> None:
    sc = sidecar(append=1)
    assert pull(sc).data_points == 1
    assert declare(sc).accepted == 1


def test_policy_matrix_without_a_server() -> None:
    auth = TokenAuth(["p" * 16], ["d" * 16])
    md = lambda t: [("authorization", f"Bearer {t}")]  # noqa: E731
    assert auth.check(AuthPolicy.NONE, []) is None
    assert auth.check(AuthPolicy.ANY, md("d" * 16)) is None
    assert auth.check(AuthPolicy.ANY, md("p" * 16)) is None
    denied = auth.check(AuthPolicy.ANY, [])
    assert denied is not None and denied.code == grpc.StatusCode.UNAUTHENTICATED
    only_declare = TokenAuth([], ["d" * 16])
    assert only_declare.check(AuthPolicy.PULL, []) is None  # pulling needs no token
    denied = only_declare.check(AuthPolicy.DECLARE, md("p" * 16))
    assert denied is not None and denied.code == grpc.StatusCode.UNAUTHENTICATED


def test_token_file_errors_name_the_field(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match="^'pull_token_file': cannot read"):
        read_token_file(missing, "pull_token_file")
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="^'declare_token_file': .* holds no token"):
        read_token_file(empty, "declare_token_file")
    short = tmp_path / "short"
    short.write_text("secret\n")
    with pytest.raises(ValueError, match="^'pull_token_file': line 1 .* at least 16"):
        read_token_file(short, "pull_token_file")
    distinct = "a token is also in pull_token_file; pulling and declaring need distinct tokens"
    with pytest.raises(ValueError, match=f"^'declare_token_file': {distinct}$"):
        TokenAuth(["s" * 20], ["s" * 20])


def test_each_refusal_reason_is_logged_once_per_consumer(
    sidecar: MakeSidecar, tokens: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """A missing token and a wrong one are two reasons; another consumer is logged again; a
    repeat is DEBUG only (issue 17: a later invalid token used to go unlogged)."""
    sc = sidecar(append=1, **tokens)
    stub = sc.pull_stub()

    def refused(consumer: str, metadata: Sequence[tuple[str, str]] = ()) -> None:
        with pytest.raises(grpc.RpcError):
            stub.Pull(pull_pb2.PullRequest(consumer=consumer), metadata=metadata, timeout=TIMEOUT)

    caplog.set_level("DEBUG", logger="gpumetrics.service.gate")
    refused("collector-a")
    refused("collector-a", bearer("wrong-token-wrong-token"))
    refused("collector-a", bearer("wrong-token-wrong-token"))  # a repeat
    refused("collector-a")  # a repeat
    refused("collector-b", bearer("wrong-token-wrong-token"))  # another consumer
    refused("collector-b", bearer(DECLARE_TOKEN))
    logged = [
        (r.levelname, r.getMessage().split(" from ", 1)[0], r.getMessage().split("): ", 1)[1])
        for r in caplog.records
        if r.name == "gpumetrics.service.gate"
    ]
    method = "refused /gpumetrics.v1.MetricsPullService/Pull"
    missing = "missing 'authorization: Bearer <token>' metadata (a pull token is required)"
    wrong = "invalid bearer token"
    assert logged == [
        ("WARNING", method, missing),
        ("WARNING", method, wrong),
        ("DEBUG", method, wrong),
        ("DEBUG", method, missing),
        ("WARNING", method, wrong),
        ("WARNING", method, "this token may not call this service (a pull token is required)"),
    ]
    consumers = [
        r.getMessage().split("(consumer ", 1)[1].split(")", 1)[0]
        for r in caplog.records
        if r.name == "gpumetrics.service.gate"
    ]
    assert consumers == ["'collector-a'"] * 4 + ["'collector-b'"] * 2
