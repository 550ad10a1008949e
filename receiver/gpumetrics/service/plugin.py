"""go-plugin mode: what the sidecar does when an OpenTelemetry Collector starts it as a plugin.

Implements the plugin side of HashiCorp go-plugin's subprocess protocol
(https://github.com/hashicorp/go-plugin/blob/main/docs/guide-plugin-write-non-go.md,
https://github.com/hashicorp/go-plugin/blob/main/docs/internals.md, and go-plugin's
``client.go`` and ``server.go``), with the handshake values of ``docs/architecture.md``:

* the magic cookie :data:`COOKIE_KEY` = :data:`COOKIE_VALUE` (a UX check, not security);
* app protocol version negotiation with ``PLUGIN_PROTOCOL_VERSIONS`` (highest shared; else our
  lowest, so the host can print a readable error — go-plugin ``server.go`` ``protocolVersion``);
* a listener: a unix socket in a private directory (``PLUGIN_UNIX_SOCKET_DIR`` honoured,
  ``PLUGIN_UNIX_SOCKET_GROUP`` chown + ``0660``), or TCP on ``127.0.0.1`` within
  ``PLUGIN_MIN_PORT..PLUGIN_MAX_PORT``;
* the handshake line ``1|<ver>|<unix|tcp>|<addr>|grpc`` (field 7 ``false`` only when
  ``PLUGIN_MULTIPLEX_GRPC`` is set);
* go-plugin's own services ``plugin.GRPCController/Shutdown`` and ``plugin.GRPCStdio/StreamStdio``,
  served with generic handlers and hand-encoded messages (go-plugin's ``.proto`` files are not
  copied into this repository);

**AutoMTLS is not supported.** go-plugin's host generates an ECDSA **P-521** client certificate;
grpcio's BoringSSL (checked with grpcio 1.85.1) does not offer ECDSA+SHA512 in its
CertificateRequest, so the TLS handshake fails with ``NO_COMMON_SIGNATURE_ALGORITHMS``
(go-plugin ``mtls.go`` generates the P-521 key). When ``PLUGIN_CLIENT_CERT`` is set the sidecar
refuses to start with :class:`AutoMTLSUnsupportedError` instead of sending a certificate field
the host could not use.
The private unix socket directory (``0700``) is the access control, as for Go plugins.
"""

from __future__ import annotations

import grp
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import grpc

from gpumetrics.wire import len_field, varint_field

__all__ = [
    "APP_PROTOCOL_VERSIONS",
    "COOKIE_KEY",
    "COOKIE_VALUE",
    "CORE_PROTOCOL_VERSION",
    "HEALTH_SERVICE_NAME",
    "AutoMTLSUnsupportedError",
    "CookieError",
    "PluginEnvironment",
    "PluginError",
    "PluginListener",
    "PluginServices",
    "bind_tcp",
    "bind_unix",
    "encode_stdio_data",
    "handshake_line",
    "negotiate_version",
]

log = logging.getLogger(__name__)

COOKIE_KEY = "GPUMETRICS_PLUGIN_MAGIC_COOKIE"
"""Name of the magic-cookie variable the go-plugin host sets (``docs/architecture.md``)."""
COOKIE_VALUE = "50d8e6e2c9cf731147e4697d9b4853ee"
"""Value of the magic cookie (``docs/architecture.md``)."""
CORE_PROTOCOL_VERSION = 1
"""go-plugin's core protocol version, handshake field 1 (``server.go`` ``CoreProtocolVersion``)."""
APP_PROTOCOL_VERSIONS: tuple[int, ...] = (1,)
"""App protocol versions this sidecar serves (handshake field 2)."""
HEALTH_SERVICE_NAME = "plugin"
"""Health service name go-plugin's ``Ping`` checks (``GRPCServiceName``)."""

