"""Under mTLS the certificate names the declarer unambiguously (docs/protocol.md, "The declarer").

Issue: a certificate with SANs only gave an empty common name, so every such agent was the same
declarer (``x509:``) and one agent's ``replace_all`` released another's declarations; a common
name containing ``/`` collided with a common name plus metadata.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from gpumetrics.identity.declared import DeclaredStore
from gpumetrics.service.profiler import certificate_identity
from gpumetrics.v1 import profiler_pb2 as pb
from gpumetrics.v1 import profiler_pb2_grpc

from .conftest import TIMEOUT, MakeSidecar, Sidecar, declared
from .test_tls import Pem, _key_pem, build_pki, creds, tls_settings


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build_pki(tmp_path_factory.mktemp("pki"))


def leaf(pki_ca: Any, subject: x509.Name, sans: list[x509.GeneralName]) -> Pem:
    ca_key, ca_cert = pki_ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def cn(name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])


def declare(
    sc: Sidecar,
    pki: dict[str, Any],
    client: Pem,
    pids: Sequence[int],
    replace_all: bool = False,
    metadata: Sequence[tuple[str, str]] = (),
) -> Any:
    channel = sc.channel("localhost:" + sc.address.rsplit(":", 1)[1], creds(pki["ca"].cert, client))
    stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(channel)
    return stub.DeclareProcesses(
        pb.DeclareProcessesRequest(
            processes=[pb.ProcessDeclaration(pid=p) for p in pids], replace_all=replace_all
        ),
        metadata=metadata,
        timeout=TIMEOUT,
    )


def test_agents_with_san_only_certificates_are_different_declarers(
    sidecar: MakeSidecar, pki: dict[str, Any]
) -> None:
    store = DeclaredStore()
    sc = sidecar(declared=store, **tls_settings(pki, mtls=True))
    ca = pki["ca_key_cert"]
    spiffe_a = leaf(ca, x509.Name([]), [x509.UniformResourceIdentifier("spiffe://c/ns/a/sa/x")])
    spiffe_b = leaf(ca, x509.Name([]), [x509.UniformResourceIdentifier("spiffe://c/ns/b/sa/x")])
    dns_only = leaf(ca, x509.Name([]), [x509.DNSName("agent-3.example")])
    declare(sc, pki, spiffe_a, [1, 2])
    declare(sc, pki, spiffe_b, [3])
    declare(sc, pki, dns_only, [4])
    owners = {pid: declared(store, pid).declarer for pid in (1, 3, 4)}
    assert owners == {
        1: "x509:uri=spiffe://c/ns/a/sa/x",
        3: "x509:uri=spiffe://c/ns/b/sa/x",
        4: "x509:dns=agent-3.example",
    }
    # b's complete view releases only what b declared
    assert declare(sc, pki, spiffe_b, [5], replace_all=True).released == 1
    assert [p for p in range(1, 6) if store.lookup(p)[1]] == [1, 2, 4, 5]


def test_a_common_name_with_a_slash_does_not_collide_with_name_plus_metadata(
    sidecar: MakeSidecar, pki: dict[str, Any]
) -> None:
    store = DeclaredStore()
    sc = sidecar(declared=store, **tls_settings(pki, mtls=True))
    ca = pki["ca_key_cert"]
    declare(sc, pki, leaf(ca, cn("agent/node-7"), []), [1])
    declare(sc, pki, leaf(ca, cn("agent"), []), [2], metadata=(("gpumetrics-declarer", "node-7"),))
    one, two = declared(store, 1).declarer, declared(store, 2).declarer
    assert (one, two) == ("x509:cn=agent/node-7", "x509:cn=agent#node-7")
    assert declare(sc, pki, leaf(ca, cn("agent/node-7"), []), [], replace_all=True).released == 1
    assert store.lookup(2)[1]  # the other agent's declaration stays


def test_certificate_identity_escapes_and_falls_back_to_the_fingerprint() -> None:
    pem = [b"-----BEGIN CERTIFICATE-----x"]
    assert certificate_identity({}) is None  # no client certificate: plain TLS or plaintext
    assert certificate_identity({"x509_pem_cert": pem, "peer_dns": [b"b.x", b"a.x"]}) == (
        "dns=a.x,b.x"
    )
    odd = {"x509_pem_cert": pem, "x509_common_name": ["a,b#c%d é".encode()]}
    assert certificate_identity(odd) == "cn=a%2Cb%23c%25d%20%C3%A9"
    bare = certificate_identity({"x509_pem_cert": pem, "x509_common_name": [b""]})
    assert bare is not None and bare.startswith("sha256=") and len(bare) == 7 + 64
