"""Security: tokens, TLS/mTLS mismatches, unix socket permissions, oversized messages.

Every refusal is made against a real sidecar (``Rig``) that holds batches and good
declarations, with a request that *would* change something if it were applied (a replacing
declaration, an exit of a good pid, an acknowledgement of everything); afterwards nothing held
has changed and the sidecar still serves a legitimate client.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpumetrics.v1 import profiler_pb2 as ppb
from gpumetrics.v1 import profiler_pb2_grpc, pull_pb2, pull_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from .pki import Authority
from .rig import GOOD_DECLARER, GOOD_PIDS, TIMEOUT

PULL_TOKEN = "pull-token-0123456789abcdef"
DECLARE_TOKEN = "declare-token-0123456789abcdef"
NOBODY = 65534
OTHER_GID = 65533


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def replacing_declaration() -> ppb.DeclareProcessesRequest:
    """A valid request that would replace a good declaration if it were applied."""
    return ppb.DeclareProcessesRequest(
        processes=[
            ppb.ProcessDeclaration(
                pid=GOOD_PIDS[0],
                environment=[ppb.EnvironmentVariable(name="OTEL_SERVICE_NAME", value=b"hijacked")],
            )
        ],
        replace_all=True,
    )


def attempts(channel: grpc.Channel, store_epoch: str) -> dict[str, Callable[[Any], Any]]:
    """One state-changing call per method; each takes the call metadata."""
    pull = pull_pb2_grpc.MetricsPullServiceStub(channel)
    prof = profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel)
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    return {
        "Pull": lambda md: pull.Pull(
            pull_pb2.PullRequest(consumer="intruder", ack_sequence=99, ack_epoch=store_epoch),
            metadata=md,
            timeout=TIMEOUT,
        ),
        "DeclareProcesses": lambda md: prof.DeclareProcesses(
            replacing_declaration(), metadata=md, timeout=TIMEOUT
        ),
        "ReportExits": lambda md: prof.ReportExits(
            ppb.ReportExitsRequest(exits=[ppb.ProcessExit(pid=p) for p in GOOD_PIDS]),
            metadata=md,
            timeout=TIMEOUT,
        ),
        "StreamDeclarations": lambda md: list(
            prof.StreamDeclarations(
                iter(
                    [
                        ppb.StreamDeclarationsRequest(resync_begin=ppb.ResyncBegin()),
                        ppb.StreamDeclarationsRequest(exit=ppb.ProcessExit(pid=GOOD_PIDS[1])),
                        ppb.StreamDeclarationsRequest(resync_end=ppb.ResyncEnd()),
                    ]
                ),
                metadata=md,
                timeout=TIMEOUT,
            )
        ),
        "ServerReflectionInfo": lambda md: list(
            refl.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                metadata=md,
                timeout=TIMEOUT,
            )
        ),
    }


def refused(fn: Callable[..., Any], *args: Any) -> grpc.StatusCode:
    """Call ``fn(*args)``, which must fail; return its status code."""
    with pytest.raises(grpc.RpcError) as err:
        fn(*args)
    return err.value.code()


def test_tokens(make_rig, short_tmp: Path, figures) -> None:
    (short_tmp / "pull").write_text(f"# rotation: two tokens\n{PULL_TOKEN}\n{PULL_TOKEN}-new\n")
    (short_tmp / "declare").write_text(DECLARE_TOKEN + "\n")
    rig = make_rig(
        {
            "server": {
                "pull_token_file": str(short_tmp / "pull"),
                "declare_token_file": str(short_tmp / "declare"),
            }
        }
    )
    rig.seed(metadata=bearer(DECLARE_TOKEN))
    before = rig.snapshot()
    calls = attempts(rig.channel(), rig.store.epoch)
    wrong = {
        "none": (),
        "unknown": bearer("x" * 32),
        "prefix": bearer(PULL_TOKEN[:16]),
        "lowercase_scheme": (("authorization", f"bearer-{PULL_TOKEN}"),),
        "basic": (("authorization", f"Basic {PULL_TOKEN}"),),
        "two_headers": (("authorization", "Bearer nope-nope-nope-nope"), *bearer("y" * 20)),
    }
    expect = {
        # method: (status with a pull token, status with a declare token)
        "Pull": (None, grpc.StatusCode.PERMISSION_DENIED),
        "DeclareProcesses": (grpc.StatusCode.PERMISSION_DENIED, None),
        "ReportExits": (grpc.StatusCode.PERMISSION_DENIED, None),
        "StreamDeclarations": (grpc.StatusCode.PERMISSION_DENIED, None),
        "ServerReflectionInfo": (None, None),
    }
    n = 0
    for method, call in calls.items():
        for label, md in wrong.items():
            assert refused(call, md) == grpc.StatusCode.UNAUTHENTICATED, (method, label)
            n += 1
        for token, status in zip((PULL_TOKEN, DECLARE_TOKEN), expect[method], strict=True):
            if status is not None and method != "Pull":
                assert refused(call, bearer(token)) == status, (method, token)
                n += 1
        assert rig.snapshot() == before, method
    assert (
        refused(lambda: calls["Pull"](bearer(DECLARE_TOKEN))) == grpc.StatusCode.PERMISSION_DENIED
    )
    n += 1
    assert rig.snapshot() == before
    # The right tokens work; health needs none.
    health = health_pb2_grpc.HealthStub(rig.channel())
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT).status == 1
    ok = pull_pb2_grpc.MetricsPullServiceStub(rig.channel()).Pull(
        pull_pb2.PullRequest(consumer="collector"),
        metadata=bearer(PULL_TOKEN + "-new"),
        timeout=TIMEOUT,
    )
    assert ok.data_points == before.appended_points
    figures.add("security", "token_refusals", n)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("pki")
    ours, theirs = Authority("ours", d), Authority("theirs", d)
    return {
        "ca": ours,
        "other_ca": theirs,
        "server": ours.issue("sidecar", server=True),
        "impostor_server": theirs.issue("sidecar-impostor", server=True),
        "client": ours.issue("parca-agent", server=False),
        "stranger": theirs.issue("intruder", server=False),
    }


def _creds(root: bytes, client: Any = None) -> grpc.ChannelCredentials:
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.ssl_channel_credentials(root, client.key, client.cert)


def _tls_rig(make_rig, pki, mtls: bool, server: str = "server"):
    s = {"tls_cert_file": str(pki[server].cert_file), "tls_key_file": str(pki[server].key_file)}
    if mtls:
        s["tls_client_ca_file"] = str(pki["ca"].file)
    rig = make_rig({"server": s})
    good = _creds(pki["ca"].pem, pki["client"] if mtls else None)
    rig.seed(channel=rig.channel(credentials=good))
    return rig, good


def test_tls_and_mtls_mismatches(make_rig, pki, figures) -> None:
    n = 0
    for mtls in (False, True):
        rig, good = _tls_rig(make_rig, pki, mtls)
        before = rig.snapshot()
        bad = {
            "plaintext": None,
            "wrong_ca": _creds(pki["other_ca"].pem, pki["client"] if mtls else None),
        }
        if mtls:
            bad["no_client_cert"] = _creds(pki["ca"].pem)
            bad["client_cert_from_other_ca"] = _creds(pki["ca"].pem, pki["stranger"])
        for label, creds in bad.items():
            ch = rig.channel() if creds is None else rig.channel(credentials=creds)
            for method, call in attempts(ch, rig.store.epoch).items():
                code = refused(call, ())
                assert code == grpc.StatusCode.UNAVAILABLE, (mtls, label, method, code)
                n += 1
            assert rig.snapshot() == before, label
        ok = pull_pb2_grpc.MetricsPullServiceStub(rig.channel(credentials=good)).Pull(
            pull_pb2.PullRequest(consumer="collector"), timeout=TIMEOUT
        )
        assert ok.data_points == before.appended_points
    # A client that trusts our CA refuses a server whose certificate another CA signed.
    impostor = make_rig(
        {
            "server": {
                "tls_cert_file": str(pki["impostor_server"].cert_file),
                "tls_key_file": str(pki["impostor_server"].key_file),
            }
        }
    )
    ch = impostor.channel(credentials=_creds(pki["ca"].pem, pki["client"]))
    assert refused(lambda: attempts(ch, "")["DeclareProcesses"](())) == grpc.StatusCode.UNAVAILABLE
    assert len(impostor.declared) == 0
    figures.add("security", "tls_refusals", n + 1)


def _connect_as(path: str, uid: int, gid: int, groups: list[int]) -> str:
    """Connect to a unix socket as another user; return ``denied``, ``connected`` or an error.

    A forked child drops to ``uid``/``gid``/``groups`` and only makes the ``connect`` system
    call (no gRPC, no interpreter start-up: this checkout's interpreter may not be readable by
    that user), reports through a pipe and leaves with ``os._exit``.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        result = b"?"
        try:
            os.close(r)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
                result = b"connected"
            except PermissionError:
                result = b"denied"
            except OSError as exc:
                result = f"error {exc.errno}".encode()
        finally:
            os.write(w, result)
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return out.decode()


