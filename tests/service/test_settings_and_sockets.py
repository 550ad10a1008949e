from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from gpumetrics.identity import DeclaredStore
from gpumetrics.service import (
    ListenError,
    ServerSettings,
    SidecarHealth,
    SidecarServer,
    parse_listen_address,
)
from gpumetrics.service.errors import SettingError
from gpumetrics.store import BatchStore
from gpumetrics.v1 import pull_pb2
from pydantic import ValidationError

from .conftest import TIMEOUT, MakeSidecar


def test_defaults_are_loopback_and_valid() -> None:
    s = ServerSettings()
    assert s.listen == ["127.0.0.1:4319"]
    assert parse_listen_address(s.listen[0], "listen[0]").loopback
    assert (s.unix_socket_mode, s.max_receive_message_bytes) == (0o600, 1024 * 1024)


@pytest.mark.parametrize(
    ("text", "kind", "host", "port", "loopback"),
    [
        ("127.0.0.1:0", "tcp", "127.0.0.1", 0, True),
        ("localhost:4319", "tcp", "localhost", 4319, True),
        ("[::1]:9", "tcp", "::1", 9, True),
        ("0.0.0.0:4319", "tcp", "0.0.0.0", 4319, False),
        ("[::]:4319", "tcp", "::", 4319, False),
        ("gpu-node:4319", "tcp", "gpu-node", 4319, False),
    ],
)
def test_tcp_addresses(text: str, kind: str, host: str, port: int, loopback: bool) -> None:
    a = parse_listen_address(text, "listen[0]")
    assert (a.kind, a.host, a.port, a.loopback) == (kind, host, port, loopback)


