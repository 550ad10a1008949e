"""``gpumetrics serve`` refusing what a newcomer gets wrong: one line naming the setting and where
its value came from, exit 2, never a traceback, nothing left installed or bound (issue 17).

Every case runs the real command in-process on the simulated driver; the expected line is exact.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from gpumetrics.cli import main
from gpumetrics.config import ConfigError, ConfigSources

import nvmlsim as sim

TOKEN = "0123456789abcdef-token"


@pytest.fixture(autouse=True)
def _no_gpumetrics_variables(monkeypatch):
    for name in [n for n in os.environ if n.startswith("GPUMETRICS_")]:
        monkeypatch.delenv(name)


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / f"{name}.crt", directory / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def serve(capsys, *argv: str) -> tuple[int, str]:
    """Run ``gpumetrics serve --simulate h100-sxm ARGV``; return the code and the last line."""
    code = main(["serve", "--simulate", "h100-sxm", "--listen", "127.0.0.1:0", *argv])
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err and "internal error" not in err, err
    assert "stopped" not in err and "shutting down" not in err, err  # an undone start is quiet
    assert sim.installed() is None, "the refused start left the simulated driver installed"
    return code, err.strip().splitlines()[-1]


def test_a_missing_token_file(capsys, tmp_path):
    missing = tmp_path / "pull.token"
    assert serve(capsys, "--pull-token-file", str(missing)) == (
        2,
        f"gpumetrics: 'server.pull_token_file' (from flag --pull-token-file): cannot read "
        f"'{missing}': No such file or directory",
    )


def test_a_short_token_from_a_variable(capsys, tmp_path, monkeypatch):
    short = tmp_path / "declare.token"
    short.write_text("secret\n")
    monkeypatch.setenv("GPUMETRICS_DECLARE_TOKEN_FILE", str(short))
    assert serve(capsys) == (
        2,
        f"gpumetrics: 'server.declare_token_file' (from GPUMETRICS_DECLARE_TOKEN_FILE="
        f"'{short}'): line 1 of '{short}': a token must be at least 16 characters without "
        "whitespace",
    )


def test_one_token_for_pulling_and_declaring_from_the_file(capsys, tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    cfg = tmp_path / "gpumetrics.yaml"
    cfg.write_text(f"server:\n  pull_token_file: {token}\n  declare_token_file: {token}\n")
    assert serve(capsys, "--config", str(cfg)) == (
        2,
        f"gpumetrics: 'server.declare_token_file' (from {cfg}): a token is also in "
        "pull_token_file; pulling and declaring need distinct tokens",
    )


def test_a_key_without_its_certificate(capsys, tmp_path):
    _, key = self_signed(tmp_path, "server")
    assert serve(capsys, "--tls-key-file", str(key)) == (
        2,
        "gpumetrics: 'server.tls_cert_file': not set, but tls_key_file is; TLS needs both "
        "(--tls-cert-file and --tls-key-file)",
    )


def test_a_key_that_is_not_the_certificates(capsys, tmp_path):
    cert, _ = self_signed(tmp_path, "server")
    _, other_key = self_signed(tmp_path, "other")
    code, line = serve(capsys, "--tls-cert-file", str(cert), "--tls-key-file", str(other_key))
    assert (code, line) == (
        2,
        f"gpumetrics: 'server.tls_key_file' (from flag --tls-key-file): '{other_key}' is not the "
        f"key of the certificate in '{cert}'",
    )


def test_a_certificate_file_that_is_not_pem(capsys, tmp_path):
    _, key = self_signed(tmp_path, "server")
    text = tmp_path / "server.txt"
    text.write_text("not a certificate\n")
    assert serve(capsys, "--tls-cert-file", str(text), "--tls-key-file", str(key)) == (
        2,
        f"gpumetrics: 'server.tls_cert_file' (from flag --tls-cert-file): '{text}' is not PEM "
        "(no -----BEGIN line)",
    )


def test_a_client_ca_file_without_a_certificate(capsys, tmp_path):
    cert, key = self_signed(tmp_path, "server")
    bogus = tmp_path / "ca.pem"
    bogus.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    code, line = serve(
        capsys,
        "--tls-cert-file",
        str(cert),
        "--tls-key-file",
        str(key),
        "--tls-client-ca-file",
        str(bogus),
    )
    assert code == 2
    assert line.startswith(
        f"gpumetrics: 'server.tls_client_ca_file' (from flag --tls-client-ca-file): '{bogus}' "
        "holds no usable CA certificate ("
    )


def test_a_missing_relabel_file_named_in_the_config_file(capsys, tmp_path):
    cfg = tmp_path / "gpumetrics.yaml"
    cfg.write_text(f"identity:\n  relabel_config: {tmp_path}/relabel.yaml\n")
    assert serve(capsys, "--config", str(cfg)) == (
        2,
        f"gpumetrics: 'identity.relabel_config' (from {cfg}): {tmp_path}/relabel.yaml: No such "
        "file or directory",
    )


def test_a_proc_root_that_does_not_exist(capsys, tmp_path):
    missing = tmp_path / "proc"
    assert serve(capsys, "--proc-root", str(missing)) == (
        2,
        f"gpumetrics: 'identity.proc_root' (from flag --proc-root): '{missing}' is not a "
        "directory; it must be a procfs (the host's /proc, mounted read-only into a container, "
        "e.g. /host/proc)",
    )


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("var/lib/gpumetrics", "must be an absolute path (a directory for the durable store), "
         "got 'var/lib/gpumetrics'"),
        ("/proc/gpumetrics", "'/proc/gpumetrics' cannot hold the durable store; use e.g. "
         "/var/lib/gpumetrics"),
        (" /var/lib/gpumetrics", "must not begin or end with white space, got "
         "' /var/lib/gpumetrics'"),
    ],
)  # fmt: skip
def test_a_store_path_that_cannot_be_one(capsys, value, reason):
    assert serve(capsys, "--store-path", value) == (
        2,
        f"gpumetrics: 'store.path' (from flag --store-path): {reason}",
    )


def test_a_store_path_that_is_a_file(capsys, tmp_path, monkeypatch):
    file = tmp_path / "store"
    file.write_text("")
    monkeypatch.setenv("GPUMETRICS_STORE_PATH", str(file))
    assert serve(capsys) == (
        2,
        f"gpumetrics: 'store.path' (from GPUMETRICS_STORE_PATH='{file}'): {file} exists and is "
        "not a directory",
    )


def test_a_store_written_on_another_node_is_refused_untouched(capsys, tmp_path):
    from gpumetrics.store import SqliteJournal

    other = SqliteJournal.in_directory(
        str(tmp_path), signal="metrics", node="gpu-node-1", written_by="0.1.0"
    )
    assert other.open() is None  # a new store file of node gpu-node-1
    other.close()
    before = (tmp_path / "metrics.sqlite").read_bytes()
    assert serve(capsys, "--store-path", str(tmp_path), "--node-name", "gpu-node-2") == (
        2,
        f"gpumetrics: 'store.path' (from flag --store-path): {tmp_path}/metrics.sqlite was "
        "written on node 'gpu-node-1', and this sidecar is node 'gpu-node-2' "
        "(identity.node_name): a store is never mixed; point store.path at this node's own "
        "directory, or move the file away",
    )
    assert (tmp_path / "metrics.sqlite").read_bytes() == before
    assert not (tmp_path / "logs.sqlite").exists()  # refused before the log store was opened


def test_a_push_ca_file_that_cannot_be_read(capsys, tmp_path, monkeypatch):
    missing = tmp_path / "ca.pem"
    monkeypatch.setenv("GPUMETRICS_PUSH_CA_FILE", str(missing))
    assert serve(capsys, "--push-endpoint", "127.0.0.1:1") == (
        2,
        f"gpumetrics: 'push.ca_file' (from GPUMETRICS_PUSH_CA_FILE='{missing}'): cannot read "
        f"'{missing}': No such file or directory",
    )


def test_a_profile_that_does_not_exist(capsys):
    code = main(["serve", "--simulate", "h100-8x", "--listen", "127.0.0.1:0"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(
        "gpumetrics: 'runtime.simulate' (from flag --simulate): h100-8x: no such profile, "
        "field case or file; built-in profiles: a100-mig, "
    )
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_unix_socket_in_a_missing_directory(capsys, tmp_path):
    code, line = serve(capsys, "--listen", f"unix:{tmp_path}/missing/gm.sock")
    assert (code, line) == (
        2,
        f"gpumetrics: 'server.listen[1]' (from flag --listen): directory '{tmp_path}/missing' "
        "does not exist",
    )


def test_two_sidecars_on_one_tcp_port(capfd):
    """The second sidecar on a port: one line like the unix-socket one, no grpc log line."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        code = main(["serve", "--simulate", "h100-sxm", "--listen", f"127.0.0.1:{port}"])
    finally:
        taken.close()
    out, err = capfd.readouterr()  # fd 2: Python's lines and grpc's C core's, if any
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1] == (
        f"gpumetrics: 'server.listen[0]' (from flag --listen): 127.0.0.1:{port} is in use by "
        "another process; stop it or choose another port"
    )
    for noise in ("add_port.cc", "GRPC_VERBOSITY", "stopped", "Traceback"):
        assert noise not in err
    assert sim.installed() is None


