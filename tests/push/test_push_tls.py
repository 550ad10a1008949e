"""Push over TLS and mTLS to a real in-process OTLP server with throwaway certificates."""

from __future__ import annotations

import datetime as dt
import ipaddress
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from gpumetrics.service.push import ExportResult, PushExporter, PushSettings
from gpumetrics.store import BatchStore
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

from .conftest import FakeCollector, PooledServer
from .test_push import batch


def _pem_key(key):
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(subject, issuer, key, issuer_key, *, ca, eku=None, ip=None):
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if eku:
        builder = builder.add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
    if ip:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test-ca", "test-ca", ca_key, ca_key, ca=True)
    files = {"ca.pem": ca}
    for name, eku, ip in (
        ("server", ExtendedKeyUsageOID.SERVER_AUTH, "127.0.0.1"),
        ("client", ExtendedKeyUsageOID.CLIENT_AUTH, None),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        files[f"{name}.pem"] = _cert(name, "test-ca", key, ca_key, ca=False, eku=eku, ip=ip)
        files[f"{name}.key"] = _pem_key(key)
    for name, data in files.items():
        (d / name).write_bytes(data)
    return d


def tls_collector(pki, mtls):
    fake = FakeCollector()
    served = PooledServer(2)
    server = served.server
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(fake, server)
    creds = grpc.ssl_server_credentials(
        [((pki / "server.key").read_bytes(), (pki / "server.pem").read_bytes())],
        root_certificates=(pki / "ca.pem").read_bytes() if mtls else None,
        require_client_auth=mtls,
    )
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    return fake, served, f"127.0.0.1:{port}"


@pytest.mark.parametrize("mtls", [False, True])
def test_push_over_tls(pki, mtls):
    fake, server, endpoint = tls_collector(pki, mtls)
    try:
        store = BatchStore()
        store.append(batch(2))
        client: dict[str, Any] = (
            {"cert_file": str(pki / "client.pem"), "key_file": str(pki / "client.key")}
            if mtls
            else {}
        )
        settings = PushSettings(
            endpoint=endpoint, ca_file=str(pki / "ca.pem"), timeout_s=10, **client
        )
        exporter = PushExporter(store, settings, jitter=lambda: 1.0, wait=lambda _s: True)
        assert exporter.export_pending() == [ExportResult.SENT]
        assert len(fake.requests) == 1
    finally:
        server.stop()


def test_mtls_without_a_client_certificate_is_not_acknowledged(pki):
    fake, server, endpoint = tls_collector(pki, mtls=True)
    try:
        store = BatchStore()
        store.append(batch(2))
        settings = PushSettings(endpoint=endpoint, ca_file=str(pki / "ca.pem"), timeout_s=2)
        exporter = PushExporter(store, settings, jitter=lambda: 1.0, wait=lambda _s: True)
        assert exporter.export_pending() == [ExportResult.RETRY_LATER]
        assert fake.requests == []
    finally:
        server.stop()
