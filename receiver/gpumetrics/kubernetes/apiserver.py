"""Reads this node's ResourceSlices from the Kubernetes API server (``kubernetes.dra``).

Off by default: the sidecar talks to the API server only when ``kubernetes.dra.resource_slices``
is set, and then makes one kind of call, a ``list`` of ``resourceslices`` (group
``resource.k8s.io``, cluster-scoped) restricted to this node with the field selector
``spec.nodeName=<node>`` (a selectable field of ResourceSlices), paged with ``limit`` and
``continue``. It needs a ClusterRole allowing ``list`` on ``resourceslices`` (the Helm chart's
``podAttribution.dra.resourceSlices`` adds it) and the service account token mounted.

Versions: ``resource.k8s.io/v1`` (Kubernetes 1.34+) is asked first; an API server that does
not serve it (404) is asked ``v1beta2`` (1.33), then ``v1beta1`` (1.32), and the version that
answered is kept. The token is read from ``token_file`` at every read (projected service
account tokens are rotated), the CA bundle from ``ca_file``. The whole answer is bounded by
``kubernetes.max_response_bytes``.

Every failure is a :class:`ResourceSliceError` of one :class:`SliceFailure` kind with a message
that says what to do; :class:`SliceCache` keeps the last index read, reads again when due, and
logs each kind of failure once (RBAC missing, no DRA API, unreachable, ...).
"""

from __future__ import annotations

import enum
import json
import logging
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gpumetrics.kubernetes.dra import ClaimDevice, index_resource_slices
from gpumetrics.kubernetes.settings import DRASettings, KubernetesSettings
from gpumetrics.selftelemetry import SelfTelemetry

__all__ = [
    "ResourceSliceError",
    "ResourceSliceReader",
    "SliceCache",
    "SliceFailure",
    "SliceSource",
    "api_server_url",
]

SLICE_READS = "gpumetrics.kubernetes.resource_slice_reads"

VERSIONS = ("v1", "v1beta2", "v1beta1")
"""``resource.k8s.io`` versions asked, newest first."""

PAGE_SIZE = 100
"""ResourceSlices per page (``limit``); a node has a few (one per driver and pool)."""


class SliceFailure(enum.StrEnum):
    """Why reading ResourceSlices failed (``gpumetrics.kubernetes.resource_slice_reads``)."""

    NOT_CONFIGURED = "not_configured"
    FORBIDDEN = "forbidden"
    NOT_SERVED = "not_served"
    UNAVAILABLE = "unavailable"
    RESPONSE_TOO_LARGE = "response_too_large"
    ERROR = "error"


class ResourceSliceError(Exception):
    """Reading ResourceSlices failed; :attr:`kind` says why, the message says what to do."""

    def __init__(self, kind: SliceFailure, message: str) -> None:
        super().__init__(message)
        self.kind = kind


_RBAC_HINT = (
    "the sidecar's service account needs a ClusterRole allowing list on resourceslices "
    "(resource.k8s.io); the Helm chart adds it with podAttribution.dra.resourceSlices=true"
)


def api_server_url(settings: DRASettings, environ: Any = os.environ) -> str | None:
    """Return the API server's base URL: ``kubernetes.dra.api_server``, else in-cluster.

    In a pod the kubelet sets ``KUBERNETES_SERVICE_HOST`` and ``KUBERNETES_SERVICE_PORT``
    (client-go's ``rest.InClusterConfig`` reads the same). None when neither is known.

    >>> api_server_url(DRASettings(), {"KUBERNETES_SERVICE_HOST": "10.0.0.1",
    ...                                "KUBERNETES_SERVICE_PORT": "443"})
    'https://10.0.0.1:443'
    >>> api_server_url(DRASettings(), {"KUBERNETES_SERVICE_HOST": "fd00::1",
    ...                                "KUBERNETES_SERVICE_PORT": "443"})
    'https://[fd00::1]:443'
    """
    if settings.api_server:
        return settings.api_server.rstrip("/")
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