def test_a_default_names_the_flag_that_changes_it():
    sources = ConfigSources(
        {"server.pull_token_file": "flag --pull-token-file"},
        file="/etc/gpumetrics.yaml",
        file_paths=frozenset({"identity.relabel_config"}),
        flags={"server.listen": "--listen"},
    )
    error = ConfigError.setting("server.listen[0]", "127.0.0.1:4319 is in use")
    assert error.with_sources(sources).errors == [
        "'server.listen[0]' (default; set --listen): 127.0.0.1:4319 is in use"
    ]
    assert sources.describe("identity.relabel_config") == "from /etc/gpumetrics.yaml"
    assert sources.describe("server.pull_token_file") == "from flag --pull-token-file"
    assert sources.describe("store.max_bytes") == "default"


# The newcomer report's findings (reports F1, F2, F3, F18): files that are not valid UTF-8 or
# not valid YAML, and duplicate keys, are one line naming the file, its line and column.
NOT_UTF8 = b'server:\n  listen: ["127.0.0.1:0"]\n\xff\xfe'  # byte 0xff at offset 34, line 3


def test_a_config_file_that_is_not_utf8(capsys, tmp_path):
    cfg = tmp_path / "t4b.yaml"
    cfg.write_bytes(NOT_UTF8)
    assert serve(capsys, "--config", str(cfg)) == (
        2,
        f"gpumetrics: config file {cfg}: not valid UTF-8 (byte 0xff at offset 34, line 3)",
    )


