"""``ServerSettings``: every setting of the gRPC server, validated, with its default.

Listen addresses are ``host:port`` (TCP; ``[v6addr]:port`` for IPv6; port 0 picks a free port)
or ``unix:///abs/path``, ``unix:/abs/path``, ``unix:relative/path`` (a unix socket; its file mode
is ``unix_socket_mode``). Security rules (``docs/security.md``):

* a TCP listener that is not loopback needs TLS (``tls_cert_file`` + ``tls_key_file``), unless
  ``allow_insecure_listen`` says otherwise;
* the profiler service is on its own unix socket by default (``profiler_listen``:
  :func:`default_profiler_socket`), where each caller's ``SO_PEERCRED`` says who may declare
  what (``gpumetrics.service.declarers``); on any TCP listener, loopback included (every local
  user can connect there), it needs a way to tell who may declare (``declare_token_file`` or
  mTLS via ``tls_client_ca_file``), unless ``allow_unauthenticated_declare`` says otherwise;
* ``health_listen`` is plaintext by design (the kubelet's gRPC probe cannot do TLS or tokens)
  and serves nothing but ``grpc.health.v1.Health``.

Errors name the field: ``'listen[0]': 0.0.0.0:4319 is not loopback; ...``.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gpumetrics.settingsbase import SettingsModel
from gpumetrics.store.limits import DEFAULT_MAX_BATCH_BYTES

DEFAULT_PULL_MAX_BYTES = DEFAULT_MAX_BATCH_BYTES
"""Answer size when a request leaves ``max_bytes`` at 0: 4 MiB minus 64 KiB of envelope, so a
response fits the 4 MiB default receive limit of gRPC clients (grpc-go, grpcio)."""

DEFAULT_PULL_MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""Default cap on any answer (``server.pull_max_bytes``): a request asking more gets this."""

DEFAULT_PULL_INFLIGHT_BYTES = 32 * 1024 * 1024
"""Default budget of answers in flight at once (``server.pull_inflight_bytes``)."""

DEFAULT_MAX_ENTRIES = 4096
"""Default ``max_declarations_per_request``: declarations or exits per unary request."""

DEFAULT_LISTEN = "127.0.0.1:4319"
"""Default pull listener: loopback only (4317/4318 are OTLP's; 4319 is next to them)."""

SYSTEM_PROFILER_SOCKET = "/run/gpumetrics/profiler.sock"
"""The profiler service's socket of a sidecar run as root: ``/run/<name>/``, where the field's
root daemons put theirs (containerd ``/run/containerd/containerd.sock``, Docker
``/run/docker.sock``, the kubelet's ``/var/lib/kubelet/pod-resources/kubelet.sock``)."""

PROFILER_SOCKET_NAME = "profiler.sock"


