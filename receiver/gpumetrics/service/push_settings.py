"""The push exporter's settings (YAML section ``push``), apart from the exporter itself.

A pydantic model only, so the configuration model imports no gRPC code; the exporter is
:mod:`gpumetrics.service.push`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gpumetrics.settingsbase import SettingsModel

__all__ = ["PushSettings"]


class PushSettings(SettingsModel):
    """Push exporter settings (YAML section ``push``). Push is off while ``endpoint`` is unset.

    Attributes:
        endpoint: collector OTLP/gRPC address, ``host:port`` or ``unix:/path``; None = no push.
        insecure: plaintext instead of TLS.
        ca_file / cert_file / key_file: PEM files: trusted roots, and the client certificate and
            key for mTLS (both or neither).
        headers: gRPC metadata sent with every export (keys are lower-cased).
        compression: ``none`` or ``gzip``.
        timeout_s: one deadline (s) for an export including all its retries.
        interval_s: how often (s) the store is drained.
        initial_backoff_s: first back-off (s), doubled per attempt, jittered ±20 %.
        max_points_per_export / max_bytes_per_export: caps of one Export request (a single
            larger batch is still sent alone); bytes default to 3.5 MiB, under the 4 MiB receive
            limit most collectors keep.

    """

    endpoint: str | None = None
    insecure: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    compression: Literal["none", "gzip"] = "none"
    timeout_s: float = Field(default=10.0, gt=0)
    interval_s: float = Field(default=10.0, gt=0)
    initial_backoff_s: float = Field(default=1.0, gt=0)
    max_points_per_export: int = Field(default=50_000, gt=0)
    max_bytes_per_export: int = Field(default=3_670_016, gt=0)

    @model_validator(mode="after")
    def _check(self) -> PushSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file: must be set together with key_file")
        if self.insecure and (self.ca_file or self.cert_file):
            raise ValueError("insecure: cannot be combined with ca_file/cert_file/key_file")
        if self.endpoint is not None and not self.endpoint.strip():
            raise ValueError("endpoint: must not be empty (leave it unset to disable push)")
        if self.endpoint is not None:
            _check_endpoint(self.endpoint)
        for key in self.headers:
            if not key or key != key.strip() or any(c.isspace() for c in key):
                raise ValueError(f"headers: invalid header name {key!r}")
        return self


def _check_endpoint(endpoint: str) -> None:
    """Refuse a TCP endpoint without a port: grpc would dial ``localhost`` as ``localhost:443``.

    Accepted: ``host:port``, ``[v6]:port``, ``unix:/path``, and any explicit gRPC target with a
    scheme (``dns:///collector:4317``), which grpc parses itself.

    Raises:
        ValueError: naming the forms.

    """
    if endpoint.startswith("unix:") or "://" in endpoint:
        return
    host, sep, port = endpoint.rpartition(":")
    if host.startswith("[") and not host.endswith("]"):
        sep = ""  # [v6addr] without a port
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(
            f"endpoint: {endpoint!r} needs a port 1..65535 (grpc would dial port 443): write "
            "host:port (e.g. collector:4317), [v6]:port or unix:/path"
        )