PLUGIN_PROTOCOL_VERSIONS = "PLUGIN_PROTOCOL_VERSIONS"
"""Comma-separated app versions the host accepts, in no fixed order (e.g. ``1`` or ``5,6``)."""
PLUGIN_MIN_PORT = "PLUGIN_MIN_PORT"
"""Lowest TCP port to try (host default 10000); unset means 0 (an ephemeral port)."""
PLUGIN_MAX_PORT = "PLUGIN_MAX_PORT"
"""Highest TCP port to try (host default 25000); unset means 0 (an ephemeral port)."""
PLUGIN_CLIENT_CERT = "PLUGIN_CLIENT_CERT"
"""The host's AutoMTLS client certificate (PEM). Its presence makes the sidecar refuse to start."""
PLUGIN_MULTIPLEX_GRPC = "PLUGIN_MULTIPLEX_GRPC"
"""Set when the host asks for broker multiplexing; answered with handshake field 7 ``false``."""
PLUGIN_UNIX_SOCKET_DIR = "PLUGIN_UNIX_SOCKET_DIR"
"""Directory in which to create the unix socket's private directory (default: the system temp)."""
PLUGIN_UNIX_SOCKET_GROUP = "PLUGIN_UNIX_SOCKET_GROUP"
"""Group name or gid the socket is chowned to, with mode ``0660``."""

_NOT_A_PLUGIN = (
    "This binary is a plugin of the gpumetrics OpenTelemetry Collector receiver and was started "
    "in go-plugin mode, but {problem}. Run it directly with `gpumetrics serve` (without the "
    f"{COOKIE_KEY} variable), or let the collector's gpumetrics receiver start it."
)


class PluginError(Exception):
    """go-plugin mode cannot start; the message says what to fix (printed to stderr, exit 1)."""


class CookieError(PluginError):
    """The magic-cookie variable is missing or has the wrong value."""


class AutoMTLSUnsupportedError(PluginError):
    """The host asked for AutoMTLS (``PLUGIN_CLIENT_CERT``), which grpcio cannot serve."""


def _env_int(environ: Mapping[str, str], name: str) -> int:
    raw = environ.get(name, "")
    if raw == "":
        return 0
    try:
        value = int(raw.strip())
    except ValueError:
        raise PluginError(f"{name}={raw!r}: must be an integer port number") from None
    if not 0 <= value <= 65535:
        raise PluginError(f"{name}={raw!r}: must be within 0..65535")
    return value


def negotiate_version(
    offered: str | None, supported: tuple[int, ...] = APP_PROTOCOL_VERSIONS
) -> int:
    """Pick the app protocol version from the host's ``PLUGIN_PROTOCOL_VERSIONS`` value.

    Returns the highest version in both lists; when none is shared (or the host sent none),
    our lowest version, so the host prints its own "incompatible API version" error
    (go-plugin ``server.go`` ``protocolVersion``). Items that are not integers are skipped
    with a warning, as go-plugin does.

    >>> negotiate_version("5,1,2", (1, 2))
    2
    >>> negotiate_version("7", (1, 2))
    1
    """
    wanted: set[int] = set()
    for item in (offered or "").split(","):
        if not item.strip():
            continue
        try:
            wanted.add(int(item.strip()))
        except ValueError:
            log.warning("%s: ignoring %r, not an integer", PLUGIN_PROTOCOL_VERSIONS, item)
    shared = wanted.intersection(supported)
    return max(shared) if shared else min(supported)


