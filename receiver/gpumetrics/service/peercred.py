"""Who is on the other end of a unix socket: ``SO_PEERCRED`` for grpcio's server.

grpcio gives a servicer no way to learn a unix-socket peer's credentials: ``context.peer()``
is ``unix:`` and ``context.auth_context()`` holds only the transport security type, with
insecure and with local (``LocalConnectionType.UDS``) credentials alike; gRPC core never calls
``getsockopt(SO_PEERCRED)`` (grpc/grpc issues #15511 and #28755), and grpcio has no server API
that takes an accepted file descriptor (C++'s ``AddInsecureChannelFromFd`` workaround).

So the sidecar accepts on the configured socket itself. :class:`PeerCredRelay` owns the
public socket (its file mode and group are the listener's), reads each connection's
``struct ucred`` (pid, uid, gid, as the kernel recorded them at ``connect``: unix(7)), and
relays the connection's bytes, untouched, to the gRPC server's private socket in a directory
only the sidecar's user can enter. The relay's side of that private connection is bound to a
name of its own (``c<n>``, never reused), which grpcio does report: a call's
``context.peer()`` is ``unix:<private dir>/c<n>``, and :meth:`PeerCredRelay.lookup` turns it
back into the credentials. The name's file is removed right after ``connect`` (the address
stays the socket's), and nobody else can connect to the private socket, so a peer name can be
neither forged nor reused.

Bounds: at most ``max_connections`` connections at once, all the relays that share one
:class:`ConnectionLimit` together (one more is closed at once and counted), and each direction
of a connection holds at most :data:`CHUNK_BYTES` in flight (the relay reads from one side only
when what it read before has been written to the other), so the relays' buffers stay below
``2 * CHUNK_BYTES * max_connections`` however many sockets they serve, plus one chunk being
copied per relay thread. One thread per relayed socket runs a ``selectors`` loop; HTTP/2
(keepalive pings included) passes through as bytes.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import shutil
import socket
import stat
import struct
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "ConnectionLimit",
    "PeerCredRelay",
    "PeerCredentials",
    "peer_credentials",
]

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
"""Most bytes one direction of a relayed connection holds in flight."""

DEFAULT_MAX_CONNECTIONS = 64
"""Connections relayed at once, every relayed socket of a sidecar together (a gRPC client
multiplexes its calls on one)."""

_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;} (unix(7))
_UNIX_PATH_MAX = 107


@dataclass(frozen=True)
class PeerCredentials:
    """The credentials of a unix-socket peer at ``connect`` time (``SO_PEERCRED``).

    Attributes:
        pid: the connecting process, in the sidecar's pid namespace (0 when it is in none the
            sidecar can see).
        uid: its effective uid, in the sidecar's user namespace.
        gid: its effective gid (supplementary groups are not part of ``SO_PEERCRED``).

    """

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """Read ``SO_PEERCRED`` of a connected unix socket.

    Raises:
        OSError: the socket is not a connected unix socket (e.g. ``ENOTCONN``).

    """
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return PeerCredentials(pid, uid, gid)


class ConnectionLimit:
    """How many connections the relays that share it serve at once (thread-safe).

    Args:
        limit: connections at once (>= 1).

    Raises:
        ValueError: ``limit`` < 1.

    """

    def __init__(self, limit: int = DEFAULT_MAX_CONNECTIONS) -> None:
        if limit < 1:
            raise ValueError(f"max_connections: must be >= 1, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._used = 0

    @property
    def used(self) -> int:
        """Connections relayed now."""
        with self._lock:
            return self._used

    def try_take(self) -> bool:
        """Take one connection; False when all are taken."""
        with self._lock:
            if self._used >= self.limit:
                return False
            self._used += 1
            return True

    def give(self) -> None:
        """Give one back."""
        with self._lock:
            self._used -= 1


class _Pair:
    """One relayed connection: the client's socket and the relay's socket to gRPC."""

    __slots__ = ("client", "upstream", "pending", "eof", "peer", "closed")

    def __init__(self, client: socket.socket, upstream: socket.socket, peer: str) -> None:
        self.client = client
        self.upstream = upstream
        self.peer = peer
        self.closed = False
        self.pending: dict[socket.socket, bytes] = {client: b"", upstream: b""}
        """Bytes waiting to be written *to* each socket."""
        self.eof: set[socket.socket] = set()
        """Sockets that ended their sending side (recv returned b"")."""

    def other(self, sock: socket.socket) -> socket.socket:
        return self.upstream if sock is self.client else self.client

    def events(self, sock: socket.socket) -> int:
        mask = 0
        if sock not in self.eof and not self.pending[self.other(sock)]:
            mask |= selectors.EVENT_READ
        if self.pending[sock]:
            mask |= selectors.EVENT_WRITE
        return mask

    @property
    def finished(self) -> bool:
        return (
            len(self.eof) == 2 and not self.pending[self.client] and not self.pending[self.upstream]
        )


class PeerCredRelay:
    """Serves one unix socket path in front of a gRPC server, recording each peer's credentials.

    Args:
        path: the socket clients connect to (its file must not exist; the caller has claimed it).
        mode: the socket's file mode (the listener's ``unix_socket_mode``).
        gid: the socket's group, or None.
        max_connections: connections served at once (when ``limit`` is not given).
        telemetry: counts ``gpumetrics.server.refused_connections{reason}``.
        private_dir: where the gRPC server's private socket goes (default: ``.<name>.relay``,
            mode 0700, next to ``path``; see :func:`_private_dir`).
        limit: connections served at once, shared with other relays; None: a limit of
            ``max_connections`` of this relay's own.

    Lifecycle: construct (binds ``path`` and makes the private directory) → the gRPC server
    binds :attr:`target` → :meth:`start` → :meth:`stop`. Thread-safe :meth:`lookup`.

    Raises:
        OSError: ``path`` cannot be bound or the private directory cannot be made.

    """

    def __init__(
        self,
        path: str,
        mode: int,
        gid: int | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        private_dir: str | None = None,
        limit: ConnectionLimit | None = None,
    ) -> None:
        self._limit = limit if limit is not None else ConnectionLimit(max_connections)
        self.path = path
        self._telemetry = telemetry
        self._dir = private_dir or _private_dir(path)
        self.target = f"unix:{os.path.join(self._dir, 'grpc.sock')}"
        """Where the gRPC server must listen (``unix:<private dir>/grpc.sock``)."""
        self._peers: dict[str, PeerCredentials] = {}
        self._lock = threading.Lock()
        self._n = 0
        self._pairs: dict[socket.socket, _Pair] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            old = os.umask(0o177)  # process-wide, only at start-up: never wider than 0600
            try:
                self._listener.bind(path)
            finally:
                os.umask(old)
            if gid is not None:
                os.chown(path, -1, gid)
            os.chmod(path, mode)
            self._listener.listen(128)
            self._listener.setblocking(False)
        except BaseException:
            self._close_sockets()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    # -- the table ------------------------------------------------------------------------------

    def lookup(self, peer: str) -> PeerCredentials | None:
        """Return the credentials behind a call's ``context.peer()``; None if not relayed here."""
        with self._lock:
            return self._peers.get(peer)

    @property
    def connections(self) -> int:
        """Connections relayed now."""
        with self._lock:
            return len(self._peers)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start accepting (after the gRPC server has started on :attr:`target`)."""
        self._thread = threading.Thread(
            target=self._run, name=f"peercred-{os.path.basename(self.path)}", daemon=True
        )
        self._thread.start()

    def stop_accepting(self) -> None:
        """Stop taking new connections (shutdown's first step); open ones go on."""
        with self._lock:
            self._stopping = True
        self._wake()

    def stop(self, timeout: float = 5.0) -> None:
        """Close every connection and the socket, remove the private directory. Idempotent."""
        self.stop_accepting()
        thread, self._thread = self._thread, None
        if thread is not None:
            self._wake(final=True)
            thread.join(timeout)
        self._close_sockets()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _wake(self, final: bool = False) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x" if final else b".")

    def _close_sockets(self) -> None:
        for s in (self._listener, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()

    # -- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ)
        sel.register(self._listener, selectors.EVENT_READ)
        accepting = True
        try:
            while True:
                for key, mask in sel.select():
                    sock = key.fileobj
                    if sock is self._wake_r:
                        data = self._wake_r.recv(64)
                        if b"x" in data:
                            return
                        if accepting and self._stopping:
                            sel.unregister(self._listener)
                            self._listener.close()  # new clients are refused, not left waiting
                            accepting = False
                    elif sock is self._listener:
                        if accepting:
                            self._accept(sel)
                    else:
                        assert isinstance(sock, socket.socket)
                        pair = self._pairs.get(sock)
                        if pair is not None:
                            self._service(sel, pair, sock, mask)
        except Exception:  # noqa: BLE001 - a relay bug must not go unseen, nor kill silently
            log.exception("unix socket relay of %s failed; its connections are closed", self.path)
        finally:
            for pair in {id(p): p for p in self._pairs.values()}.values():
                self._close(sel, pair)
            sel.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # EMFILE and the like: keep serving the others
                log.warning("%s: accept failed: %s", self.path, exc)
                return
            if not self._limit.try_take():
                self._refuse(client, "too_many_connections")
                continue
            try:
                creds = peer_credentials(client)
                upstream, peer = self._connect_upstream()
            except OSError as exc:
                self._limit.give()
                log.warning("%s: cannot relay a connection: %s", self.path, exc)
                self._refuse(client, "relay_failed")
                continue
            client.setblocking(False)
            upstream.setblocking(False)
            pair = _Pair(client, upstream, peer)
            with self._lock:
                self._peers[peer] = creds  # before any byte reaches gRPC
            self._pairs[client] = self._pairs[upstream] = pair
            sel.register(client, selectors.EVENT_READ)
            sel.register(upstream, selectors.EVENT_READ)

    def _connect_upstream(self) -> tuple[socket.socket, str]:
        self._n += 1
        name = os.path.join(self._dir, f"c{self._n}")
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.bind(name)
            upstream.settimeout(5.0)
            upstream.connect(self.target.removeprefix("unix:"))
        except BaseException:
            upstream.close()
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)  # the bound address stays the socket's; the name is never reused
        return upstream, f"unix:{name}"

    def _refuse(self, client: socket.socket, reason: str) -> None:
        self._telemetry.add("gpumetrics.server.refused_connections", 1, {"reason": reason})
        log.warning("%s: connection refused (%s)", self.path, reason.replace("_", " "))
        with contextlib.suppress(OSError):
            client.close()

    def _service(
        self, sel: selectors.BaseSelector, pair: _Pair, sock: socket.socket, mask: int
    ) -> None:
        other = pair.other(sock)
        try:
            if mask & selectors.EVENT_WRITE and pair.pending[sock]:
                sent = sock.send(pair.pending[sock])
                pair.pending[sock] = pair.pending[sock][sent:]
                if not pair.pending[sock] and other in pair.eof:
                    sock.shutdown(socket.SHUT_WR)
            if mask & selectors.EVENT_READ and not pair.pending[other]:
                data = sock.recv(CHUNK_BYTES)
                if not data:
                    pair.eof.add(sock)
                    other.shutdown(socket.SHUT_WR)
                else:
                    try:
                        sent = other.send(data)
                    except BlockingIOError:
                        sent = 0
                    pair.pending[other] = data[sent:]
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                log.debug("%s: relayed connection ended: %s", self.path, exc)
            self._close(sel, pair)
            return
        if pair.finished:
            self._close(sel, pair)
            return
        for s in (pair.client, pair.upstream):
            _set_events(sel, s, pair.events(s))

    def _close(self, sel: selectors.BaseSelector, pair: _Pair) -> None:
        if pair.closed:
            return
        pair.closed = True
        self._limit.give()
        for s in (pair.client, pair.upstream):
            _unregister(sel, s)
            self._pairs.pop(s, None)
            with contextlib.suppress(OSError):
                s.close()
        with self._lock:  # after the upstream socket is closed: no call of it can look it up
            self._peers.pop(pair.peer, None)


def _unregister(sel: selectors.BaseSelector, sock: socket.socket) -> None:
    with contextlib.suppress(KeyError, ValueError):
        sel.unregister(sock)


def _set_events(sel: selectors.BaseSelector, sock: socket.socket, events: int) -> None:
    """Register ``sock`` for ``events``; a socket with nothing to wait for is not registered."""
    try:
        key = sel.get_key(sock)
    except KeyError:
        if events:
            sel.register(sock, events)
        return
    if not events:
        sel.unregister(sock)
    elif key.events != events:
        sel.modify(sock, events)


def _private_dir(path: str) -> str:
    """Make the 0700 directory of the gRPC server's private socket behind ``path``.

    ``.<name>.relay`` next to ``path`` (the caller has claimed ``path``: no live server uses it,
    so a directory left there by a killed sidecar is stale and is replaced), or a new temporary
    directory when that name would be too long for a unix socket.

    Raises:
        OSError: the directory exists and is not this user's own directory, or cannot be made.

    """
    parent, name = os.path.split(path)
    private = os.path.join(parent, f".{name}.relay")
    if len(os.fsencode(os.path.join(private, "c9999999999"))) > _UNIX_PATH_MAX:
        return tempfile.mkdtemp(prefix="gpumetrics-relay-")  # mode 0700
    try:
        st = os.lstat(private)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(errno.EEXIST, f"{private!r} exists and is not this user's directory")
        shutil.rmtree(private)  # stale: what a killed sidecar left behind
    os.mkdir(private, 0o700)
    os.chmod(private, 0o700)  # whatever the umask
    return private


PeerLookup = Callable[[str], PeerCredentials | None]
"""``lookup(context.peer())``: the credentials of a relayed peer, or None."""