@pytest.mark.parametrize(
    ("mode", "group", "as_groups", "expected"),
    [
        ("0600", None, [], "denied"),  # the default: only the sidecar's user
        ("0660", str(OTHER_GID), [], "denied"),  # group access, but not this group
        ("0660", str(OTHER_GID), [OTHER_GID], "connected"),  # the profiler's group
        ("0666", None, [], "connected"),  # control: the check can see a connection
    ],
    ids=["default_0600", "0660_other_group", "0660_member", "0666_control"],
)
def test_unix_socket_permissions(
    make_rig, short_tmp: Path, figures, mode, group, as_groups, expected
) -> None:
    os.chmod(short_tmp, 0o755)  # traversable by anyone: only the socket's own mode may refuse
    sock = short_tmp / "gm.sock"
    server: dict[str, Any] = {"listen": [f"unix://{sock}"], "unix_socket_mode": mode}
    if group is not None:
        server["unix_socket_group"] = group
    rig = make_rig({"server": server})
    st = os.stat(sock)
    assert oct(st.st_mode & 0o777) == oct(int(mode, 8))
    assert st.st_uid == os.getuid()
    if group is not None:
        assert st.st_gid == int(group)
    rig.seed()
    before = rig.snapshot()
    if os.geteuid() != 0:
        pytest.skip("connecting as another uid needs root; the mode bits were checked")
    assert _connect_as(str(sock), NOBODY, NOBODY, as_groups) == expected
    assert rig.snapshot() == before
    figures.add("security", "unix_socket_cross_uid_connects", 1)