@dataclass(frozen=True)
class PluginEnvironment:
    """Everything the go-plugin host told the sidecar through its environment, validated.

    Attributes:
        app_version: the negotiated app protocol version.
        min_port / max_port: the TCP port range (both 0: an ephemeral port).
        socket_dir: where to create the private socket directory, or None for the temp dir.
        socket_group: gid the socket is given, or None.
        multiplex: True when the host set ``PLUGIN_MULTIPLEX_GRPC``.

    """

    app_version: int
    min_port: int = 0
    max_port: int = 0
    socket_dir: str | None = None
    socket_group: int | None = None
    multiplex: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> PluginEnvironment:
        """Check the cookie and parse the host's variables.

        Raises:
            CookieError: ``COOKIE_KEY`` missing or wrong.
            AutoMTLSUnsupportedError: ``PLUGIN_CLIENT_CERT`` is set.
            PluginError: a bad port range or socket group (the message names the variable).

        """
        cookie = environ.get(COOKIE_KEY)
        if cookie is None:
            raise CookieError(_NOT_A_PLUGIN.format(problem=f"the {COOKIE_KEY} variable is not set"))
        if cookie != COOKIE_VALUE:
            raise CookieError(_NOT_A_PLUGIN.format(problem=f"{COOKIE_KEY} has the wrong value"))
        if environ.get(PLUGIN_CLIENT_CERT):
            raise AutoMTLSUnsupportedError(
                f"{PLUGIN_CLIENT_CERT} is set: the host asked for go-plugin AutoMTLS, which this "
                "sidecar does not support (go-plugin's P-521 certificates are refused by grpcio's "
                "BoringSSL). Leave AutoMTLS off in the receiver; the plugin's unix socket lives in "
                "a private 0700 directory."
            )
        min_port = _env_int(environ, PLUGIN_MIN_PORT)
        max_port = _env_int(environ, PLUGIN_MAX_PORT)
        if min_port > max_port:
            raise PluginError(
                f"{PLUGIN_MIN_PORT} value of {min_port} is greater than "
                f"{PLUGIN_MAX_PORT} value of {max_port}"
            )
        group = environ.get(PLUGIN_UNIX_SOCKET_GROUP) or None
        return cls(
            app_version=negotiate_version(environ.get(PLUGIN_PROTOCOL_VERSIONS)),
            min_port=min_port,
            max_port=max_port,
            socket_dir=environ.get(PLUGIN_UNIX_SOCKET_DIR) or None,
            socket_group=_resolve_group(group) if group is not None else None,
            multiplex=bool(environ.get(PLUGIN_MULTIPLEX_GRPC)),
        )


def _resolve_group(group: str) -> int:
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise PluginError(f"{PLUGIN_UNIX_SOCKET_GROUP}={group!r}: no such group") from None


@dataclass
class PluginListener:
    """A bound plugin listener: ``network`` (``unix``/``tcp``) and the handshake ``address``."""

    network: str
    address: str
    private_dir: str | None = None

    def close(self) -> None:
        """Remove the private socket directory (after the server stopped); safe to call twice."""
        if self.private_dir is not None:
            shutil.rmtree(self.private_dir, ignore_errors=True)
            self.private_dir = None


AddPort = Callable[[str], "int | str"]
"""Bind one gRPC address now and return the bound port (``grpc.Server.add_insecure_port``) or the
dialable address (``SidecarServer.add_listener``); raise ``RuntimeError`` when the bind fails."""


def bind_unix(add_port: AddPort, env: PluginEnvironment) -> PluginListener:
    """Bind a unix socket in a new private directory (``0700``; ``0710`` + group with a group).

    Raises:
        PluginError: the directory or socket could not be created (names the path).

    """
    try:
        private = tempfile.mkdtemp(prefix="gpumetrics-plugin-", dir=env.socket_dir)
    except OSError as exc:
        raise PluginError(
            f"{PLUGIN_UNIX_SOCKET_DIR}={env.socket_dir!r}: cannot create a directory: {exc}"
        ) from exc
    path = os.path.join(os.path.abspath(private), "plugin.sock")
    try:
        add_port("unix:" + path)
        if env.socket_group is not None:
            os.chown(private, -1, env.socket_group)
            os.chmod(private, 0o710)
            os.chown(path, -1, env.socket_group)
            os.chmod(path, 0o660)
    except (OSError, RuntimeError) as exc:
        shutil.rmtree(private, ignore_errors=True)
        raise PluginError(f"unix socket {path}: {exc}") from exc
    return PluginListener("unix", path, private)


