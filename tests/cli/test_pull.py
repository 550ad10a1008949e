"""``gpumetrics pull``: one deadline for the whole command, fast failure with a hint, address
forms, an empty answer, point times in ``--format text`` (issue 17).

No test measures time: deadlines are checked on a recording stub with an explicit clock, and the
real connection-refused case runs under a deadline an hour long that the test could not wait for.
"""

from __future__ import annotations

import argparse
import socket
import threading

import grpc
import pytest
from gpumetrics.cli import client, main
from gpumetrics.cli.parser import build_parser
from gpumetrics.v1 import pull_pb2


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class Unavailable(grpc.RpcError):
    def __init__(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class RecordingStub:
    """Answers UNAVAILABLE ``failures`` times, then an empty PullResponse; records deadlines.

    Each failed attempt takes ``attempt_s`` on the fake clock (a connection attempt).
    """

    def __init__(self, clock: FakeClock, failures: int, attempt_s: float = 0.0) -> None:
        self.clock, self.failures, self.attempt_s = clock, failures, attempt_s
        self.calls: list[tuple[float, float]] = []  # (when, timeout)
        self.details = "failed to connect to all addresses; Connection refused"

    def Pull(self, request, timeout, metadata):  # noqa: N802 - the gRPC method's name
        self.calls.append((self.clock.now, timeout))
        if len(self.calls) <= self.failures:
            self.clock.now += self.attempt_s
            raise Unavailable(self.details)
        return pull_pb2.PullResponse(epoch="e")


def pull_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["pull", "127.0.0.1:4319", *argv])


@pytest.mark.parametrize(
    ("argv", "failures", "attempt_s", "budget"),
    [
        ((), 0, 0.0, 10.0),  # one attempt, the --timeout default
        (("--timeout", "2"), 0, 0.0, 2.0),
        (("--wait", "5", "--timeout", "2"), 3, 0.5, 5.0),  # --wait is the longer
        (("--wait", "1", "--timeout", "30"), 2, 0.1, 30.0),
    ],
)
def test_every_attempt_gets_what_is_left_of_one_deadline(argv, failures, attempt_s, budget):
    clock = FakeClock()
    stub = RecordingStub(clock, failures, attempt_s)
    start = clock.now
    response, end = client._pull_waiting(
        stub.Pull, pull_pb2.PullRequest(), pull_args(*argv), (), clock, clock.sleep
    )
    assert response.epoch == "e"
    assert end == start + budget
    assert len(stub.calls) == failures + 1
    for when, timeout in stub.calls:
        assert timeout == pytest.approx(end - when)  # never a fresh --timeout per attempt
    assert clock.now <= end


def test_wait_gives_up_at_its_end_and_says_what_to_check(capsys):
    clock = FakeClock()
    stub = RecordingStub(clock, failures=10**6, attempt_s=0.2)
    with pytest.raises(client.CommandError) as info:
        client._pull_waiting(
            stub.Pull, pull_pb2.PullRequest(), pull_args("--wait", "3"), (), clock, clock.sleep
        )
    assert clock.now <= 1000.0 + 10.0  # within the command's deadline, max(--timeout, --wait)
    assert clock.now < 1000.0 + 3.0 + 0.25 + 0.2  # the last attempt began before --wait ended
    assert str(info.value) == (
        "pull 127.0.0.1:4319: UNAVAILABLE: failed to connect to all addresses; Connection "
        "refused; nothing answered within --wait 3 s: is the sidecar running?"
    )


def test_without_wait_a_refused_connection_is_one_attempt():
    clock = FakeClock()
    stub = RecordingStub(clock, failures=1)
    with pytest.raises(client.CommandError, match=r"is the sidecar running\? \(`--wait N`"):
        client._pull_waiting(stub.Pull, pull_pb2.PullRequest(), pull_args(), (), clock, clock.sleep)
    assert len(stub.calls) == 1 and clock.now == 1000.0  # no pause, no retry


