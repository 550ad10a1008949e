"""A client of the kubelet's pod-resources API v1 over its unix socket.

Two calls (``v1.PodResourcesLister``): ``List`` (which container holds which device) and
``GetAllocatableResources`` (which devices the kubelet can hand out). Every failure becomes a
:class:`PodResourcesError` of one :class:`Failure` kind with a message that says what to do, so
the caller can log it once: the socket is missing (not mounted), the sidecar may not connect
(permission denied), the kubelet does not answer, the answer is too large, ...

grpcio reports every connection failure as ``UNAVAILABLE``; the kind is then found by connecting
to the socket once more with a plain ``socket.connect``, whose ``errno`` tells a missing socket
from a refused permission.
"""

from __future__ import annotations

import enum
import errno
import os
import socket
import stat
import time
from typing import Any

import grpc

from gpumetrics.kubernetes.podresources.v1 import podresources_pb2, podresources_pb2_grpc


class Failure(enum.StrEnum):
    """Why a pod-resources call failed (``gpumetrics.kubernetes.refreshes{outcome}``)."""

    SOCKET_MISSING = "socket_missing"
    PERMISSION_DENIED = "permission_denied"
    UNAVAILABLE = "unavailable"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    UNIMPLEMENTED = "unimplemented"
    RESPONSE_TOO_LARGE = "response_too_large"
    RATE_LIMITED = "rate_limited"
    ERROR = "error"


class PodResourcesError(Exception):
    """A pod-resources call failed; :attr:`kind` says why, the message says what to do."""

    def __init__(self, kind: Failure, message: str) -> None:
        super().__init__(message)
        self.kind = kind


_MOUNT_HINT = (
    "mount the host's /var/lib/kubelet/pod-resources directory (hostPath) into the sidecar's "
    "container, or turn pod attribution off (kubernetes.pod_attribution: false)"
)
_PERMISSION_HINT = (
    "the kubelet's socket is root's: run the sidecar as uid 0 (no capability is needed) or "
    "give it the socket's group"
)

_DEADLINE_SHARE = 0.9
"""A call CANCELLED after this share of its deadline is classified as deadline exceeded."""

CAP_DAC_OVERRIDE = 1
"""Capability bits (``linux/capability.h``): DAC_OVERRIDE bypasses file permission checks."""
CAP_DAC_READ_SEARCH = 2
"""DAC_READ_SEARCH bypasses read and directory-search permission checks."""