def test_profiler_service_only_on_its_own_listener(make_rig, short_tmp: Path) -> None:
    rig = make_rig({"server": {"profiler_listen": [f"unix://{short_tmp / 'prof.sock'}"]}})
    rig.seed(channel=rig.channel(f"unix://{short_tmp / 'prof.sock'}"))
    before = rig.snapshot()
    code = refused(lambda: attempts(rig.channel(), "")["DeclareProcesses"](()))
    assert code == grpc.StatusCode.UNIMPLEMENTED
    assert rig.snapshot() == before


def test_oversized_messages(make_rig, figures) -> None:
    limit = 64 * 1024
    rig = make_rig({"server": {"max_receive_message_bytes": limit}})
    rig.seed()
    before = rig.snapshot()
    ch = rig.channel()
    pull = pull_pb2_grpc.MetricsPullServiceStub(ch)
    prof = profiler_pb2_grpc.ProfilerIntegrationServiceStub(ch)
    big = b"x" * (limit + 1024)
    cases: dict[str, Callable[[], Any]] = {
        "Pull": lambda: pull.Pull(
            pull_pb2.PullRequest(
                consumer="c",
                ack_sequence=3,
                ack_epoch=rig.store.epoch,
                previous_outcome=pull_pb2.PreviousOutcome(error_message=big.decode()),
            ),
            timeout=TIMEOUT,
        ),
        "DeclareProcesses": lambda: prof.DeclareProcesses(
            ppb.DeclareProcessesRequest(
                processes=[ppb.ProcessDeclaration(pid=GOOD_PIDS[0], process_context=big)],
                replace_all=True,
            ),
            metadata=GOOD_DECLARER,
            timeout=TIMEOUT,
        ),
        "ReportExits": lambda: prof.ReportExits(
            ppb.ReportExitsRequest(
                exits=[
                    ppb.ProcessExit(pid=GOOD_PIDS[i % 3], start_time_ticks=0) for i in range(20_000)
                ]
            ),
            timeout=TIMEOUT,
        ),
        "Health/Check": lambda: health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="s" * (limit + 1)), timeout=TIMEOUT
        ),
    }
    for name, call in cases.items():
        assert refused(call) == grpc.StatusCode.RESOURCE_EXHAUSTED, name
        assert rig.snapshot() == before, name
    # A stream: the events before the oversized one are applied, the oversized one is not.
    events = [
        ppb.StreamDeclarationsRequest(declare=ppb.ProcessDeclaration(pid=77)),
        ppb.StreamDeclarationsRequest(
            declare=ppb.ProcessDeclaration(pid=GOOD_PIDS[0], process_context=big)
        ),
    ]
    answers: list[bool] = []

    def stream() -> None:
        for resp in prof.StreamDeclarations(iter(events), timeout=TIMEOUT):
            answers.append(resp.accepted)

    assert refused(stream) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert answers == [True] and rig.declared.lookup(77)[1]
    assert rig.snapshot() == before
    assert rig.server.wait_streams_closed(TIMEOUT)
    # An answer larger than the client accepts fails on the client; nothing is lost: a client
    # with room gets every point, from the same consumer cursor.
    tiny = pull_pb2_grpc.MetricsPullServiceStub(
        rig.channel(options=[("grpc.max_receive_message_length", 256)])
    )
    code = refused(lambda: tiny.Pull(pull_pb2.PullRequest(consumer="small"), timeout=TIMEOUT))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    again = pull.Pull(pull_pb2.PullRequest(consumer="small"), timeout=TIMEOUT)
    assert again.first_sequence == 1 and again.data_points == before.appended_points
    health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    figures.add("security", "oversized_refusals", len(cases) + 2)
