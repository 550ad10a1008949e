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
import socket
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
                Failure.PERMISSION_DENIED, f"{path}: permission denied: {_PERMISSION_HINT}"
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
        try:
            return getattr(stub, method)(request, timeout=self._timeout_s)
        except grpc.RpcError as err:
            # A failed channel would wait out grpcio's reconnect back-off (up to 2 min) before
            # dialling again; the next refresh gets a fresh one, so a restarted kubelet is seen
            # at once.
            self.close()
            raise self._classify(method, err) from None

    def _classify(self, method: str, err: grpc.RpcError) -> PodResourcesError:
        code = err.code() if hasattr(err, "code") else None
        details = (err.details() if hasattr(err, "details") else None) or ""
        where = f"{self.socket_path} {method}"
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