class ResourceSliceReader:
    """Lists this node's ResourceSlices and indexes their devices' UUIDs.

    Args:
        settings: ``kubernetes.dra``.
        node_name: this node's name (``identity.node_name``), the slices' ``spec.nodeName``.
        timeout_s: deadline of each HTTP request (s).
        max_bytes: the most bytes of all pages together (By).
        environ: where the in-cluster address is read (tests inject their own).

    Not thread-safe: :class:`~gpumetrics.kubernetes.attribution.PodAttribution` calls it from
    its refresher thread.

    """

    def __init__(
        self,
        settings: DRASettings,
        node_name: str,
        timeout_s: float,
        max_bytes: int,
        environ: Any = os.environ,
    ) -> None:
        self._settings = settings
        self._node = node_name
        self._timeout_s = timeout_s
        self._max = max_bytes
        self._base = api_server_url(settings, environ)
        self._versions: tuple[str, ...] = VERSIONS

    @property
    def where(self) -> str:
        """The API server's address (for log lines), or ``(no API server)``."""
        return self._base or "(no API server)"

    def read(self) -> dict[ClaimDevice, str]:
        """List this node's ResourceSlices; return the UUID of each GPU device they name.

        Raises:
            ResourceSliceError: any failure, classified, with what to do.

        """
        if self._base is None:
            raise ResourceSliceError(
                SliceFailure.NOT_CONFIGURED,
                "no API server: KUBERNETES_SERVICE_HOST/PORT are not set and "
                "kubernetes.dra.api_server is empty",
            )
        context = self._tls()
        token = self._token()
        for version in self._versions:
            try:
                items = self._list(version, context, token)
            except _NotServed:
                continue
            self._versions = (version,)  # the version this API server serves, from now on
            return index_resource_slices({"items": items}, self._settings.drivers)
        raise ResourceSliceError(
            SliceFailure.NOT_SERVED,
            f"{self._base} serves no ResourceSlices (resource.k8s.io {', '.join(VERSIONS)}: "
            "404): DRA needs Kubernetes 1.32+ with the resource.k8s.io API enabled",
        )

    def _tls(self) -> ssl.SSLContext:
        try:
            return ssl.create_default_context(cafile=self._settings.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ResourceSliceError(
                SliceFailure.NOT_CONFIGURED,
                f"kubernetes.dra.ca_file {self._settings.ca_file}: {_why(exc)}",
            ) from None

    def _token(self) -> str:
        try:
            with open(self._settings.token_file, encoding="utf-8") as f:
                token = f.read(16384).strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ResourceSliceError(
                SliceFailure.NOT_CONFIGURED,
                f"kubernetes.dra.token_file {self._settings.token_file}: {_why(exc)}: mount the "
                "service account token (automountServiceAccountToken; the Helm chart does with "
                "podAttribution.dra.resourceSlices=true)",
            ) from None
        if not token:
            raise ResourceSliceError(
                SliceFailure.NOT_CONFIGURED,
                f"kubernetes.dra.token_file {self._settings.token_file}: the file is empty",
            )
        return token

    def _list(self, version: str, context: ssl.SSLContext, token: str) -> list[Any]:
        items: list[Any] = []
        left = self._max
        cont = ""
        while True:
            query = {"fieldSelector": f"spec.nodeName={self._node}", "limit": str(PAGE_SIZE)}
            if cont:
                query["continue"] = cont
            url = (
                f"{self._base}/apis/resource.k8s.io/{version}/resourceslices?"
                + urllib.parse.urlencode(query)
            )
            body = self._get(url, context, token, left)
            left -= len(body)
            try:
                page = json.loads(body)
                items.extend(page["items"] or [])
                cont = (page.get("metadata") or {}).get("continue") or ""
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ResourceSliceError(
                    SliceFailure.ERROR, f"{url}: not a ResourceSliceList: {exc!r}"
                ) from None
            if not cont:
                return items

    def _get(self, url: str, context: ssl.SSLContext, token: str, left: int) -> bytes:
        request = urllib.request.Request(  # noqa: S310 - an https URL from the settings
            url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"}
        )
        try:
            with urllib.request.urlopen(  # noqa: S310
                request, timeout=self._timeout_s, context=context
            ) as response:
                body: bytes = response.read(left + 1)
        except urllib.error.HTTPError as err:
            raise self._http_error(url, err) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ResourceSliceError(
                SliceFailure.UNAVAILABLE,
                f"{self._base}: {_why(reason)}: the API server does not answer",
            ) from None
        if len(body) > left:
            raise ResourceSliceError(
                SliceFailure.RESPONSE_TOO_LARGE,
                f"{url}: the ResourceSlices are larger than {self._max} bytes "
                "(kubernetes.max_response_bytes)",
            )
        return body

    def _http_error(self, url: str, err: urllib.error.HTTPError) -> Exception:
        try:
            detail = _status_message(err.read(4096))
        except OSError:
            detail = err.reason or "(no message)"
        finally:
            err.close()
        if err.code == 404:
            return _NotServed()
        if err.code in (401, 403):
            return ResourceSliceError(
                SliceFailure.FORBIDDEN, f"{url}: {err.code} {detail}: {_RBAC_HINT}"
            )
        return ResourceSliceError(SliceFailure.ERROR, f"{url}: {err.code} {detail}")


class _NotServed(Exception):
    """The API server does not serve this version of ResourceSlices (404)."""


def _why(exc: object) -> str:
    return str(getattr(exc, "strerror", None) or exc)


def _status_message(body: bytes) -> str:
    """Return the ``message`` of the ``Status`` object an API server error carries."""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    if isinstance(message, str) and message:
        return message[:300]
    return body[:300].decode("utf-8", "replace").strip() or "(no message)"


class SliceSource(Protocol):
    """What :class:`SliceCache` needs of :class:`ResourceSliceReader`."""

    @property
    def where(self) -> str:
        """The API server's address, for log lines."""

    def read(self) -> Mapping[ClaimDevice, str]:
        """Map this node's claim devices to GPU UUIDs; raises :class:`ResourceSliceError`."""


class SliceCache:
    """The last ResourceSlice index read, read again when due.

    Args:
        reader: the reader, or None when ``kubernetes.dra.resource_slices`` is off.
        settings: the ``kubernetes`` settings (both refresh intervals, the DRA drivers).
        telemetry: where reads are counted (``gpumetrics.kubernetes.resource_slice_reads``).
        log: the ``gpumetrics.kubernetes`` logger.
        clock: monotonic seconds.

    Used from the refresher thread only.

    """

    def __init__(
        self,
        reader: SliceSource | None,
        settings: KubernetesSettings,
        telemetry: SelfTelemetry,
        log: logging.Logger,
        clock: Callable[[], float],
    ) -> None:
        self._reader = reader
        self._settings = settings
        self._telemetry = telemetry
        self._log = log
        self._clock = clock
        self._index: Mapping[ClaimDevice, str] | None = None
        self._at: float | None = None
        self._failures: set[str] = set()

    @property
    def state(self) -> str:
        """``off`` (no reader), ``unread`` (no read has succeeded yet) or ``read``."""
        if self._reader is None:
            return "off"
        return "unread" if self._index is None else "read"

    def current(self, needed: frozenset[ClaimDevice]) -> Mapping[ClaimDevice, str] | None:
        """Return the index, read again first when due.

        Due: never read, older than ``kubernetes.dra.refresh_interval_s``, or (at most every
        ``kubernetes.refresh_interval_s``) a device of ``needed`` that it does not name. A
        failed read keeps the last index and is logged once per kind until a read succeeds.
        """
        if self._reader is None:
            return None
        now = self._clock()
        since = None if self._at is None else now - self._at
        index = self._index
        unknown = bool(needed) and (index is None or not needed <= index.keys())
        due = (
            since is None
            or since >= self._settings.dra.refresh_interval_s
            or (unknown and since >= self._settings.refresh_interval_s)
        )
        if not due:
            return index
        self._at = now
        try:
            fresh = self._reader.read()
        except ResourceSliceError as err:
            self._telemetry.add(SLICE_READS, 1, {"outcome": err.kind.value})
            level = logging.DEBUG if err.kind.value in self._failures else logging.WARNING
            self._failures.add(err.kind.value)
            self._log.log(level, "pod attribution: reading ResourceSlices: %s", err)
            return index
        self._telemetry.add(SLICE_READS, 1, {"outcome": "ok"})
        if self._failures or index is None:
            self._log.info(
                "pod attribution: read this node's ResourceSlices from %s: %d GPU device(s) of %s",
                self._reader.where,
                len(fresh),
                ", ".join(self._settings.dra.drivers),
            )
        self._failures.clear()
        self._index = fresh
        return fresh