# grpc 1.85's details, recorded from `gpumetrics pull` against a real sidecar (a self-signed
# certificate for gm.example on 127.0.0.1) and a plaintext one.
_PREFIX = "failed to connect to all addresses; last error: "
TLS_MISMATCHES = [
    (
        (),
        "UNAVAILABLE: ipv4:127.0.0.1:4319: Socket closed",
        "; if the sidecar serves TLS (server.tls_cert_file), add --tls, or --ca-file FILE for a "
        "private CA",
        True,  # also what a sidecar that is restarting answers: retried while --wait lasts
    ),
    (
        ("--ca-file", "c.pem"),
        "UNKNOWN: ipv4:127.0.0.1:4319: Custom verification check failed with error: "
        "UNAUTHENTICATED: Hostname Verification Check failed.",
        "; the server's certificate does not name the address you dialled: pass --server-name "
        "NAME, a name in its subjectAltName",
        False,
    ),
    (
        ("--tls",),
        "UNKNOWN: ipv4:127.0.0.1:4319: Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: "
        "error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: self signed "
        "certificate: OK",
        "; TLS failed: does the sidecar serve TLS (server.tls_cert_file), and does --ca-file hold "
        "the CA that signed its certificate?",
        False,
    ),
    (
        ("--tls",),
        "UNKNOWN: ipv4:127.0.0.1:4319: Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: "
        "error:100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER: Invalid certificate "
        "verification context: OK",
        "; the sidecar answered without TLS: leave out --tls/--ca-file/--cert-file",
        False,
    ),
]


@pytest.mark.parametrize(("argv", "last_error", "hint", "retried"), TLS_MISMATCHES)
def test_a_tls_mismatch_says_what_to_change_and_is_not_retried(argv, last_error, hint, retried):
    """Not "is the sidecar running?", and a failed handshake is not retried while --wait lasts:
    it does not go away by waiting. grpc's trailing ": OK" (the handshake's status text) is
    dropped."""
    clock = FakeClock()
    stub = RecordingStub(clock, failures=10**6)
    stub.details = _PREFIX + last_error
    with pytest.raises(client.CommandError) as info:
        client._pull_waiting(
            stub.Pull,
            pull_pb2.PullRequest(),
            pull_args("--wait", "10", *argv),
            (),
            clock,
            clock.sleep,
        )
    assert (len(stub.calls) > 1) is retried
    assert str(info.value) == (
        f"pull 127.0.0.1:4319: UNAVAILABLE: {_PREFIX}{last_error.removesuffix(': OK')}{hint}"
    )


def test_a_starting_sidecar_gets_the_wait_hint():
    clock = FakeClock()
    stub = RecordingStub(clock, failures=1)
    stub.details = "no collection has been stored yet; retry later"
    with pytest.raises(client.CommandError) as info:
        client._pull_waiting(stub.Pull, pull_pb2.PullRequest(), pull_args(), (), clock, clock.sleep)
    assert str(info.value) == (
        "pull 127.0.0.1:4319: UNAVAILABLE: no collection has been stored yet; retry later (the "
        "sidecar is starting: `--wait N` waits for its first collection)"
    )


