"""A throwaway PKI for the security tests: two unrelated CAs and leaves (cryptography, P-256)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    """A PEM certificate and key, and where they were written."""

    cert: bytes
    key: bytes
    cert_file: Path
    key_file: Path


class Authority:
    """A self-signed CA that issues server (``127.0.0.1``/``localhost``) and client leaves."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name, self.dir = name, directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._cert = (
            self._builder(subject, self._key.public_key())
            .issuer_name(subject)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.pem = self._cert.public_bytes(serialization.Encoding.PEM)
        self.file = directory / f"{name}-ca.pem"
        self.file.write_bytes(self.pem)

    @staticmethod
    def _builder(subject: x509.Name, key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        now = dt.datetime.now(dt.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .public_key(key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=2))
        )

    def issue(self, cn: str, server: bool) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            self._builder(
                x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]), key.public_key()
            )
            .issuer_name(self._cert.subject)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(self._key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        cert_file, key_file = self.dir / f"{cn}.pem", self.dir / f"{cn}.key"
        cert_file.write_bytes(cert)
        key_file.write_bytes(key_pem)
        return Issued(cert, key_pem, cert_file, key_file)