def default_profiler_socket(
    euid: int | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """Return the default path of the profiler service's unix socket (``server.profiler_listen``).

    As root: :data:`SYSTEM_PROFILER_SOCKET`. As another user, where rootless daemons put
    theirs (rootless Docker and containerd, Podman: the XDG base directory specification's
    ``$XDG_RUNTIME_DIR``): ``$XDG_RUNTIME_DIR/gpumetrics/profiler.sock``, or
    ``/tmp/gpumetrics-<uid>/profiler.sock`` when ``XDG_RUNTIME_DIR`` is unset or not absolute.
    The client (``gpumetrics declare`` without ``ADDR``) computes the same path.

    >>> default_profiler_socket(0, {})
    '/run/gpumetrics/profiler.sock'
    >>> default_profiler_socket(1000, {"XDG_RUNTIME_DIR": "/run/user/1000"})
    '/run/user/1000/gpumetrics/profiler.sock'
    >>> default_profiler_socket(1000, {})
    '/tmp/gpumetrics-1000/profiler.sock'
    """
    uid = os.geteuid() if euid is None else euid
    env = os.environ if environ is None else environ
    if uid == 0:
        return SYSTEM_PROFILER_SOCKET
    runtime_dir = env.get("XDG_RUNTIME_DIR", "")
    if runtime_dir.startswith("/"):
        return os.path.join(runtime_dir, "gpumetrics", PROFILER_SOCKET_NAME)
    return os.path.join("/tmp", f"gpumetrics-{uid}", PROFILER_SOCKET_NAME)  # noqa: S108


def _default_profiler_listen() -> list[str]:
    return [f"unix://{default_profiler_socket()}"]


MiB = 1024 * 1024
ENVELOPE_BYTES = 64 * 1024
"""Room left in a message for everything but the OTLP payload (PullResponse fields)."""

_UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL (unix(7))

DEFAULT_MAX_RECEIVE_BYTES = 1024 * 1024
"""Default ``max_receive_message_bytes``: 1 MiB, a quarter of gRPC's own default. A thread that
reads a request holds up to about 2.6 times its size (gRPC's buffer and its copy as bytes, about
twice, measured; the parsed elements, :data:`REQUEST_BYTES_PER_ELEMENT`), and 16 threads may
read at once with the default limits, so this is 42 MiB of the memory ceiling
(``docs/deployment.md``, "Memory"); 4 MiB would make it 168 MiB. A declaration is at most about
200 KiB (three fields of 64 KiB), so 1 MiB holds five at their largest, or about 1,600 typical
ones (646 bytes each)."""

REQUEST_BYTES_PER_ELEMENT = 128
"""A request may hold one repeated element per this many bytes of ``max_receive_message_bytes``
(8,192 with the default 1 MiB; :mod:`gpumetrics.service.wirecount`). A parsed element takes at
most about 80 bytes (upb; an empty ``ProcessDeclaration``, measured), so a request's parsed
form stays within two thirds of the receive limit beyond its wire size: 4,096 declarations of
one environment variable each fit."""


@dataclass(frozen=True)
class ListenAddress:
    """One parsed listen address.

    Attributes:
        text: as configured.
        kind: ``tcp`` or ``unix``.
        host: TCP host without brackets (``127.0.0.1``, ``::1``, ``localhost``, ``0.0.0.0``).
        port: TCP port (0: any free port).
        path: absolute path of a unix socket.

    """

    text: str
    kind: Literal["tcp", "unix"]
    host: str = ""
    port: int = 0
    path: str = ""

    @property
    def loopback(self) -> bool:
        """True for a unix socket or a TCP host that is ``localhost`` or a loopback address."""
        if self.kind == "unix" or self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a host name: it may resolve to anything

    def bind_target(self) -> str:
        """Return the address for ``grpc.Server.add_*_port``."""
        if self.kind == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def dial_target(self, port: int) -> str:
        """Return the address a client dials once bound (``port``: the real TCP port)."""
        if self.kind == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{port}"


def parse_listen_address(text: str, field: str) -> ListenAddress:
    """Parse ``text`` (see the module docstring).

    Raises:
        ValueError: ``'<field>': ...`` for anything else (abstract unix sockets included: they
            have no file permissions).

    """
    if not isinstance(text, str) or not text:
        raise ValueError(f"'{field}': must be host:port or unix:/path, got {text!r}")
    if text.startswith("unix-abstract:"):
        raise ValueError(f"'{field}': abstract unix sockets have no file mode; use unix:/path")
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if path.startswith("//"):
            path = path[2:]
            if not path.startswith("/"):
                raise ValueError(f"'{field}': unix:// must be followed by an absolute path")
        if not path:
            raise ValueError(f"'{field}': unix: needs a socket path")
        path = os.path.abspath(path)
        if len(os.fsencode(path)) > _UNIX_PATH_MAX:
            raise ValueError(f"'{field}': socket path longer than {_UNIX_PATH_MAX} bytes")
        return ListenAddress(text, "unix", path=path)
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(
            f"'{field}': {text!r} must be host:port (e.g. 127.0.0.1:4319) or unix:/path"
        )
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError(f"'{field}': unbalanced '[' in {text!r}")
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"'{field}': {host!r} is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"'{field}': write an IPv6 address in brackets, e.g. [::1]:4319")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"'{field}': port must be 0..65535, got {port_text!r}")
    return ListenAddress(text, "tcp", host=host, port=int(port_text))


class ServerSettings(SettingsModel):
    """Settings of :class:`~gpumetrics.service.SidecarServer` (all sizes in bytes, times in s).

    Attributes:
        listen: listeners of the pull service (and of the profiler service unless
            ``profiler_listen`` is set), health and reflection. May be empty when the caller adds
            its own listener (go-plugin mode).
        profiler_listen: the listeners of the profiler service (with health and reflection);
            default: one unix socket, :func:`default_profiler_socket`, whose directory is made
            if missing. Empty: the profiler service is served on ``listen``.
        health_listen: optional plaintext listener serving only ``grpc.health.v1.Health``.
        allow_insecure_listen: allow non-loopback TCP without TLS. Only for networks you trust.
        allow_unauthenticated_declare: allow the profiler service on a TCP listener without a
            declare token or mTLS: whoever can connect (on loopback: every local user) may then
            declare any process's identity. Only for a single-user host you trust.
        trusted_declarer_uids, trusted_declarer_gids: unix-socket peers (by ``SO_PEERCRED``)
            that may declare any process, besides root and the sidecar's own user; a gid is a
            number or a group name. Other peers may declare only their own processes.
        unix_socket_mode: file mode of every unix socket, set right after bind (the socket is
            created under umask 0177 so it is never wider in between); an int, or an octal
            string (``"0660"``, ``"0o660"``).
        unix_socket_group: group (name or gid) given to every unix socket, or None.
        tls_cert_file, tls_key_file: PEM server certificate chain and key (TLS on every TCP
            listener except ``health_listen``).
        tls_client_ca_file: PEM CA bundle; when set, TCP clients must present a certificate it
            signed (mTLS).
        pull_token_file, declare_token_file: files of bearer tokens (one per line) that may pull
            / declare; None: that service needs no token.
        max_receive_message_bytes: largest request accepted; larger ones get RESOURCE_EXHAUSTED,
            as do requests of more than one repeated element per
            :data:`REQUEST_BYTES_PER_ELEMENT` bytes of it (:attr:`max_request_elements`).
        max_send_message_bytes: largest response sent.
        pull_default_max_bytes: answer size of a Pull that sets no ``max_bytes``; it also
            bounds every stored batch (larger collections are split), so any batch fits a
            default answer and a client's 4 MiB default receive limit.
        pull_max_bytes: the most any Pull answer carries, whatever ``max_bytes`` it asks
            (at most ``max_send_message_bytes`` minus 64 KiB). Unset: 16 MiB, or less when
            ``max_send_message_bytes`` is smaller.
        pull_inflight_bytes: answers of all Pulls in flight at once (built, not yet sent);
            a Pull that finds it used up is answered UNAVAILABLE (retry later), one that finds
            part of it gets a shorter answer. Memory of answers in flight stays below about
            twice this. Unset: 32 MiB, or ``pull_max_bytes`` when that is larger.
        max_streams: streaming calls open at once per streaming service, every listener
            together (each holds a thread of that service's own pool; reflection v1 and
            v1alpha are one service here).
        unary_workers: threads for unary calls, shared by the ``listen`` and
            ``profiler_listen`` listeners (streams never use them; ``health_listen`` has two
            of its own).
        max_concurrent_rpcs: calls accepted at once per server (running or queued); beyond,
            RESOURCE_EXHAUSTED. A queued call's request is not read until a thread takes it.
        max_declarations_per_request: entries per DeclareProcesses/ReportExits request.
        reflection: serve gRPC server reflection (``buf curl`` and ``grpcurl`` use it).
        keepalive_time_s: HTTP/2 keepalive ping interval, so dead peers free their stream.

    """

    listen: list[str] = Field(default_factory=lambda: [DEFAULT_LISTEN])
    profiler_listen: list[str] = Field(default_factory=_default_profiler_listen)
    health_listen: str | None = None
    allow_insecure_listen: bool = False
    allow_unauthenticated_declare: bool = False
    trusted_declarer_uids: list[int] = Field(default_factory=list)
    trusted_declarer_gids: list[int | str] = Field(default_factory=list)
    unix_socket_mode: int = Field(default=0o600, ge=0, le=0o777)
    unix_socket_group: str | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    pull_token_file: Path | None = None
    declare_token_file: Path | None = None
    max_receive_message_bytes: int = Field(default=DEFAULT_MAX_RECEIVE_BYTES, ge=ENVELOPE_BYTES)
    max_send_message_bytes: int = Field(default=64 * MiB, ge=2 * ENVELOPE_BYTES)
    pull_default_max_bytes: int = Field(default=DEFAULT_PULL_MAX_BYTES, gt=0)
    pull_max_bytes: int = Field(default=DEFAULT_PULL_MAX_ANSWER_BYTES, gt=0)
    pull_inflight_bytes: int = Field(default=DEFAULT_PULL_INFLIGHT_BYTES, gt=0)
    max_streams: int = Field(default=4, ge=1, le=1024)
    unary_workers: int = Field(default=8, ge=1, le=1024)
    max_concurrent_rpcs: int = Field(default=128, ge=2)
    max_declarations_per_request: int = Field(default=DEFAULT_MAX_ENTRIES, ge=1)
    reflection: bool = True
    keepalive_time_s: float = Field(default=60.0, gt=0)

    @field_validator("listen", "profiler_listen")
    @classmethod
    def _addresses(cls, value: list[str], info: object) -> list[str]:
        name = getattr(info, "field_name", "listen")
        for i, text in enumerate(value):
            parse_listen_address(text, f"{name}[{i}]")
        return value

    @field_validator("trusted_declarer_uids")
    @classmethod
    def _uids(cls, value: list[int]) -> list[int]:
        for i, uid in enumerate(value):
            if not 0 <= uid <= 0xFFFFFFFE:
                raise ValueError(f"'trusted_declarer_uids[{i}]': {uid} is not a uid")
        return value

    @field_validator("trusted_declarer_gids")
    @classmethod
    def _gids(cls, value: list[int | str]) -> list[int | str]:
        for i, gid in enumerate(value):
            if isinstance(gid, int) and not 0 <= gid <= 0xFFFFFFFE:
                raise ValueError(f"'trusted_declarer_gids[{i}]': {gid} is not a gid")
            if isinstance(gid, str) and not gid.strip():
                raise ValueError(f"'trusted_declarer_gids[{i}]': a group name or number")
        return value

    @field_validator("unix_socket_mode", mode="before")
    @classmethod
    def _octal_mode(cls, value: object) -> object:
        if isinstance(value, str):  # file modes are written in octal: "0660", "0o660", "660"
            text = value.strip().lower().removeprefix("0o")
            if not text or any(ch not in "01234567" for ch in text):
                raise ValueError(f"'unix_socket_mode': {value!r} is not an octal file mode")
            return int(text, 8)
        if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= 0o777:
            # YAML reads 660 as decimal 660: almost certainly an octal mode written unquoted;
            # the hint quotes it only when its digits are octal (99999 is no mode at all)
            if all(ch in "01234567" for ch in str(value)) and int(str(value), 8) <= 0o777:
                hint = f'write the octal mode as a quoted string, e.g. "0{value}"'
            else:
                hint = 'a mode is 0 to 0777 in octal, written as a quoted string, e.g. "0660"'
            raise ValueError(f"'unix_socket_mode': {value} is not a file mode; {hint}")
        return value

    @field_validator("health_listen")
    @classmethod
    def _health_address(cls, value: str | None) -> str | None:
        if value is not None:
            parse_listen_address(value, "health_listen")
        return value

    @model_validator(mode="after")
    def _derived_sizes(self) -> ServerSettings:
        # defaults that follow a smaller send limit instead of contradicting it
        if "pull_max_bytes" not in self.model_fields_set:
            cap = min(DEFAULT_PULL_MAX_ANSWER_BYTES, self.max_send_message_bytes - ENVELOPE_BYTES)
            object.__setattr__(self, "pull_max_bytes", max(cap, self.pull_default_max_bytes))
        if "pull_inflight_bytes" not in self.model_fields_set:
            budget = max(DEFAULT_PULL_INFLIGHT_BYTES, self.pull_max_bytes)
            object.__setattr__(self, "pull_inflight_bytes", budget)
        return self

    @model_validator(mode="after")
    def _distinct_addresses(self) -> ServerSettings:
        # One address twice would fail at bind time as "in use by another process", when the
        # other process is this one; say so before anything starts. TCP port 0 is a fresh port
        # each time, never a clash.
        named = [(f"listen[{i}]", a) for i, a in enumerate(self.listen)]
        named += [(f"profiler_listen[{i}]", a) for i, a in enumerate(self.profiler_listen)]
        if self.health_listen is not None:
            named.append(("health_listen", self.health_listen))
        first: dict[str, str] = {}
        for field, text in named:
            addr = parse_listen_address(text, field)
            if addr.kind != "unix" and addr.port == 0:
                continue
            target = addr.bind_target()
            if target in first:
                raise ValueError(f"'{field}': same address as 'server.{first[target]}'")
            first[target] = field
        return self

    @model_validator(mode="after")
    def _security(self) -> ServerSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            missing, given = ("tls_key_file", "tls_cert_file")
            if self.tls_cert_file is None:
                missing, given = given, missing
            raise ValueError(
                f"'{missing}': not set, but {given} is; TLS needs both "
                "(--tls-cert-file and --tls-key-file)"
            )
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("'tls_client_ca_file': mTLS needs tls_cert_file and tls_key_file")
        if self.pull_default_max_bytes > self.max_send_message_bytes - ENVELOPE_BYTES:
            raise ValueError(
                "'pull_default_max_bytes': must leave 64 KiB of max_send_message_bytes "
                "for the response envelope"
            )
        if self.pull_max_bytes > self.max_send_message_bytes - ENVELOPE_BYTES:
            raise ValueError(
                f"'pull_max_bytes': {self.pull_max_bytes} must leave 64 KiB of "
                f"max_send_message_bytes ({self.max_send_message_bytes}) for the envelope"
            )
        if self.pull_default_max_bytes > self.pull_max_bytes:
            raise ValueError(
                f"'pull_default_max_bytes': {self.pull_default_max_bytes} is more than "
                f"pull_max_bytes ({self.pull_max_bytes})"
            )
        if self.pull_inflight_bytes < self.pull_max_bytes:
            raise ValueError(
                f"'pull_inflight_bytes': {self.pull_inflight_bytes} is less than one answer "
                f"of pull_max_bytes ({self.pull_max_bytes})"
            )
        for name in ("listen", "profiler_listen"):
            for i, text in enumerate(getattr(self, name)):
                self.check_listener(parse_listen_address(text, f"{name}[{i}]"), f"{name}[{i}]")
        return self

    @property
    def tls(self) -> bool:
        """True when TCP listeners use TLS."""
        return self.tls_cert_file is not None

    @property
    def serves_profiler_on_listen(self) -> bool:
        """True when the profiler service shares the ``listen`` listeners."""
        return not self.profiler_listen

    @property
    def max_request_elements(self) -> int:
        """Repeated elements one request may hold (see ``max_receive_message_bytes``)."""
        return self.max_receive_message_bytes // REQUEST_BYTES_PER_ELEMENT

    @property
    def declare_authenticated(self) -> bool:
        """True when TCP callers of the profiler service must prove who they are (token/mTLS)."""
        return self.declare_token_file is not None or self.tls_client_ca_file is not None

    def check_listener(self, addr: ListenAddress, field: str) -> None:
        """Apply the security rules to one listener of ``listen`` or ``profiler_listen``.

        Raises:
            ValueError: ``'<field>': ...`` naming what is missing and the settings that fix it.

        """
        if addr.kind == "unix":
            return  # its file mode says who may connect; SO_PEERCRED who may declare what
        if not addr.loopback and not self.tls and not self.allow_insecure_listen:
            raise ValueError(
                f"'{field}': {addr.text} is not loopback; serve TLS (server.tls_cert_file and "
                "server.tls_key_file: --tls-cert-file/--tls-key-file), or, on a trusted network, "
                "set server.allow_insecure_listen (--allow-insecure-listen)"
            )
        profiler_here = field.startswith("profiler_listen") or self.serves_profiler_on_listen
        if profiler_here and not self.declare_authenticated:
            if self.allow_unauthenticated_declare:
                return
            who = "every local user" if addr.loopback else "anyone who can connect"
            raise ValueError(
                f"'{field}': the profiler service on TCP {addr.text} would let {who} declare "
                "any process's identity; serve it on a unix socket (server.profiler_listen, "
                "the default), set server.declare_token_file (--declare-token-file) or "
                "server.tls_client_ca_file (mTLS), or, on a single-user host you trust, set "
                "server.allow_unauthenticated_declare (--allow-unauthenticated-declare)"
            )