def test_unix_addresses_become_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for text in (f"unix://{tmp_path}/a.sock", f"unix:{tmp_path}/a.sock", "unix:a.sock"):
        a = parse_listen_address(text, "listen[0]")
        assert (a.kind, a.path, a.loopback) == ("unix", str(tmp_path / "a.sock"), True)
        assert a.dial_target(0) == f"unix://{tmp_path}/a.sock"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("4319", "must be host:port"),
        (":4319", "must be host:port"),
        ("127.0.0.1:99999", "port must be 0..65535"),
        ("::1:4319", "IPv6 address in brackets"),
        ("[nope]:1", "is not an IPv6 address"),
        ("unix-abstract:x", "abstract unix sockets"),
        ("unix:", "needs a socket path"),
        ("unix://relative", "absolute path"),
        ("unix:/" + "x" * 200, "longer than 107 bytes"),
    ],
)
def test_bad_addresses_name_the_field(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^'profiler_listen\[2\]': .*{message}"):
        parse_listen_address(text, "profiler_listen[2]")


def errors(**kw: Any) -> str:
    with pytest.raises(ValidationError) as err:
        ServerSettings(**kw)
    return str(err.value)


def test_security_rules_name_the_field(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    token = tmp_path / "t"
    assert "'listen[1]': 0.0.0.0:4319 is not loopback" in errors(
        listen=["127.0.0.1:0", "0.0.0.0:4319"]
    )
    ServerSettings(listen=["0.0.0.0:4319"], allow_insecure_listen=True)  # explicitly allowed
    # on its own unix socket by default; moved onto listen, TCP needs a token or mTLS
    ServerSettings(listen=["0.0.0.0:4319"], tls_cert_file=cert, tls_key_file=key)
    assert "'listen[0]': the profiler service on TCP 0.0.0.0:4319 would let anyone" in errors(
        listen=["0.0.0.0:4319"], profiler_listen=[], tls_cert_file=cert, tls_key_file=key
    )
    ServerSettings(
        listen=["0.0.0.0:4319"], tls_cert_file=cert, tls_key_file=key, declare_token_file=token
    )
    ServerSettings(
        listen=["0.0.0.0:4319"],
        tls_cert_file=cert,
        tls_key_file=key,
        profiler_listen=[f"unix:{tmp_path}/p.sock"],
    )
    assert "'tls_key_file': not set, but tls_cert_file is; TLS needs both" in errors(
        tls_cert_file=cert
    )
    assert "'tls_cert_file': not set, but tls_key_file is; TLS needs both" in errors(
        tls_key_file=key
    )
    assert "'tls_client_ca_file': mTLS needs" in errors(tls_client_ca_file=cert)
    assert "'health_listen'" in errors(health_listen="nonsense")
    assert "unix_socket_mode" in errors(unix_socket_mode=0o1777)
    assert "'unix_socket_mode': '0o9' is not an octal file mode" in errors(unix_socket_mode="0o9")
    # strings (from YAML or a flag) are converted by the field validator
    assert ServerSettings(unix_socket_mode="0660").unix_socket_mode == 0o660  # type: ignore[arg-type]
    assert ServerSettings(unix_socket_mode="0o640").unix_socket_mode == 0o640  # type: ignore[arg-type]
    assert "max_streams" in errors(max_streams=0)
    assert "'pull_default_max_bytes'" in errors(pull_default_max_bytes=64 * 1024 * 1024)
    assert "extra_forbidden" in errors(lisen=["127.0.0.1:0"])


def test_unreadable_tls_files_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "not.pem"
    bad.write_text("hello")
    settings = ServerSettings(
        listen=["127.0.0.1:0"], tls_cert_file=bad, tls_key_file=tmp_path / "missing.pem"
    )
    with pytest.raises(ValueError, match="^'tls_cert_file': .* is not PEM"):
        SidecarServer(settings, BatchStore(), DeclaredStore(), SidecarHealth())


def test_unix_socket_file_mode_group_and_cleanup(sidecar: MakeSidecar, short_tmp: Path) -> None:
    default = short_tmp / "d.sock"
    group = short_tmp / "g.sock"
    sc = sidecar(listen=[f"unix://{default}"], append=1)
    assert stat.S_ISSOCK(os.stat(default).st_mode)
    assert stat.S_IMODE(os.stat(default).st_mode) == 0o600
    gid = os.getgid()
    sc2 = sidecar(listen=[f"unix:{group}"], unix_socket_mode=0o660, unix_socket_group=str(gid))
    assert stat.S_IMODE(os.stat(group).st_mode) == 0o660
    assert os.stat(group).st_gid == gid
    assert sc.pull_stub().Pull(pull_pb2.PullRequest(), timeout=TIMEOUT).data_points == 1
    sc.server.stop(0)
    sc2.server.stop(0)
    assert not default.exists() and not group.exists()


def test_missing_socket_directory_names_the_field(short_tmp: Path) -> None:
    settings = ServerSettings(listen=[f"unix:{short_tmp}/nope/s.sock"])
    server = SidecarServer(settings, BatchStore(), DeclaredStore(), SidecarHealth())
    with pytest.raises(SettingError, match=r"^'listen\[0\]': directory .* does not exist$"):
        server.start()
    server.stop(0)


def test_addresses_report_real_ports_and_a_failed_start_leaves_nothing_bound(
    sidecar: MakeSidecar, short_tmp: Path
) -> None:
    sc = sidecar(listen=["127.0.0.1:0", "127.0.0.1:0"])
    ports = [addr.rsplit(":", 1)[1] for addr in sc.server.addresses.listen]
    assert len(set(ports)) == 2 and "0" not in ports
    taken = sc.server.addresses.listen[0]
    sock = short_tmp / "first.sock"
    clash = SidecarServer(
        ServerSettings(listen=[f"unix:{sock}", taken]),
        BatchStore(),
        DeclaredStore(),
        SidecarHealth(),
    )
    with pytest.raises(ListenError) as info:  # a RuntimeError, as grpc's own bind error
        clash.start()
    assert str(info.value) == (
        f"'listen[1]': {taken} is in use by another process; stop it or choose another port"
    )
    assert not sock.exists()
    with pytest.raises(RuntimeError, match="already started or stopped"):
        clash.start()
    clash.stop(0)


def test_add_listener_and_add_service_before_start_only(
    sidecar: MakeSidecar, short_tmp: Path
) -> None:
    server = SidecarServer(
        ServerSettings(listen=[], profiler_listen=[]),
        BatchStore(),
        DeclaredStore(),
        SidecarHealth(),
    )
    with pytest.raises(RuntimeError, match="'listen': no listener"):
        server.start()
    server2 = SidecarServer(
        ServerSettings(listen=[], profiler_listen=[]),
        BatchStore(),
        DeclaredStore(),
        SidecarHealth(),
    )
    with pytest.raises(ValueError, match="'listen': 0.0.0.0:0 is not loopback"):
        server2.add_listener("0.0.0.0:0")
    addr = server2.add_listener(f"unix:{short_tmp}/plugin.sock")
    assert addr == f"unix://{short_tmp}/plugin.sock"
    server2.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            server2.add_listener("127.0.0.1:0")
        with pytest.raises(RuntimeError, match="already started"):
            server2.add_service(lambda s: None, ["x.Y"])
        assert server2.addresses.listen == (addr,)
    finally:
        server2.stop(0)
    server.stop(0)
