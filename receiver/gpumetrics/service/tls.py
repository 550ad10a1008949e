"""TLS and mTLS server credentials from PEM files (``ServerSettings.tls_*``).

grpcio (BoringSSL) serves TLS 1.2 and 1.3. With ``tls_client_ca_file`` set, a client must present
a certificate that CA signed (``require_client_auth``), checked during the handshake, before any
call reaches the server; the certificate's common name then names the declarer
(:func:`gpumetrics.service.profiler.declarer_of`).

The files are checked at start-up with the standard library's OpenSSL binding
(``ssl.SSLContext.load_cert_chain`` / ``load_verify_locations``): grpcio would accept a key that
does not match its certificate and fail only at bind time with "Failed to bind", naming nothing.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import grpc

from gpumetrics.service.errors import SettingError
from gpumetrics.service.settings import ServerSettings


def _read(path: Path, field: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SettingError(field, f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise SettingError(field, f"{str(path)!r} is not PEM (no -----BEGIN line)")
    return data


def _reason(exc: ssl.SSLError) -> str:
    text = str(exc.reason or exc.args[-1] if exc.args else exc)
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", text)  # CPython's source line: noise here


def _no_password() -> bytes:
    return b""  # an encrypted key then fails to load instead of prompting on a terminal


def _check_pair(settings: ServerSettings) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(
            str(settings.tls_cert_file), str(settings.tls_key_file), password=_no_password
        )
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise SettingError(
                "tls_key_file",
                f"{str(settings.tls_key_file)!r} is not the key of the certificate in "
                f"{str(settings.tls_cert_file)!r}",
            ) from None
        raise SettingError(
            "tls_cert_file",
            f"{str(settings.tls_cert_file)!r} with key {str(settings.tls_key_file)!r} cannot be "
            f"loaded ({_reason(exc)}); both must be PEM, the key unencrypted",
        ) from None
    if settings.tls_client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=str(settings.tls_client_ca_file))
        except ssl.SSLError as exc:
            raise SettingError(
                "tls_client_ca_file",
                f"{str(settings.tls_client_ca_file)!r} holds no usable CA certificate "
                f"({_reason(exc)})",
            ) from None


def server_credentials(settings: ServerSettings) -> grpc.ServerCredentials | None:
    """Return the credentials of TCP listeners, or None when TLS is not configured.

    Raises:
        SettingError: naming ``tls_cert_file``, ``tls_key_file`` or ``tls_client_ca_file`` when
            a file cannot be read, is not PEM, or the key does not match the certificate.

    """
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    chain = _read(settings.tls_cert_file, "tls_cert_file")
    key = _read(settings.tls_key_file, "tls_key_file")
    ca = None
    if settings.tls_client_ca_file is not None:
        ca = _read(settings.tls_client_ca_file, "tls_client_ca_file")
    _check_pair(settings)
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=ca, require_client_auth=ca is not None
    )