def test_a_refused_connection_fails_at_once_not_at_the_deadline(capsys):
    """Against a closed port with a one-hour --timeout: grpc's fail-fast call reports the refusal
    on the first connection attempt. Waiting for the deadline would outlast the join below."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    result: dict[str, object] = {}
    thread = threading.Thread(
        target=lambda: result.setdefault(
            "code", main(["pull", f"127.0.0.1:{port}", "--timeout", "3600"])
        ),
        daemon=True,
    )
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "pull waited for its deadline on a refused connection"
    err = capsys.readouterr().err
    assert result["code"] == 1
    assert err.startswith(f"gpumetrics: pull 127.0.0.1:{port}: UNAVAILABLE: failed to connect")
    assert err.rstrip().endswith(
        "Connection refused; is the sidecar running? (`--wait N` waits for it)"
    )


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("localhost", "ADDR 'localhost': no port; expected host:port (e.g. 127.0.0.1:4319), "
         "[v6addr]:port, unix:/path or /path"),
        ("[::1]", "ADDR '[::1]': no port; expected"),
        ("::1:4319", "ADDR '::1:4319': write an IPv6 address in brackets, e.g. [::1]:4319"),
        ("127.0.0.1:0", "ADDR '127.0.0.1:0': port must be 1..65535"),
        ("127.0.0.1:http", "ADDR '127.0.0.1:http': port must be 1..65535"),
        ("unix:", "ADDR 'unix:': unix: needs a socket path"),
    ],
)  # fmt: skip
def test_an_address_without_a_port_is_a_usage_error(capsys, address, message):
    code, out, err = run(capsys, "pull", address)
    assert (code, out) == (2, "")
    assert err.startswith(f"gpumetrics: {message}") and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("address", "target"),
    [
        ("127.0.0.1:4319", "127.0.0.1:4319"),
        ("[::1]:4319", "[::1]:4319"),
        ("gpu-node-7:4319", "gpu-node-7:4319"),
        ("/run/gpumetrics.sock", "unix:/run/gpumetrics.sock"),
        ("unix:///run/gpumetrics.sock", "unix:///run/gpumetrics.sock"),
    ],
)
def test_address_forms(address, target):
    assert client.target_of(address) == target


def test_local_targets_never_go_through_an_http_proxy():
    for target in ("127.0.0.1:4319", "[::1]:4319", "localhost:4319", "unix:/run/gm.sock"):
        assert ("grpc.enable_http_proxy", 0) in client.channel_options(target), target
    assert ("grpc.enable_http_proxy", 0) not in client.channel_options("gpu-node-7:4319")
    options = dict(client.channel_options("127.0.0.1:4319"))
    assert options["grpc.initial_reconnect_backoff_ms"] <= 250  # --wait notices a new listener


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--timeout", "0"), "--timeout 0: must be more than 0 seconds"),
        (("--wait", "-1"), "--wait -1: must be 0 or more seconds"),
        # issue 23 item 6: float() reads both; a deadline of either is none
        (("--timeout", "nan"), "--timeout nan: must be a finite number of seconds"),
        (("--timeout", "inf"), "--timeout inf: must be a finite number of seconds"),
        (("--wait", "inf"), "--wait inf: must be a finite number of seconds"),
        (("--wait", "nan"), "--wait nan: must be a finite number of seconds"),
    ],
)
def test_times_must_make_sense(capsys, argv, message):
    code, _, err = run(capsys, "pull", "127.0.0.1:1", *argv)
    assert code == 2 and err == f"gpumetrics: {message}\n"


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_declare_timeout_must_be_finite(capsys, value):
    code, _, err = run(capsys, "declare", "127.0.0.1:1", "--pid", "1", "--timeout", value)
    assert code == 2
    assert err == f"gpumetrics: --timeout {value}: must be a finite number of seconds\n"


def test_text_format_shows_each_points_time(make_sidecar, capsys):
    """Two samples of one GPU in one pull read as two times, not as a duplicate."""
    from gpumetrics.metrics import names

    from .conftest import GPU0

    sidecar, collector, ticker = make_sidecar()
    sidecar.start()
    t0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
    for i, watts in enumerate((250.0, 251.5)):
        collector.producer.record_host(
            lambda b, w=watts, t=t0 + i * 1_250_000_000: b.add(
                names.MetricPower, w, t, GPU0.attributes()
            )
        )
    collector.ready.set()
    ticker.tick()
    address = sidecar.parts.server.addresses.listen[0]
    code, out, _ = run(capsys, "pull", address, "--format", "text")
    assert code == 0
    (power,) = [line for line in out.splitlines() if line.lstrip().startswith("hw.power ")]
    assert power.endswith("2 point(s): 250@00:00:00.000Z, 251.5@00:00:01.250Z"), power


def test_point_time_is_utc_with_milliseconds():
    assert client.point_time(0) == "@00:00:00.000Z"
    assert client.point_time(1_767_225_600_250_999_999) == "@00:00:00.250Z"
    assert client.point_time(1_767_229_199_999_000_000) == "@00:59:59.999Z"
