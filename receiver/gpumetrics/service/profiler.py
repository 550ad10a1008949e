"""``gpumetrics.v1.ProfilerIntegrationService``: declarations, exits and resyncs from a profiler.

Each entry becomes one call on the identity package's declared store (the
:class:`DeclaredStoreAPI` protocol, implemented by ``gpumetrics.identity.DeclaredStore``). The
store validates each entry and raises a ``DeclarationError`` (a ``ValueError`` whose ``field``
is relative to one ``ProcessDeclaration``); the servicer prefixes the field with the entry's
place (``processes[3].environment[0].name``, ``exits[1].pid``, on a stream ``declare.pid``) and
answers with a ``Rejection``. Accepted entries are applied even when others in the same request
are rejected; a rejected entry changes nothing held.

Limits: at most ``max_entries`` entries per request (more: RESOURCE_EXHAUSTED, nothing applied);
the size of each field is bounded by the declared store (``max_process_context_bytes``,
``max_environment_bytes``, ``max_profiler_resource_bytes``) and of each message by the server's
receive limit; open streams are counted by the server (``gpumetrics.service.gate``).

The *declarer* (whose declarations a resync replaces) is the ``gpumetrics-declarer`` metadata
value (``[A-Za-z0-9._:/-]``, at most 128 bytes; empty when absent). When the caller presented a
client certificate (mTLS) it is prefixed with the certificate's identity
(:func:`certificate_identity`), ``x509:<kind>=<names>``, and a ``#`` before the metadata value:
``x509:uri=spiffe://cluster.local/ns/obs/sa/parca#node-7``. The certificate part never holds a
raw ``#`` (it is percent-encoded) and always holds a ``=``, which metadata values cannot, so no
two certificates, and no certificate and plain metadata, ever give the same declarer. See
``docs/protocol.md``.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import grpc

from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry
from gpumetrics.service.declarers import Caller, DeclarePolicy
from gpumetrics.service.settings import DEFAULT_MAX_ENTRIES
from gpumetrics.v1 import profiler_pb2, profiler_pb2_grpc

log = logging.getLogger(__name__)

DECLARER_METADATA_KEY = "gpumetrics-declarer"
"""gRPC metadata key naming the declaring agent (optional)."""

_DECLARER_RE = re.compile(r"[A-Za-z0-9._:/-]{1,128}")
_INDEX_RE = re.compile(r"\[\d+\]")
_LOGGED_FIELDS_MAX = 64

DeclarationArgs = tuple[int, int, bytes, Sequence[tuple[str, bytes]], bytes, str]
"""``(pid, start_time_ticks, process_context, environment, profiler_resource,
profiler_resource_schema_url)``."""


class DeclaredStoreAPI(Protocol):
    """What the servicer needs from the declared store (``gpumetrics.identity.DeclaredStore``)."""

    def declare(
        self,
        pid: int,
        start_time_ticks: int,
        process_context: bytes,
        environment: Sequence[tuple[str, bytes]],
        profiler_resource: bytes,
        declarer: str = "",
        schema_url: str = "",
    ) -> object:
        """Hold one declaration; raise ``ValueError`` with ``.field`` when it is rejected."""

    def exit(self, pid: int, start_time_ticks: int = 0) -> int:
        """Release ``pid``; return how many declarations were released."""

    def begin_resync(self, declarer: str) -> Any:
        """Start a resynchronisation of ``declarer``; return its handle (one per stream)."""

    def abort_resync(self, resync: Any) -> bool:
        """Abandon the resynchronisation ``resync`` without releasing anything."""

    def end_resync(self, resync: Any) -> int:
        """End ``resync``; return how many declarations were released."""

    def replace_all(
        self,
        declarer: str,
        declarations: Iterable[Any],
        on_error: Callable[[int, Any], None] | None = None,
    ) -> int:
        """Declare ``declarations`` as the complete view of ``declarer``; return released.

        Each item unpacks as :data:`DeclarationArgs` (``DeclarationInput`` in the identity
        package); ``on_error(index, error)`` receives each rejected entry.
        """

    def __len__(self) -> int:
        """Return the number of declarations held."""

    @property
    def held_bytes(self) -> int:
        """Estimated memory of the declarations held (By)."""


def _args(d: profiler_pb2.ProcessDeclaration) -> DeclarationArgs:
    env = [(e.name, e.value) for e in d.environment]
    return (
        d.pid,
        d.start_time_ticks,
        d.process_context,
        env,
        d.profiler_resource,
        d.profiler_resource_schema_url,
    )


_IDENTITY_KEYS = (
    ("peer_uri", "uri"),
    ("peer_dns", "dns"),
    ("x509_common_name", "cn"),
    ("peer_email", "email"),
    ("peer_ip", "ip"),
)
# kept as they are: what URIs, DNS names and e-mail addresses are made of, but not "%", "," (the
# separator of several names) or "#" (the separator of the metadata value)
_SAFE = ":/@!$&'()*+;=?[]~"


def certificate_identity(auth_context: Mapping[str, Sequence[bytes]]) -> str | None:
    """Return the identity of the client certificate of a call, or None without one.

    The first of these the certificate has, every value sorted and percent-encoded
    (RFC 3986 §2.1, ``%``, ``,`` and ``#`` included), names it: ``uri=`` its URI SANs (SPIFFE
    IDs), ``dns=`` its DNS SANs, ``cn=`` its subject common name, ``email=`` / ``ip=`` its other
    SANs; a certificate with none of them is named by ``sha256=`` its fingerprint. So a
    certificate with only SANs (no common name) is told apart from another, and a common name
    with ``/`` in it stays one value.

    Args:
        auth_context: ``grpc.ServicerContext.auth_context()``: grpcio's peer properties
            (``peer_uri``, ``peer_dns``, ``x509_common_name``, ``x509_pem_cert``, ...).

    """
    pem = [v for v in auth_context.get("x509_pem_cert", ()) if v]
    if not pem:
        return None
    for key, kind in _IDENTITY_KEYS:
        values = sorted({v for v in auth_context.get(key, ()) if v})
        if values:
            return f"{kind}=" + ",".join(urllib.parse.quote(v, safe=_SAFE) for v in values)
    return "sha256=" + hashlib.sha256(pem[0]).hexdigest()


def declarer_of(context: Any) -> str:
    """Return the declarer of the calling agent (see the module docstring).

    Raises (through ``context.abort``): INVALID_ARGUMENT naming ``metadata gpumetrics-declarer``.
    """
    value = ""
    for key, v in context.invocation_metadata() or ():
        if key == DECLARER_METADATA_KEY:
            value = v if isinstance(v, str) else ""
            if _DECLARER_RE.fullmatch(value) is None:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"metadata {DECLARER_METADATA_KEY}: must be 1 to 128 characters of "
                    "[A-Za-z0-9._:/-]",
                )
    identity = certificate_identity(context.auth_context() or {})
    if identity is not None:
        return f"x509:{identity}#{value}" if value else f"x509:{identity}"
    return value


class ProfilerServicer(profiler_pb2_grpc.ProfilerIntegrationServiceServicer):
    """Applies profiler declarations to a :class:`DeclaredStoreAPI`.

    Args:
        declared: the declared store.
        telemetry: counts ``gpumetrics.declarations.rejected{field}`` (field without indices,
            e.g. ``environment[].name``) and sets the gauge ``gpumetrics.declarations``.
        max_entries: most declarations or exits in one unary request (>= 1).
        policy: who may declare which process (:mod:`gpumetrics.service.declarers`); the
            default knows no relay, so a unix-socket peer is refused and TCP callers (checked
            by the server interceptor) are trusted.

    Raises:
        ValueError: ``max_entries`` below 1.

    """

    def __init__(
        self,
        declared: DeclaredStoreAPI,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        policy: DeclarePolicy | None = None,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries: must be >= 1, got {max_entries}")
        self._declared = declared
        self._telemetry = telemetry
        self._max_entries = max_entries
        self._policy = policy if policy is not None else DeclarePolicy(telemetry=telemetry)
        self._logged_lock = threading.Lock()
        self._logged: set[str] = set()

    # -- unary RPCs -----------------------------------------------------------------------------

    def DeclareProcesses(  # noqa: N802
        self, request: profiler_pb2.DeclareProcessesRequest, context: Any
    ) -> profiler_pb2.DeclareProcessesResponse:
        """Declare a batch (``replace_all``: the declarer's complete view).

        Entries the caller may not declare (:class:`~gpumetrics.service.declarers.DeclarePolicy`)
        are rejected, naming why, and are not part of the complete view.
        """
        self._check_count(context, "processes", len(request.processes))
        caller = self._caller(context)
        rejected: list[profiler_pb2.Rejection] = []
        processes = request.processes

        def reject(i: int, exc: Any) -> None:
            rejected.append(self._rejection(i, processes[i].pid, f"processes[{i}]", exc))

        allowed = []
        for i, d in enumerate(processes):
            try:
                self._policy.check_declare(caller, d.pid, d.profiler_resource)
            except ValueError as exc:
                reject(i, exc)
            else:
                allowed.append(i)
        released = 0
        if request.replace_all:
            released = self._declared.replace_all(
                caller.declarer,
                (_args(processes[i]) for i in allowed),
                on_error=lambda j, exc: reject(allowed[j], exc),
            )
        else:
            for i in allowed:
                try:
                    self._declare(processes[i], caller.declarer)
                except ValueError as exc:
                    reject(i, exc)
        self._publish()
        rejected.sort(key=lambda r: r.index)
        return profiler_pb2.DeclareProcessesResponse(
            accepted=len(processes) - len(rejected), rejected=rejected, released=released
        )

    def ReportExits(  # noqa: N802
        self, request: profiler_pb2.ReportExitsRequest, context: Any
    ) -> profiler_pb2.ReportExitsResponse:
        """Release the declarations of exited processes."""
        self._check_count(context, "exits", len(request.exits))
        caller = self._caller(context)
        released = 0
        rejected = []
        for i, e in enumerate(request.exits):
            try:
                self._policy.check_exit(caller, e.pid)
                released += self._declared.exit(e.pid, e.start_time_ticks)
            except ValueError as exc:
                rejected.append(self._rejection(i, e.pid, f"exits[{i}]", exc))
        self._publish()
        return profiler_pb2.ReportExitsResponse(released=released, rejected=rejected)

    # -- stream ---------------------------------------------------------------------------------

    def StreamDeclarations(  # noqa: N802
        self, request_iterator: Iterator[profiler_pb2.StreamDeclarationsRequest], context: Any
    ) -> Iterator[profiler_pb2.StreamDeclarationsResponse]:
        """Answer every event with one response, in order (a ``DeclareBatch`` is one event).

        A resynchronisation belongs to the stream that began it: another stream of the same
        declarer (an agent that reconnected while its old stream is still open) neither ends nor
        aborts it. A second ``ResyncBegin`` on the stream restarts it; a stream that ends inside
        it abandons it (``DeclaredStore.abort_resync``): nothing is released, and the agent's
        next ``ResyncBegin`` starts afresh.
        """
        caller = self._caller(context)
        stream = _StreamResync(self._declared, caller.declarer)
        try:
            for event in request_iterator:
                yield self._apply(event, caller, stream)
                self._publish()
        finally:
            stream.abandon()

    def _apply(
        self, event: profiler_pb2.StreamDeclarationsRequest, caller: Caller, stream: _StreamResync
    ) -> profiler_pb2.StreamDeclarationsResponse:
        kind = event.WhichOneof("event")
        resp = profiler_pb2.StreamDeclarationsResponse
        try:
            if kind == "declare":
                d = event.declare
                self._policy.check_declare(caller, d.pid, d.profiler_resource)
                self._declare(d, caller.declarer)
            elif kind == "exit":
                self._policy.check_exit(caller, event.exit.pid)
                self._declared.exit(event.exit.pid, event.exit.start_time_ticks)
            elif kind == "resync_begin":
                stream.begin()
            elif kind == "resync_end":
                return resp(accepted=True, released=stream.end())
            elif kind == "declare_batch":
                return self._declare_batch(event.declare_batch.processes, caller)
            else:
                return resp(
                    rejection=self._rejection(
                        0,
                        0,
                        "",
                        _Problem("event", "no event set (declare, declare_batch, exit, resync_*)"),
                    )
                )
        except ValueError as exc:
            pid = event.declare.pid if kind == "declare" else event.exit.pid if kind else 0
            prefix = kind if kind in ("declare", "exit") else ""
            return resp(rejection=self._rejection(0, pid, prefix, exc))
        return resp(accepted=True)

    def _declare(self, d: profiler_pb2.ProcessDeclaration, declarer: str) -> None:
        pid, start, ctx, env, res, schema_url = _args(d)
        self._declared.declare(pid, start, ctx, env, res, declarer, schema_url)

    def _declare_batch(
        self, processes: Sequence[profiler_pb2.ProcessDeclaration], caller: Caller
    ) -> profiler_pb2.StreamDeclarationsResponse:
        """Apply one ``DeclareBatch``: each entry as a ``declare`` event; one answer for all.

        Each entry is checked as a ``declare`` event is (the caller's
        :class:`~gpumetrics.service.declarers.DeclarePolicy`, then the declared store) and
        rejected on its own, naming ``declare_batch.processes[i]``. More than ``max_entries``
        entries is refused whole (field ``declare_batch.processes``, nothing applied); the
        stream goes on. (A batch of more repeated elements than ``server.max_request_elements``
        never gets here: the server refuses it before parsing, ``gpumetrics.service.wirecount``.)
        """
        resp = profiler_pb2.StreamDeclarationsResponse
        n = len(processes)
        if n > self._max_entries:
            problem = _Problem(
                "declare_batch.processes",
                f"{n} entries exceed the limit of {self._max_entries} per batch "
                "(server.max_declarations_per_request); send smaller batches",
            )
            return resp(rejection=self._rejection(0, 0, "", problem))
        rejections = []
        check = self._policy.check_declare
        for i, d in enumerate(processes):
            try:
                check(caller, d.pid, d.profiler_resource)
                self._declare(d, caller.declarer)
            except ValueError as exc:
                rejections.append(self._rejection(i, d.pid, f"declare_batch.processes[{i}]", exc))
        return resp(accepted=not rejections, declared=n - len(rejections), rejections=rejections)

    def _publish(self) -> None:
        self._telemetry.set("gpumetrics.declarations", len(self._declared))
        self._telemetry.set("gpumetrics.declarations.bytes", self._declared.held_bytes)

    # -- helpers --------------------------------------------------------------------------------

    def _caller(self, context: Any) -> Caller:
        return self._policy.caller(context, declarer_of(context))

    def _check_count(self, context: Any, field: str, n: int) -> None:
        if n > self._max_entries:
            self._telemetry.add("gpumetrics.declarations.rejected", n, {"field": field})
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{field}: {n} entries exceed the limit of {self._max_entries} per request "
                "(server.max_declarations_per_request); send smaller batches",
            )

    def _rejection(self, index: int, pid: int, prefix: str, exc: Any) -> profiler_pb2.Rejection:
        rel = str(getattr(exc, "field", "") or "")
        reason = str(getattr(exc, "reason", "") or exc)
        field = f"{prefix}.{rel}" if prefix and rel else prefix or rel or "entry"
        key = _INDEX_RE.sub("[]", rel or prefix or "entry")
        self._telemetry.add("gpumetrics.declarations.rejected", 1, {"field": key})
        self._log_rejection(key, field, pid, reason)
        return profiler_pb2.Rejection(index=index, pid=pid, field=field, reason=reason)

    def _log_rejection(self, key: str, field: str, pid: int, reason: str) -> None:
        with self._logged_lock:
            first = key not in self._logged and len(self._logged) < _LOGGED_FIELDS_MAX
            if first:
                self._logged.add(key)
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "declaration rejected (pid %d): %s: %s", pid, field, reason[:512])


class _StreamResync:
    """The resynchronisation of one stream: at most one in progress, ended only by this stream."""

    def __init__(self, declared: DeclaredStoreAPI, declarer: str) -> None:
        self._declared = declared
        self._declarer = declarer
        self._resync: Any = None

    def begin(self) -> None:
        """Start (or restart) this stream's resynchronisation."""
        self.abandon()
        self._resync = self._declared.begin_resync(self._declarer)

    def end(self) -> int:
        """End it; return what was released.

        Raises:
            _Problem: field ``resync_end`` when this stream began none.

        """
        if self._resync is None:
            raise _Problem("resync_end", "no resynchronisation in progress on this stream")
        resync, self._resync = self._resync, None
        return int(self._declared.end_resync(resync))

    def abandon(self) -> None:
        """Abandon the one in progress, if any, releasing nothing."""
        if self._resync is not None:
            resync, self._resync = self._resync, None
            self._declared.abort_resync(resync)


class _Problem(ValueError):
    """A rejection the servicer itself decides (field relative to the event)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