def test_a_scenario_file_that_is_not_utf8(capsys, tmp_path):
    scenario = tmp_path / "t4b.yaml"
    scenario.write_bytes(NOT_UTF8)
    code = main(["serve", "--simulate", str(scenario), "--listen", "127.0.0.1:0"])
    err = capsys.readouterr().err
    assert (code, err) == (
        2,
        f"gpumetrics: 'runtime.simulate' (from flag --simulate): {scenario}: not valid UTF-8 "
        "(byte 0xff at offset 34, line 3)\n",
    )
    assert sim.installed() is None


def test_a_scenario_yaml_syntax_error_is_one_line_with_line_and_column(capsys, tmp_path):
    scenario = tmp_path / "t3.yaml"
    scenario.write_text("server: [\n")
    code = main(["serve", "--simulate", str(scenario), "--listen", "127.0.0.1:0"])
    err = capsys.readouterr().err
    assert (code, err) == (
        2,
        f"gpumetrics: 'runtime.simulate' (from flag --simulate): {scenario}: not valid YAML: "
        "line 2, column 1: expected the node content, but found '<stream end>'\n",
    )


def test_a_relabel_yaml_syntax_error_is_one_line_with_line_and_column(capsys, tmp_path):
    rules = tmp_path / "relabel.yaml"
    rules.write_text("relabel_configs:\n  - action: [\n")
    assert serve(capsys, "--relabel-config", str(rules)) == (
        2,
        f"gpumetrics: 'identity.relabel_config' (from flag --relabel-config): {rules}: relabel "
        "configuration: invalid YAML: line 3, column 1: expected the node content, but found "
        "'<stream end>'",
    )


def test_a_duplicate_key_in_the_config_file(capsys, tmp_path):
    cfg = tmp_path / "dup.yaml"
    cfg.write_text("collection:\n  interval_s: 1\n  interval_s: 2\n")
    assert serve(capsys, "--config", str(cfg)) == (
        2,
        f"gpumetrics: config file {cfg}: line 3, column 3: duplicate key 'interval_s' "
        "(first at line 2)",
    )


def test_a_duplicate_section_in_the_config_file(capsys, tmp_path):
    cfg = tmp_path / "dup.yaml"
    cfg.write_text("server:\n  max_streams: 2\nstore: {}\nserver:\n  max_streams: 3\n")
    assert serve(capsys, "--config", str(cfg)) == (
        2,
        f"gpumetrics: config file {cfg}: line 4, column 1: duplicate key 'server' "
        "(first at line 1)",
    )


def test_a_missing_config_file_named_by_the_variable(capsys, tmp_path, monkeypatch):
    missing = tmp_path / "nonexist.yaml"
    monkeypatch.setenv("GPUMETRICS_CONFIG", str(missing))
    assert serve(capsys) == (
        2,
        f"gpumetrics: config file {missing} (from GPUMETRICS_CONFIG): No such file or directory",
    )


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ["--health-listen", "127.0.0.1:24319", "--listen", "127.0.0.1:24319"],
            "'server.health_listen' (from flag --health-listen): same address as "
            "'server.listen[1]'",
        ),
        (
            ["--profiler-listen", "127.0.0.1:24319", "--listen", "127.0.0.1:24319"],
            "'server.profiler_listen[0]' (from flag --profiler-listen): same address as "
            "'server.listen[1]'",
        ),
    ],
)
def test_the_same_address_twice_is_refused_before_anything_starts(capsys, flags, line):
    """Newcomer report F16: not "in use by another process" when the other one is this one."""
    assert serve(capsys, *flags) == (2, f"gpumetrics: {line}")


def test_the_same_unix_socket_twice_is_refused(capsys, tmp_path):
    sock = f"unix:{tmp_path}/d.sock"
    assert serve(capsys, "--listen", sock, "--listen", sock) == (
        2,
        "gpumetrics: 'server.listen[2]' (from flag --listen): same address as 'server.listen[1]'",
    )
