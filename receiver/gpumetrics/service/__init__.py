"""The sidecar's gRPC services and their server (``docs/protocol.md``, ``docs/security.md``).

One module per service (style item 14): :mod:`.pull` (``MetricsPullService``),
:mod:`.logs_pull` (``LogsPullService``, GPU events), :mod:`.profiler`
(``ProfilerIntegrationService``), :mod:`.health`; plus :mod:`.auth` (bearer tokens),
:mod:`.gate` (the interceptor: tokens, stream slots, malformed requests), :mod:`.tls`,
:mod:`.peercred` (``SO_PEERCRED`` of unix-socket callers, through a relay), :mod:`.declarers`
(who may declare which process), :mod:`.settings` (``ServerSettings``) and :mod:`.server`
(``SidecarServer``).
"""

from gpumetrics.service.auth import AuthPolicy, TokenAuth, read_token_file
from gpumetrics.service.health import SidecarHealth
from gpumetrics.service.logs_pull import LogsPullServicer
from gpumetrics.service.names import (
    HEALTH_SERVICE,
    LOGS_PULL_SERVICE,
    OVERALL_HEALTH,
    PROFILER_SERVICE,
    PULL_SERVICE,
    REFLECTION_SERVICE,
    REFLECTION_V1_SERVICE,
)
from gpumetrics.service.profiler import DECLARER_METADATA_KEY, DeclaredStoreAPI, ProfilerServicer
from gpumetrics.service.pull import PullServicer
from gpumetrics.service.server import BoundAddresses, ListenError, SidecarServer
from gpumetrics.service.settings import (
    DEFAULT_LISTEN,
    DEFAULT_PULL_MAX_BYTES,
    ListenAddress,
    ServerSettings,
    parse_listen_address,
)

__all__ = [
    "DECLARER_METADATA_KEY",
    "DEFAULT_LISTEN",
    "DEFAULT_PULL_MAX_BYTES",
    "HEALTH_SERVICE",
    "LOGS_PULL_SERVICE",
    "OVERALL_HEALTH",
    "PROFILER_SERVICE",
    "PULL_SERVICE",
    "REFLECTION_SERVICE",
    "REFLECTION_V1_SERVICE",
    "AuthPolicy",
    "BoundAddresses",
    "DeclaredStoreAPI",
    "ListenAddress",
    "LogsPullServicer",
    "ProfilerServicer",
    "PullServicer",
    "ServerSettings",
    "SidecarHealth",
    "ListenError",
    "SidecarServer",
    "TokenAuth",
    "parse_listen_address",
    "read_token_file",
]
