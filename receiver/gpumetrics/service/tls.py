"""TLS and mTLS server credentials from PEM files (``ServerSettings.tls_*``).

grpcio (BoringSSL) serves TLS 1.2 and 1.3. With ``tls_client_ca_file`` set, a client must present
a certificate that CA signed (``require_client_auth``), checked during the handshake, before any
call reaches the server; the certificate's common name then names the declarer
(:func:`gpumetrics.service.profiler.declarer_of`).
"""

from __future__ import annotations

from pathlib import Path

import grpc

from gpumetrics.service.settings import ServerSettings


def _read(path: Path, field: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"'{field}': cannot read {str(path)!r}: {exc}") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"'{field}': {str(path)!r} is not PEM (no -----BEGIN line)")
    return data


def server_credentials(settings: ServerSettings) -> grpc.ServerCredentials | None:
    """Return the credentials of TCP listeners, or None when TLS is not configured.

    Raises:
        ValueError: naming ``tls_cert_file``, ``tls_key_file`` or ``tls_client_ca_file`` when a
            file cannot be read or is not PEM.

    """
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    chain = _read(settings.tls_cert_file, "tls_cert_file")
    key = _read(settings.tls_key_file, "tls_key_file")
    ca = None
    if settings.tls_client_ca_file is not None:
        ca = _read(settings.tls_client_ca_file, "tls_client_ca_file")
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=ca, require_client_auth=ca is not None
    )