def bind_tcp(add_port: AddPort, env: PluginEnvironment) -> PluginListener:
    """Bind ``127.0.0.1:port`` for the first free port in ``min_port..max_port``.

    The server should be built with ``grpc.so_reuseport`` off, or two plugins could share a port.

    Raises:
        PluginError: no port in the range could be bound.

    """
    for port in range(env.min_port, env.max_port + 1):
        try:
            bound = add_port(f"127.0.0.1:{port}")
        except RuntimeError:
            continue
        if isinstance(bound, str):
            return PluginListener("tcp", bound)
        if bound:
            return PluginListener("tcp", f"127.0.0.1:{bound}")
    raise PluginError(
        f"could not bind a plugin TCP listener on 127.0.0.1 within "
        f"{PLUGIN_MIN_PORT}..{PLUGIN_MAX_PORT} = {env.min_port}..{env.max_port}"
    )


def handshake_line(app_version: int, listener: PluginListener, multiplex: bool = False) -> str:
    r"""Return the go-plugin handshake line, with its trailing newline.

    Field 6 (AutoMTLS certificate) is never sent; field 7 (``false``: no broker multiplexing) only
    when the host asked (go-plugin ``server.go``, ``PLUGIN_MULTIPLEX_GRPC``).

    >>> handshake_line(1, PluginListener("tcp", "127.0.0.1:10000"))
    '1|1|tcp|127.0.0.1:10000|grpc\n'
    >>> handshake_line(1, PluginListener("unix", "/tmp/p/plugin.sock"), multiplex=True)
    '1|1|unix|/tmp/p/plugin.sock|grpc||false\n'
    """
    fields = [
        str(CORE_PROTOCOL_VERSION),
        str(app_version),
        listener.network,
        listener.address,
        "grpc",
    ]
    if multiplex:
        fields += ["", "false"]
    return "|".join(fields) + "\n"


def encode_stdio_data(channel: int, data: bytes) -> bytes:
    """Encode go-plugin's ``StdioData{Channel channel = 1; bytes data = 2}`` by hand.

    ``channel``: 1 = STDOUT, 2 = STDERR (``grpc_stdio.proto``).
    """
    out = b""
    if channel:
        out += varint_field(1, channel)
    if data:
        out += len_field(2, data)
    return out


class PluginServices:
    """go-plugin's ``plugin.GRPCController`` and ``plugin.GRPCStdio`` as generic gRPC handlers.

    Args:
        on_shutdown: called (once per call) by ``GRPCController/Shutdown``; it must only signal
            (set an event) — the reply goes out at once and the main thread does the cleanup.

    ``StreamStdio`` sends nothing (the sidecar's stdout points at stderr) and stays open until the
    host cancels it, the server stops, or :meth:`close` is called. Each open stream holds one
    server worker thread: size the pool for it.

    """

    def __init__(self, on_shutdown: Callable[[], None]) -> None:
        self._on_shutdown = on_shutdown
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._closed = False
        self._open: set[threading.Event] = set()

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        """Return the two generic handlers, for ``server.add_generic_rpc_handlers``."""
        controller = grpc.method_handlers_generic_handler(
            "plugin.GRPCController",
            {"Shutdown": grpc.unary_unary_rpc_method_handler(self._shutdown)},
        )
        stdio = grpc.method_handlers_generic_handler(
            "plugin.GRPCStdio",
            {"StreamStdio": grpc.unary_stream_rpc_method_handler(self._stream_stdio)},
        )
        return [controller, stdio]

    def _shutdown(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        log.info("go-plugin host asked for shutdown")
        self._on_shutdown()
        return b""  # plugin.Empty

    def _stream_stdio(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        done = threading.Event()
        with self._lock:
            if self._closed:
                return
            self._open.add(done)
            self._changed.notify_all()
        try:
            if context.add_callback(done.set):
                done.wait()
        finally:
            with self._lock:
                self._open.discard(done)
                self._changed.notify_all()
        yield from ()

    def open_streams(self) -> int:
        """Return the number of ``StreamStdio`` calls currently held open."""
        with self._lock:
            return len(self._open)

    def wait_for_streams(self, count: int, timeout_s: float) -> bool:
        """Block until exactly ``count`` streams are open; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._open) == count, timeout_s)

    def close(self) -> None:
        """End every open ``StreamStdio`` (normally) and refuse new ones."""
        with self._lock:
            self._closed = True
            for event in self._open:
                event.set()