def effective_capabilities(status_path: str = "/proc/self/status") -> int | None:
    """Return the effective capability bits (``CapEff`` of ``/proc/self/status``), or None."""
    try:
        with open(status_path, encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


def permission_hint(path: str, euid: int | None = None, caps: int | None = -1) -> str:
    """Say why connecting to the socket ``path`` was refused and what to change.

    A process that is not uid 0 is told to run as uid 0 or get the socket's group. A process
    that already is uid 0 (the chart's choice, every capability dropped) is told what it lacks
    instead: the socket's mode and owner decide (connecting needs write permission on it), and
    the capabilities that would bypass them (``CAP_DAC_OVERRIDE``; ``CAP_DAC_READ_SEARCH`` for a
    directory on the path). Refused with ``CAP_DAC_OVERRIDE``, it is a security module's doing.

    Args:
        path: the socket's path.
        euid: the effective uid (default: this process's).
        caps: the effective capability bits (default: read from ``/proc/self/status``).

    """
    euid = os.geteuid() if euid is None else euid
    try:
        st: os.stat_result | None = os.stat(path)
    except OSError:
        st = None
    mode = (
        f"mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid} gid {st.st_gid}" if st else ""
    )
    if euid != 0:
        return _PERMISSION_HINT + (f" (the socket: {mode}; this process: uid {euid})" if st else "")
    caps = effective_capabilities() if caps == -1 else caps
    override = caps is not None and bool(caps >> CAP_DAC_OVERRIDE & 1)
    search = caps is not None and bool(caps >> CAP_DAC_READ_SEARCH & 1)
    lsm = (
        "a security module: with SELinux the container's type must be allowed to connect to "
        "the kubelet's socket (e.g. spc_t, or a policy for it), with AppArmor the profile must "
        "allow it"
    )
    if override:
        return f"the sidecar runs as uid 0 with CAP_DAC_OVERRIDE, so the refusal comes from {lsm}"
    if st is None:
        return (
            "the sidecar runs as uid 0 but a directory on the way to the socket denies it search "
            "permission (x) and it lacks CAP_DAC_READ_SEARCH"
            + ("" if search else " and CAP_DAC_OVERRIDE")
            + ": fix the directory's mode, or add the capability to the container"
        )
    if st.st_uid != 0:
        return (
            f"the sidecar runs as uid 0 but the socket ({mode}) is not uid 0's (in a user "
            "namespace, hostUsers: false, the host's root shows as the overflow uid 65534) and "
            "this process lacks CAP_DAC_OVERRIDE: give the sidecar the socket's group "
            f"(supplementalGroups: [{st.st_gid}]) if its mode lets the group write, or add "
            "CAP_DAC_OVERRIDE"
        )
    if not st.st_mode & stat.S_IWUSR:
        return (
            f"the sidecar runs as uid 0, the socket's owner, but its {mode} gives the owner no "
            "write permission, which connecting needs, and this process lacks CAP_DAC_OVERRIDE: "
            "add CAP_DAC_OVERRIDE, or find what changed the socket's mode"
        )
    return (
        f"the sidecar runs as uid 0 and the socket ({mode}) lets uid 0 connect, so the refusal "
        "comes from a directory on the way that uid 0 may not search without "
        f"CAP_DAC_READ_SEARCH, or from {lsm}"
    )


def probe_socket(path: str) -> PodResourcesError | None:
    """Connect to the unix socket ``path`` once; return the failure it shows, or None.

    ``ENOENT``/``ENOTDIR`` → socket missing, ``EACCES``/``EPERM`` → permission denied,
    ``ECONNREFUSED`` (a socket file nobody listens on) → unavailable.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(1.0)
        sock.connect(path)
    except OSError as exc:
        code = exc.errno
        if code in (errno.ENOENT, errno.ENOTDIR):
            return PodResourcesError(
                Failure.SOCKET_MISSING, f"{path} does not exist: {_MOUNT_HINT}"
            )
        if code in (errno.EACCES, errno.EPERM):
            return PodResourcesError(
                Failure.PERMISSION_DENIED, f"{path}: permission denied: {permission_hint(path)}"
            )
        return PodResourcesError(
            Failure.UNAVAILABLE,
            f"{path}: {exc.strerror or exc}: the kubelet is not listening (restarting?)",
        )
    finally:
        sock.close()
    return None


class PodResourcesClient:
    """Calls the kubelet's ``v1.PodResourcesLister`` on a unix socket.

    Args:
        socket_path: absolute path of the kubelet's socket.
        timeout_s: deadline of each call (s).
        max_response_bytes: largest answer accepted (By); grpcio refuses larger ones.

    The channel is created on first use and reused while calls succeed; after a failure it is
    closed, so the next call dials the socket again (a restarted kubelet makes a new one). Not
    thread-safe: the owner (:class:`~gpumetrics.kubernetes.attribution.PodAttribution`) calls
    from one thread.

    """

    def __init__(self, socket_path: str, timeout_s: float, max_response_bytes: int) -> None:
        self.socket_path = socket_path
        self._timeout_s = timeout_s
        self._max = max_response_bytes
        self._channel: grpc.Channel | None = None
        self._stub: podresources_pb2_grpc.PodResourcesListerStub | None = None

    def _lister(self) -> podresources_pb2_grpc.PodResourcesListerStub:
        if self._stub is None:
            self._channel = grpc.insecure_channel(
                "unix:" + self.socket_path,
                options=[
                    ("grpc.max_receive_message_length", self._max),
                    ("grpc.enable_retries", 0),
                    # the default authority of a unix target is the socket path; the kubelet
                    # ignores it, but keep it short and fixed
                    ("grpc.default_authority", "localhost"),
                ],
            )
            self._stub = podresources_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def list(self) -> podresources_pb2.ListPodResourcesResponse:
        """Call ``List``: every pod's allocated devices.

        Raises:
            PodResourcesError: any failure, classified.

        """
        answer: podresources_pb2.ListPodResourcesResponse = self._call(
            "List", podresources_pb2.ListPodResourcesRequest()
        )
        return answer

    def allocatable(self) -> podresources_pb2.AllocatableResourcesResponse:
        """Call ``GetAllocatableResources``: the devices the kubelet can allocate.

        Raises:
            PodResourcesError: any failure, classified (``unimplemented`` on kubelets older
                than 1.21 or with the feature gate off).

        """
        answer: podresources_pb2.AllocatableResourcesResponse = self._call(
            "GetAllocatableResources", podresources_pb2.AllocatableResourcesRequest()
        )
        return answer

    def _call(self, method: str, request: object) -> Any:
        stub = self._lister()
        began = time.monotonic()
        try:
            return getattr(stub, method)(request, timeout=self._timeout_s)
        except grpc.RpcError as err:
            # A failed channel would wait out grpcio's reconnect back-off (up to 2 min) before
            # dialling again; the next refresh gets a fresh one, so a restarted kubelet is seen
            # at once.
            self.close()
            raise self._classify(method, err, time.monotonic() - began) from None

    def _classify(self, method: str, err: grpc.RpcError, took_s: float) -> PodResourcesError:
        code = err.code() if hasattr(err, "code") else None
        details = (err.details() if hasattr(err, "details") else None) or ""
        where = f"{self.socket_path} {method}"
        if code is grpc.StatusCode.CANCELLED and took_s >= _DEADLINE_SHARE * self._timeout_s:
            # The kubelet (grpc-go) resets a stream whose deadline (the grpc-timeout we sent)
            # has passed with RST_STREAM CANCEL; that can arrive just before our own deadline
            # fires, and grpcio then reports CANCELLED: it is the deadline all the same.
            code = grpc.StatusCode.DEADLINE_EXCEEDED
        if code is grpc.StatusCode.UNAVAILABLE:
            found = probe_socket(self.socket_path)
            if found is not None:
                return found
            return PodResourcesError(Failure.UNAVAILABLE, f"{where}: unavailable: {details}")
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return PodResourcesError(
                Failure.DEADLINE_EXCEEDED,
                f"{where}: no answer within {self._timeout_s:g} s (kubernetes.timeout_s)",
            )
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" not in details:
            # the kubelet's own rate limit ("rejected by rate limit", 100 calls/s by default)
            return PodResourcesError(
                Failure.RATE_LIMITED,
                f"{where}: the kubelet refused the call ({details}); another client may be "
                "calling it too often",
            )
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            return PodResourcesError(
                Failure.RESPONSE_TOO_LARGE,
                f"{where}: the answer is larger than {self._max} bytes "
                f"(kubernetes.max_response_bytes): {details}",
            )
        if code is grpc.StatusCode.UNIMPLEMENTED:
            return PodResourcesError(Failure.UNIMPLEMENTED, f"{where}: not served: {details}")
        name = code.name if code is not None else "UNKNOWN"
        return PodResourcesError(Failure.ERROR, f"{where}: {name}: {details}")

    def close(self) -> None:
        """Close the channel (a later call opens a new one)."""
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None
