"""``SidecarServer``: the gRPC servers of the sidecar, assembled from :class:`ServerSettings`.

Up to three ``grpc.Server`` objects, because grpcio serves every registered service on every
port of a server:

* **main** (``listen``): ``MetricsPullService``, ``LogsPullService`` (when the sidecar keeps a
  log store of GPU events), ``ProfilerIntegrationService`` (unless ``profiler_listen`` is set),
  health, reflection, and whatever :meth:`SidecarServer.add_service` adds (go-plugin's
  ``plugin.GRPCController`` and ``plugin.GRPCStdio``);
* **profiler** (``profiler_listen``, optional): ``ProfilerIntegrationService``, health, reflection;
* **health** (``health_listen``, optional): ``grpc.health.v1.Health`` only, plaintext, no tokens.

The first two share one budget of calls being read, whatever the number of listeners: one
thread pool of ``unary_workers`` threads for their unary calls (grpcio's server never shuts down
a pool it was given: ``grpc._server`` only submits to it, so the sidecar shuts it down once both
servers have stopped), and one :class:`~gpumetrics.service.gate.StreamTable` of per-service
stream slots on threads of their own, which their
:class:`~gpumetrics.service.gate.Gatekeeper` s (tokens, stream slots, malformed and oversized
requests) share. HTTP/2 BDP probing is off on every server (``grpc.http2.bdp_probe``), so the
request of a call that waits for a thread stays unread beyond the 64 KiB stream window: with
it on, gRPC core widens the window and buffers the whole message of every queued call (4 MiB
each, measured), however few threads read. The health listener keeps two threads of its own, so
probes are answered while the others are busy.

A unix socket that serves the profiler service is fronted by a
:class:`~gpumetrics.service.peercred.PeerCredRelay`: the relay owns the configured socket,
records each connection's ``SO_PEERCRED`` and relays it to the server's private socket, so the
profiler servicer knows each caller's uid (:mod:`gpumetrics.service.declarers`).
Collaborators are passed in; nothing is global, so tests and the go-plugin mode build their own.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2_grpc

from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry
from gpumetrics.service.auth import AuthPolicy, TokenAuth, read_token_file
from gpumetrics.service.declarers import DeclarePolicy, Observation
from gpumetrics.service.errors import SettingError
from gpumetrics.service.gate import Gatekeeper, StreamTable, join_pool
from gpumetrics.service.health import SidecarHealth
from gpumetrics.service.inflight import InflightBudget
from gpumetrics.service.logs_pull import LogsPullServicer
from gpumetrics.service.names import (
    HEALTH_SERVICE,
    LOGS_PULL_SERVICE,
    PROFILER_SERVICE,
    PULL_SERVICE,
    REFLECTION_SERVICE,
    REFLECTION_V1_SERVICE,
)
from gpumetrics.service.peercred import ConnectionLimit, PeerCredentials, PeerCredRelay
from gpumetrics.service.profiler import DeclaredStoreAPI, ProfilerServicer
from gpumetrics.service.pull import PullServicer, add_pull_servicer
from gpumetrics.service.settings import (
    ListenAddress,
    ServerSettings,
    default_profiler_socket,
    parse_listen_address,
)
from gpumetrics.service.tls import server_credentials
from gpumetrics.store import BatchStore
from gpumetrics.v1 import logs_pull_pb2_grpc, profiler_pb2_grpc

log = logging.getLogger(__name__)

_BASE_POLICIES = {
    PULL_SERVICE: AuthPolicy.PULL,
    LOGS_PULL_SERVICE: AuthPolicy.PULL,
    PROFILER_SERVICE: AuthPolicy.DECLARE,
    HEALTH_SERVICE: AuthPolicy.NONE,
    REFLECTION_SERVICE: AuthPolicy.ANY,
    REFLECTION_V1_SERVICE: AuthPolicy.ANY,
}
_HEALTH_WORKERS = 2
_SAME_SLOTS = {REFLECTION_V1_SERVICE: REFLECTION_SERVICE}
"""Services whose streams count against another's slots: reflection v1 is v1alpha's servicer."""

JOIN_TIMEOUT_S = 1.0
"""The most :meth:`SidecarServer.stop` waits, after the servers stopped, for their call threads
to end (they end as soon as their cancelled calls return)."""


@dataclass(frozen=True)
class BoundAddresses:
    """Addresses a client can dial (real ports when ``:0`` was configured).

    TCP as ``host:port`` (``[v6]:port``), unix sockets as ``unix:///abs/path``.
    """

    listen: tuple[str, ...] = ()
    profiler_listen: tuple[str, ...] = ()
    health_listen: tuple[str, ...] = ()


@dataclass
class _Group:
    """One grpc.Server and what it serves."""

    role: str
    server: grpc.Server
    gate: Gatekeeper
    services: list[str]
    bound: list[str] = field(default_factory=list)
    sockets: list[str] = field(default_factory=list)


class SidecarServer:
    """The sidecar's gRPC servers.

    Args:
        settings: validated :class:`ServerSettings`.
        store: the batch store the pull service serves.
        declared: the declared store the profiler service feeds.
        health: health state shared by every listener (the caller marks it ready).
        telemetry: self-telemetry for the store-facing servicers and the gatekeepers.
        logs_store: the log store of GPU events, served by ``LogsPullService``; None: not
            served (the service answers UNIMPLEMENTED).
        proc_root: where the owner of a declared pid is read (``identity.proc_root``).
        observation: the identity package's view of a process, for the declarations of peers
            that are not trusted (:class:`~gpumetrics.service.declarers.Observation`); None:
            such a peer's resource may hold only its own ``process.pid``.

    Raises:
        SettingError: naming the setting when a token or TLS file cannot be used, or a
            ``trusted_declarer_gids`` group does not exist.

    Lifecycle: ``add_service``/``add_listener`` (optional) → :meth:`start` → :meth:`stop`.

    """

    def __init__(
        self,
        settings: ServerSettings,
        store: BatchStore,
        declared: DeclaredStoreAPI,
        health: SidecarHealth,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        logs_store: BatchStore | None = None,
        proc_root: str = "/proc",
        observation: Observation | None = None,
    ) -> None:
        self.settings = settings
        self.health = health
        self._telemetry = telemetry
        pull_tokens = (
            read_token_file(settings.pull_token_file, "pull_token_file")
            if settings.pull_token_file
            else ()
        )
        declare_tokens = (
            read_token_file(settings.declare_token_file, "declare_token_file")
            if settings.declare_token_file
            else ()
        )
        self._auth = TokenAuth(pull_tokens, declare_tokens)
        self._credentials = server_credentials(settings)
        self._lock = threading.Lock()
        self._started = self._stopped = False
        budget = InflightBudget(settings.pull_inflight_bytes)  # shared by every signal
        pull = self.pull = PullServicer(
            store,
            telemetry,
            default_max_bytes=settings.pull_default_max_bytes,
            max_bytes_limit=settings.pull_max_bytes,
            budget=budget,
        )
        self._relays: list[PeerCredRelay] = []
        self._relay_limit = ConnectionLimit()  # every relayed socket together
        # One budget of calls being read for the main and profiler servers together.
        self._pool = futures.ThreadPoolExecutor(
            max_workers=settings.unary_workers, thread_name_prefix="grpc-unary"
        )
        self._streams = StreamTable(settings.max_streams, _SAME_SLOTS)
        self._health_pool = futures.ThreadPoolExecutor(
            max_workers=_HEALTH_WORKERS, thread_name_prefix="grpc-health"
        )
        self._health_streams = StreamTable(1)
        self._socket_gid = _group_id(settings.unix_socket_group, "unix_socket_group")
        trusted_gids = [
            _group_id(g, f"trusted_declarer_gids[{i}]")
            for i, g in enumerate(settings.trusted_declarer_gids)
        ]
        policy = DeclarePolicy(
            self._peer,
            settings.trusted_declarer_uids,
            [g for g in trusted_gids if g is not None],
            proc_root=proc_root,
            observation=observation,
            telemetry=telemetry,
        )
        profiler = ProfilerServicer(
            declared, telemetry, settings.max_declarations_per_request, policy
        )

        self._main = self._group("listen")
        add_pull_servicer(pull, self._main.server)
        self._main.services.append(PULL_SERVICE)
        if logs_store is not None:
            logs = LogsPullServicer(
                logs_store,
                telemetry,
                default_max_bytes=settings.pull_default_max_bytes,
                max_bytes_limit=settings.pull_max_bytes,
                budget=budget,
            )
            logs_pull_pb2_grpc.add_LogsPullServiceServicer_to_server(logs, self._main.server)
            self._main.services.append(LOGS_PULL_SERVICE)
            health.add_service(LOGS_PULL_SERVICE)
        self._profiler: _Group | None = None
        target = self._main
        if settings.profiler_listen:
            target = self._profiler = self._group("profiler_listen")
        profiler_pb2_grpc.add_ProfilerIntegrationServiceServicer_to_server(profiler, target.server)
        target.services.append(PROFILER_SERVICE)
        self._health_only: _Group | None = None
        if settings.health_listen is not None:
            self._health_only = self._group("health_listen", health_only=True)

    # -- construction -----------------------------------------------------------------------------

    def _options(self, health_only: bool) -> list[tuple[str, int]]:
        s = self.settings
        receive = 64 * 1024 if health_only else s.max_receive_message_bytes
        return [
            ("grpc.max_receive_message_length", receive),
            ("grpc.max_send_message_length", s.max_send_message_bytes),
            ("grpc.so_reuseport", 0),  # a second server on the same port fails instead of sharing
            ("grpc.keepalive_time_ms", int(s.keepalive_time_s * 1000)),
            ("grpc.keepalive_timeout_ms", 20_000),
            # a queued call's request waits in its 64 KiB stream window (see the module docstring)
            ("grpc.http2.bdp_probe", 0),
        ]

    def _group(self, role: str, health_only: bool = False) -> _Group:
        s = self.settings
        if health_only:
            gate = Gatekeeper(
                self._auth, {HEALTH_SERVICE: AuthPolicy.NONE}, self._health_streams, self._telemetry
            )
            pool, most = self._health_pool, 4 * _HEALTH_WORKERS
        else:
            gate = Gatekeeper(
                self._auth,
                _BASE_POLICIES,
                self._streams,
                self._telemetry,
                max_elements=s.max_request_elements,
            )
            pool, most = self._pool, s.max_concurrent_rpcs
        server = grpc.server(
            pool,
            interceptors=[gate],
            options=self._options(health_only),
            maximum_concurrent_rpcs=most,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health.servicer, server)
        return _Group(role, server, gate, [HEALTH_SERVICE])

    def add_service(
        self,
        register: Callable[[grpc.Server], None],
        service_names: Sequence[str],
        policy: AuthPolicy = AuthPolicy.ANY,
    ) -> None:
        """Serve more services on the main listeners (before :meth:`start`).

        Args:
            register: called with the main ``grpc.Server`` (e.g. a generated
                ``add_XServicer_to_server`` bound to a servicer).
            service_names: the full names it registers (for reflection and the auth policy).
            policy: which token its calls need (go-plugin's services: :attr:`AuthPolicy.ANY`,
                or :attr:`AuthPolicy.NONE` when the host sends no token).

        Raises:
            RuntimeError: after :meth:`start`.

        """
        with self._lock:
            if self._started:
                raise RuntimeError("add_service: the server has already started")
            register(self._main.server)
            for name in service_names:
                self._main.services.append(name)
                self._main.gate.set_policy(name, policy)

    def add_listener(self, address: str, role: str = "listen") -> str:
        """Bind one more listener of ``role`` (``listen`` or ``profiler_listen``) now.

        For the go-plugin mode, which chooses its own socket or port (a failed bind raises, so
        the caller can try the next port). The security rules of :class:`ServerSettings` apply.

        Returns:
            The dialable address (real port for ``:0``).

        Raises:
            ValueError: naming ``role`` for a bad or insecure address.
            ListenError: (a ``RuntimeError``) the bind failed: the address is in use, or not
                this machine's.
            RuntimeError: the server has already started.

        """
        with self._lock:
            if self._started:
                raise RuntimeError("add_listener: the server has already started")
            group = self._main if role == "listen" or self._profiler is None else self._profiler
            addr = parse_listen_address(address, role)
            self.settings.check_listener(addr, role)
            return self._bind(group, addr, role)

    def _bind(self, group: _Group, addr: ListenAddress, field: str) -> str:
        try:
            return self._bind_one(group, addr, field)
        except ListenError:
            raise
        except RuntimeError as exc:  # grpc: "Failed to bind to address ...; set GRPC_VERBOSITY"
            reason = str(exc).split(";", 1)[0]  # the rest is grpc's GRPC_VERBOSITY hint
            raise ListenError(field, f"cannot listen on {addr.text}: {reason}") from None

    def _serves_profiler(self, group: _Group) -> bool:
        return group is self._profiler or (group is self._main and self._profiler is None)

    def _peer(self, peer: str) -> PeerCredentials | None:
        for relay in self._relays:
            creds = relay.lookup(peer)
            if creds is not None:
                return creds
        return None

    def _bind_one(self, group: _Group, addr: ListenAddress, field: str) -> str:
        target = addr.bind_target()
        if addr.kind == "unix":
            parent = os.path.dirname(addr.path)
            if addr.path == default_profiler_socket():
                _make_runtime_dir(parent, field)
            if not os.path.isdir(parent):
                raise SettingError(field, f"directory {parent!r} does not exist")
            _claim_socket_path(addr.path, field)
            if self._serves_profiler(group):
                self._bind_relayed(group, addr.path, field)
            else:
                old = os.umask(0o177)  # process-wide, but only at start-up: never wider than 0600
                try:
                    group.server.add_insecure_port(target)
                finally:
                    os.umask(old)
                self._secure_socket(addr.path, field)
            group.sockets.append(addr.path)
            port = 0
        else:
            _probe_tcp(addr, field)
            if self._credentials is not None and group.role != "health_listen":
                port = group.server.add_secure_port(target, self._credentials)
            else:
                port = group.server.add_insecure_port(target)
        dial = addr.dial_target(port)
        group.bound.append(dial)
        return dial

    def _bind_relayed(self, group: _Group, path: str, field: str) -> None:
        """Bind ``path`` through a :class:`PeerCredRelay` (its peers' credentials are known)."""
        try:
            relay = PeerCredRelay(
                path,
                self.settings.unix_socket_mode,
                self._socket_gid,
                telemetry=self._telemetry,
                limit=self._relay_limit,
            )
        except OSError as exc:
            raise ListenError(
                field, f"cannot listen on unix:{path}: {exc.strerror or exc}"
            ) from None
        self._relays.append(relay)
        old = os.umask(0o177)
        try:
            group.server.add_insecure_port(relay.target)
        finally:
            os.umask(old)
        log.debug("%s: unix socket %s (peer credentials) mode %o", field, path,
                  stat.S_IMODE(os.stat(path).st_mode))  # fmt: skip

    def _secure_socket(self, path: str, role: str) -> None:
        if self._socket_gid is not None:
            try:
                os.chown(path, -1, self._socket_gid)
            except OSError as exc:
                raise SettingError(
                    "unix_socket_group",
                    f"cannot give {path!r} to {self.settings.unix_socket_group!r}: {exc}",
                ) from None
        os.chmod(path, self.settings.unix_socket_mode)
        log.debug("%s: unix socket %s mode %o", role, path, stat.S_IMODE(os.stat(path).st_mode))

    # -- lifecycle --------------------------------------------------------------------------------

    def _groups(self) -> Iterable[_Group]:
        return [g for g in (self._main, self._profiler, self._health_only) if g is not None]

    def start(self) -> None:
        """Bind the configured listeners, register reflection and start serving.

        On failure nothing is left bound (sockets removed) and the server cannot be started again.

        Raises:
            ListenError: (a ``RuntimeError``) a bind failed, naming the listener's field.
            RuntimeError: no listener serves the pull service.
            SettingError: naming the field of a listener that cannot be used.

        """
        with self._lock:
            if self._started or self._stopped:
                raise RuntimeError("start: already started or stopped")
            try:
                self._start_locked()
            except BaseException:
                self._stopped = True
                for g in self._groups():
                    g.server.stop(0).wait()  # before their pools are shut down
                for relay in self._relays:
                    relay.stop()
                self._release_threads(time.monotonic() + JOIN_TIMEOUT_S)
                self._remove_sockets()
                raise
            self._started = True
        log.debug("serving: %s", self.addresses)  # the runtime's start-up summary names them

    def _start_locked(self) -> None:
        s = self.settings
        for role, texts in (("listen", s.listen), ("profiler_listen", s.profiler_listen)):
            group = self._main if role == "listen" else self._profiler
            for i, text in enumerate(texts):
                assert group is not None
                field = f"{role}[{i}]"
                self._bind(group, parse_listen_address(text, field), field)
        if self._health_only is not None and s.health_listen is not None:
            address = parse_listen_address(s.health_listen, "health_listen")
            self._bind(self._health_only, address, "health_listen")
        if not self._main.bound:
            raise RuntimeError("'listen': no listener configured for the pull service")
        if s.reflection:  # grpcio-reflection is imported only when reflection is on
            from gpumetrics.service.reflection import enable_reflection

            for g in (self._main, self._profiler):
                if g is not None:
                    enable_reflection(g.server, g.services)
        for g in self._groups():
            g.server.start()
        for relay in self._relays:
            relay.start()

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving: health NOT_SERVING first, then stop accepting, then finish or cancel.

        Calls in flight get ``grace`` seconds (None: wait for all) before they are cancelled; the
        health-only listener stops last so probes see NOT_SERVING until the end. Then the
        threads of every call pool (unary and streams) are joined, for at most
        :data:`JOIN_TIMEOUT_S` more, so a stopped server leaves no thread running. Unix socket
        files are removed. Idempotent; safe before :meth:`start`.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self.health.enter_graceful_shutdown()
        for relay in self._relays:
            relay.stop_accepting()  # like the servers: no new connection, calls in flight go on
        events = [g.server.stop(grace) for g in (self._main, self._profiler) if g is not None]
        for event in events:
            event.wait()
        for relay in self._relays:
            relay.stop()
        if self._health_only is not None:
            self._health_only.server.stop(0).wait()
        self._release_threads(time.monotonic() + JOIN_TIMEOUT_S)
        self._remove_sockets()

    def _release_threads(self, deadline: float | None) -> bool:
        """End the pools' threads once their calls have (every server has stopped).

        A stopped grpc.Server leaves its pool alone (``grpc._server`` never shuts it down), so
        the pools shared by the main and profiler servers are shut here, after both, and their
        threads joined by ``deadline`` (``time.monotonic()``; None: not waited for).

        Returns:
            True when every pool and stream thread has ended.

        """
        ended = [join_pool(pool, deadline) for pool in (self._pool, self._health_pool)]
        ended += [t.close(deadline) for t in (self._streams, self._health_streams)]
        return all(ended)

    def _remove_sockets(self) -> None:
        for g in self._groups():
            for path in g.sockets:
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        os.unlink(path)
                except FileNotFoundError:
                    pass

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Block until the main server has stopped; True if it did within ``timeout`` s."""
        timed_out = self._main.server.wait_for_termination(timeout)
        return not timed_out

    @property
    def addresses(self) -> BoundAddresses:
        """The bound addresses, by role."""
        return BoundAddresses(
            listen=tuple(self._main.bound),
            profiler_listen=tuple(self._profiler.bound) if self._profiler else (),
            health_listen=tuple(self._health_only.bound) if self._health_only else (),
        )

    def wait_streams_closed(self, timeout: float) -> bool:
        """Wait until no streaming call is open on the main and profiler listeners.

        Returns:
            False when ``timeout`` seconds passed first.

        """
        return self._streams.wait_closed(timeout)

    @property
    def open_streams(self) -> int:
        """Streaming calls open now on the main and profiler listeners."""
        return self._streams.open


class ListenError(RuntimeError):
    """A listener could not be bound (address in use, permission, a live unix socket).

    Attributes:
        setting: the listener's field (``listen[0]``, ``profiler_listen[0]``, ``health_listen``).
        reason: why, and what to do.

    ``str()`` is ``'<setting>': <reason>``; the runtime reports it as a configuration error.

    """

    def __init__(self, setting: str, reason: str) -> None:
        self.setting = setting
        self.reason = reason
        super().__init__(f"'{setting}': {reason}")


def _group_id(group: int | str | None, field: str) -> int | None:
    """Return the gid of a group given by number or name (None stays None).

    Raises:
        SettingError: naming ``field`` when no group has that name.

    """
    if group is None:
        return None
    if isinstance(group, int):
        return group
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise SettingError(field, f"no group named {group!r}") from None


def _make_runtime_dir(path: str, field: str) -> None:
    """Make the default socket's directory (:func:`default_profiler_socket`) if it is missing.

    ``/run/gpumetrics`` gets mode 0711 (as containerd's ``/run/containerd``): anyone may pass
    through to the socket, whose own mode decides who may connect. A per-user directory
    (``$XDG_RUNTIME_DIR/gpumetrics``, ``/tmp/gpumetrics-<uid>``) gets 0700. One in ``/tmp``
    that exists already must be this user's and writable by nobody else: another user could
    have made it first.

    Raises:
        SettingError: naming ``field``, when the directory cannot be made or is not safe.

    """
    private = os.geteuid() != 0
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        os.mkdir(path, 0o700 if private else 0o711)
        os.chmod(path, 0o700 if private else 0o711)  # whatever the umask
    except FileExistsError:
        pass
    except OSError as exc:
        raise SettingError(
            field, f"cannot make directory {path!r}: {exc.strerror or exc}; run as root or "
            "set server.profiler_listen (--profiler-listen unix:/a/directory/of/yours/p.sock)"
        ) from None  # fmt: skip
    if path.startswith("/tmp/"):  # noqa: S108 - the fallback of default_profiler_socket
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise SettingError(
                field, f"{path!r} is not a directory of this user's that only it may write to"
            )


_BIND_ERRORS = {
    errno.EADDRINUSE: "is in use by another process; stop it or choose another port",
    errno.EACCES: "needs privileges (ports below 1024); choose a port of 1024 or more",
    errno.EADDRNOTAVAIL: "is not an address of this machine",
}


def _probe_tcp(addr: ListenAddress, field: str) -> None:
    """Bind ``addr`` once with the socket options grpc uses, so a port in use is one clear line.

    grpc would otherwise log a raw ``add_port.cc`` error and raise "Failed to bind ... set
    GRPC_VERBOSITY=debug". Port 0 is not probed (any free port is taken). The probe socket is
    closed at once and never listens; a port taken in between still fails in grpc's own bind.

    Raises:
        ListenError: naming ``field``, for an address in use, privileged, or not this machine's.

    """
    if addr.port == 0:
        return
    try:
        infos = socket.getaddrinfo(
            addr.host, addr.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise ListenError(field, f"cannot resolve {addr.host!r}: {exc.strerror}") from None
    unusable: list[OSError] = []
    for family, kind, proto, _, sockaddr in infos:
        probe = socket.socket(family, kind, proto)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc does
            probe.bind(sockaddr)
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL:  # in use, or privileged: whatever the family
                raise ListenError(field, _bind_reason(addr, exc)) from None
            unusable.append(exc)  # e.g. ::1 of "localhost" on a host without IPv6
        finally:
            probe.close()
    if unusable and len(unusable) == len(infos):
        raise ListenError(field, _bind_reason(addr, unusable[0]))


def _bind_reason(addr: ListenAddress, exc: OSError) -> str:
    why = _BIND_ERRORS.get(exc.errno or 0, f"cannot be bound: {exc.strerror or exc}")
    return f"{addr.text} {why}"


def _claim_socket_path(path: str, role: str, timeout_s: float = 1.0) -> None:
    """Make ``path`` free for a new unix socket, refusing to take over a live one.

    grpc replaces whatever socket file is at the path, so a second sidecar on the same path would
    silently take the first one's clients (and remove its socket when it exits). A socket file
    that accepts a connection belongs to a running server: refuse. One that refuses (ECONNREFUSED:
    nobody listens; a sidecar that was killed) is stale: remove it.

    Raises:
        ListenError: naming ``role``, when a live server answers on ``path``.
        SettingError: naming ``role``, when ``path`` exists and is not a socket.

    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SettingError(role, f"{path!r} exists and is not a unix socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout_s)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        log.info("%s: removing stale unix socket %s (nothing listens on it)", role, path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except OSError as exc:
        raise ListenError(role, f"cannot check unix socket {path!r}: {exc}") from None
    finally:
        probe.close()
    raise ListenError(
        role, f"unix socket {path!r} is in use by a running server; stop it or choose another path"
    )
