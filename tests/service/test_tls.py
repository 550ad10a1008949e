"""TLS and mTLS with a throwaway CA minted for the test (cryptography, ECDSA P-256)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from gpumetrics.v1 import profiler_pb2 as pb
from gpumetrics.v1 import pull_pb2, pull_pb2_grpc

from .conftest import TIMEOUT, MakeSidecar, declared

FAIL_FAST = 5.0  # handshake failures surface at once; this only bounds a broken test


@dataclass
class Pem:
    cert: bytes
    key: bytes


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_ca(cn: str) -> tuple[Pem, ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)), key, cert


def make_leaf(ca_key: Any, ca_cert: x509.Certificate, cn: str, server: bool) -> Pem:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build_pki(tmp_path_factory.mktemp("pki"))


def build_pki(d: Path) -> dict[str, Any]:
    ca, ca_key, ca_cert = make_ca("gpumetrics test CA")
    other, other_key, other_cert = make_ca("someone else's CA")
    server = make_leaf(ca_key, ca_cert, "sidecar", server=True)
    client = make_leaf(ca_key, ca_cert, "profiler-agent", server=False)
    stranger = make_leaf(other_key, other_cert, "intruder", server=False)
    files = {}
    for name, data in {
        "ca.pem": ca.cert,
        "server.pem": server.cert,
        "server.key": server.key,
    }.items():
        (d / name).write_bytes(data)
        files[name] = d / name
    return {
        "files": files,
        "ca": ca,
        "ca_key_cert": (ca_key, ca_cert),
        "other": other,
        "client": client,
        "stranger": stranger,
    }


def tls_settings(pki: dict[str, Any], mtls: bool = False) -> dict[str, Any]:
    s = {"tls_cert_file": pki["files"]["server.pem"], "tls_key_file": pki["files"]["server.key"]}
    if mtls:
        s["tls_client_ca_file"] = pki["files"]["ca.pem"]
    return s


def creds(root: bytes, client: Pem | None = None) -> grpc.ChannelCredentials:
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.ssl_channel_credentials(root, client.key, client.cert)


def pull(stub: pull_pb2_grpc.MetricsPullServiceStub, timeout: float = TIMEOUT) -> Any:
    return stub.Pull(pull_pb2.PullRequest(consumer="tls"), timeout=timeout)


def test_tls_server(sidecar: MakeSidecar, pki: dict[str, Any]) -> None:
    sc = sidecar(append=1, **tls_settings(pki))
    assert pull(sc.pull_stub(credentials=creds(pki["ca"].cert))).data_points == 1
    for stub in (sc.pull_stub(), sc.pull_stub(credentials=creds(pki["other"].cert))):
        with pytest.raises(grpc.RpcError) as err:  # plaintext, or a CA we do not trust
            pull(stub, FAIL_FAST)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert [c.name for c in sc.store.stats().consumers] == ["tls"]  # only the good client got in


def test_mtls_requires_a_certificate_from_the_configured_ca(
    sidecar: MakeSidecar, pki: dict[str, Any]
) -> None:
    sc = sidecar(append=1, **tls_settings(pki, mtls=True))
    root = pki["ca"].cert
    for client in (None, pki["stranger"]):
        with pytest.raises(grpc.RpcError) as err:
            pull(sc.pull_stub(credentials=creds(root, client)), FAIL_FAST)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert sc.store.stats().consumers == ()
    assert pull(sc.pull_stub(credentials=creds(root, pki["client"]))).data_points == 1


def test_mtls_certificate_names_the_declarer(sidecar: MakeSidecar, pki: dict[str, Any]) -> None:
    sc = sidecar(**tls_settings(pki, mtls=True))
    stub = sc.profiler_stub(credentials=creds(pki["ca"].cert, pki["client"]))
    req = pb.DeclareProcessesRequest(processes=[pb.ProcessDeclaration(pid=1)])
    stub.DeclareProcesses(req, timeout=TIMEOUT)
    assert declared(sc.declared, 1).declarer == "x509:cn=profiler-agent"
    stub.DeclareProcesses(req, metadata=(("gpumetrics-declarer", "node-7"),), timeout=TIMEOUT)
    assert declared(sc.declared, 1).declarer == "x509:cn=profiler-agent#node-7"


def test_non_loopback_listen_with_tls_and_mtls_is_allowed(
    sidecar: MakeSidecar, pki: dict[str, Any]
) -> None:
    sc = sidecar(listen=["0.0.0.0:0"], append=1, **tls_settings(pki, mtls=True))
    port = sc.address.rsplit(":", 1)[1]
    stub = sc.pull_stub(
        address=f"127.0.0.1:{port}", credentials=creds(pki["ca"].cert, pki["client"])
    )
    assert pull(stub).data_points == 1


def test_unix_listeners_stay_plaintext_next_to_tls(
    sidecar: MakeSidecar, pki: dict[str, Any], short_tmp: Path
) -> None:
    sock = f"unix://{short_tmp}/p.sock"
    sc = sidecar(append=1, profiler_listen=[sock], **tls_settings(pki))
    resp = sc.profiler_stub(address=sc.server.addresses.profiler_listen[0]).DeclareProcesses(
        pb.DeclareProcessesRequest(processes=[pb.ProcessDeclaration(pid=3)]), timeout=TIMEOUT
    )
    assert resp.accepted == 1
    # the profiler service is only on its own listener
    with pytest.raises(grpc.RpcError) as err:
        sc.profiler_stub(credentials=creds(pki["ca"].cert)).DeclareProcesses(
            pb.DeclareProcessesRequest(), timeout=TIMEOUT
        )
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
