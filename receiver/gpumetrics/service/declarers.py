"""Who may declare which process: the profiler service's authorization (``docs/security.md``).

A call reaches ``ProfilerIntegrationService`` one of two ways:

* over **TCP**, where the server interceptor has already checked the declare token or the
  client certificate (or ``server.allow_unauthenticated_declare`` said none is needed): the
  caller is **trusted**;
* over a **unix socket**, relayed by :class:`~gpumetrics.service.peercred.PeerCredRelay`, which
  recorded the peer's ``SO_PEERCRED``. The peer is trusted when its uid is 0 (root), the
  sidecar's own uid (which can already do anything the sidecar can), one of
  ``server.trusted_declarer_uids``, or its gid one of ``server.trusted_declarer_gids``. Any
  other peer is **restricted** to its own processes:

  - it may declare (and report the exit of) only a pid whose ``<proc_root>/<pid>`` directory it
    owns (the process's effective uid as procfs shows it; a non-dumpable process, e.g. one that
    changed uid, shows root and so is nobody else's): ``not_owner``; a pid that is not running
    cannot be declared (``no_such_process``), but its exit may be reported (it releases only
    what that pid held);
  - the resource it declares may carry an observed key (``gpumetrics.identity.is_observed_key``:
    ``host.*``, ``k8s.*``, ``container.*``, ``process.pid``, ``process.executable.*``,
    ``process.owner``, ``process.creation.time``, ``process.environment_variable.*``) only with
    the value the sidecar itself observes for that pid (the eBPF profiler's rules:
    ``process.pid``, ``process.executable.*``, ``container.id`` and the captured variables):
    ``observed_attribute``. Without an :class:`Observation` (a server built without the
    runtime) every key counts as observed and only ``process.pid`` is seen. So a user can name
    its own process (``service.name``), but not put its GPU usage on another pod, container or
    host;
  - its resynchronisations are its own: the declarer name is prefixed ``peer:uid=<uid>``
    (``peer:uid=1000#<metadata value>``), which no metadata value and no certificate identity
    can be, so it cannot release a trusted profiler's declarations.

Every refusal is counted in ``gpumetrics.declarations.refused{reason}`` (``not_owner``,
``no_such_process``, ``observed_attribute``, ``unknown_peer``) and answered with a ``Rejection``
whose reason says why (the servicer logs it at WARNING once per field, then at DEBUG).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.resource.v1 import resource_pb2

from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry
from gpumetrics.service.peercred import PeerCredentials, PeerLookup

__all__ = [
    "TRUSTED_HINT",
    "Caller",
    "DeclarePolicy",
    "ObserveResource",
    "Observation",
    "Refusal",
]

log = logging.getLogger(__name__)

ObserveResource = Callable[[int, Sequence[str]], Mapping[str, Any] | None]
"""``observe(pid, env_var_names)``: the resource the sidecar observes for ``pid`` by the eBPF
profiler's rules (``process.pid``, ``process.executable.*``, ``container.id``,
``process.environment_variable.<NAME>`` for the names given), or None when it cannot see it."""

TRUSTED_HINT = (
    "only root, the sidecar's own user and server.trusted_declarer_uids / "
    "server.trusted_declarer_gids may declare another user's process or observed attributes"
)
_ENV_PREFIX = "process.environment_variable."
_LOGGED_MAX = 256


@dataclass(frozen=True)
class Observation:
    """What the sidecar itself knows of a process.

    The runtime wires ``gpumetrics.identity.is_observed_key`` and a procfs read (the service
    layer may not import the identity package).

    Attributes:
        is_observed: whether a resource key is observed identity.
        observe: see :data:`ObserveResource`.

    """

    is_observed: Callable[[str], bool]
    observe: ObserveResource


@dataclass(frozen=True)
class Caller:
    """The caller of one profiler-service RPC.

    Attributes:
        declarer: whose declarations its resynchronisations replace (``declarer_of``, prefixed
            ``peer:uid=<uid>`` for a restricted peer).
        peer: the unix-socket peer's credentials; None over TCP.
        trusted: may declare any process and any attribute.

    """

    declarer: str
    peer: PeerCredentials | None
    trusted: bool


class Refusal(ValueError):
    """Why a restricted caller may not declare an entry.

    The servicer answers it as a ``Rejection`` (``field`` relative to the entry).

    Attributes:
        field: ``pid`` or ``profiler_resource`` (the key is in ``reason``).
        reason: why, and who may.
        kind: ``not_owner``, ``no_such_process`` or ``observed_attribute``.

    """

    def __init__(self, field: str, reason: str, kind: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
        self.kind = kind


class DeclarePolicy:
    """Decides who may declare what (module docstring).

    Args:
        lookup: the relays' peer table (``PeerCredRelay.lookup`` of every relayed listener);
            None: no unix listener serves the profiler service.
        trusted_uids: uids trusted besides 0 and the sidecar's own.
        trusted_gids: gids trusted.
        proc_root: where a pid's owner is read (``identity.proc_root``).
        observation: the sidecar's own observation of processes; None: a restricted caller's
            resource may hold nothing but its own ``process.pid``.
        telemetry: counts ``gpumetrics.declarations.refused{reason}``.

    """

    def __init__(
        self,
        lookup: PeerLookup | None = None,
        trusted_uids: Iterable[int] = (),
        trusted_gids: Iterable[int] = (),
        proc_root: str = "/proc",
        observation: Observation | None = None,
        telemetry: SelfTelemetry = NO_TELEMETRY,
    ) -> None:
        self._lookup = lookup
        self._uids = frozenset({0, os.geteuid(), *trusted_uids})
        self._gids = frozenset(trusted_gids)
        self._proc_root = proc_root
        self._observation = observation
        self._telemetry = telemetry
        self._logged: set[tuple[str, int]] = set()
        self._logged_lock = threading.Lock()

    def caller(self, context: Any, declarer: str) -> Caller:
        """Return who makes the call of ``context`` (``declarer``: its ``declarer_of`` name).

        Raises (through ``context.abort``): UNAUTHENTICATED for a unix-socket peer that no relay
        knows (counted as ``unknown_peer``; it cannot happen through the relays).
        """
        peer = context.peer() or ""
        if not peer.startswith("unix:"):
            return Caller(declarer, None, True)
        creds = self._lookup(peer) if self._lookup is not None else None
        if creds is None:
            self._count("unknown_peer", -1, f"a call from {peer!r} came through no relay")
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "the peer's credentials are unknown (not a relayed unix socket connection)",
            )
            raise AssertionError("context.abort returned")  # pragma: no cover
        if creds.uid in self._uids or creds.gid in self._gids:
            return Caller(declarer, creds, True)
        prefix = f"peer:uid={creds.uid}"
        return Caller(f"{prefix}#{declarer}" if declarer else prefix, creds, False)

    # -- entries --------------------------------------------------------------------------------

    def check_declare(self, caller: Caller, pid: int, profiler_resource: bytes) -> None:
        """Raise :class:`Refusal` when ``caller`` may not declare ``pid`` with that resource."""
        if caller.trusted or caller.peer is None:
            return
        uid = caller.peer.uid
        owner = self._owner(pid)
        if owner is None:
            self._refuse(
                "no_such_process",
                uid,
                "pid",
                f"pid {pid} is not a running process in {self._proc_root}; a peer that is not "
                f"trusted (uid {uid}) may declare only its own processes",
            )
        if owner != uid:
            self._refuse(
                "not_owner",
                uid,
                "pid",
                f"pid {pid} belongs to uid {owner}, not to this peer (uid {uid}); {TRUSTED_HINT}",
            )
        self._check_observed(caller, pid, profiler_resource)

    def check_exit(self, caller: Caller, pid: int) -> None:
        """Raise :class:`Refusal` when ``caller`` may not report ``pid``'s exit.

        A pid that is not running may be reported by anyone who may declare: releasing what it
        held protects nothing. A running pid only by its owner (or a trusted caller).
        """
        if caller.trusted or caller.peer is None:
            return
        owner = self._owner(pid)
        uid = caller.peer.uid
        if owner is not None and owner != uid:
            self._refuse(
                "not_owner",
                uid,
                "pid",
                f"pid {pid} is running as uid {owner}, not as this peer (uid {uid}); "
                f"{TRUSTED_HINT}",
            )

    def _owner(self, pid: int) -> int | None:
        if pid <= 0:
            return None
        try:
            return os.stat(os.path.join(self._proc_root, str(pid))).st_uid
        except (OSError, ValueError):
            return None

    def _check_observed(self, caller: Caller, pid: int, profiler_resource: bytes) -> None:
        if not profiler_resource:
            return
        try:
            resource = resource_pb2.Resource.FromString(profiler_resource)
        except DecodeError:
            return  # the declared store rejects it, naming the field
        obs = self._observation
        observed = obs.is_observed if obs is not None else (lambda _key: True)
        claimed = {kv.key: kv.value for kv in resource.attributes if observed(kv.key)}
        if not claimed:
            return
        names = [k[len(_ENV_PREFIX) :] for k in claimed if k.startswith(_ENV_PREFIX)]
        seen: Mapping[str, Any] = {"process.pid": pid}
        if obs is not None:
            try:
                seen = obs.observe(pid, names) or seen
            except (OSError, ValueError):
                pass  # not observable: only process.pid stands
        assert caller.peer is not None
        for key, value in sorted(claimed.items()):
            if key in seen and _same(value, seen[key]):
                continue
            # the key goes in the reason, not the field: rejections are counted by field, and a
            # caller chooses its keys (the field's label set must stay bounded)
            self._refuse(
                "observed_attribute",
                caller.peer.uid,
                "profiler_resource",
                f"attribute {_cut(key)}={_shown(value)} is observed identity that the sidecar "
                f"does not see for pid {pid}; {TRUSTED_HINT}",
            )

    # -- counting -------------------------------------------------------------------------------

    def _refuse(self, kind: str, uid: int, field: str, reason: str) -> None:
        self._count(kind, uid, reason)
        raise Refusal(field, reason, kind)

    def _count(self, kind: str, uid: int, reason: str) -> None:
        """Count a refusal; the servicer logs the entry's rejection, so only a call is logged."""
        self._telemetry.add("gpumetrics.declarations.refused", 1, {"reason": kind})
        if kind != "unknown_peer":
            return
        with self._logged_lock:
            first = (kind, uid) not in self._logged and len(self._logged) < _LOGGED_MAX
            if first:
                self._logged.add((kind, uid))
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "call refused (%s): %s", kind.replace("_", " "), reason[:512])


def _same(value: Any, seen: Any) -> bool:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return isinstance(seen, str) and value.string_value == seen
    if kind == "int_value":
        return isinstance(seen, int) and not isinstance(seen, bool) and value.int_value == seen
    return False


def _cut(text: str) -> str:
    return text if len(text) <= 128 else text[:125] + "..."


def _shown(value: Any) -> str:
    kind = value.WhichOneof("value")
    raw = getattr(value, kind) if kind else None
    return _cut(repr(raw) if isinstance(raw, str) else str(raw))
