"""Full names of the gRPC services the sidecar serves (health and reflection use them)."""

from __future__ import annotations

from grpc_health.v1 import health

from gpumetrics.v1 import logs_pull_pb2, profiler_pb2, pull_pb2

PULL_SERVICE: str = pull_pb2.DESCRIPTOR.services_by_name["MetricsPullService"].full_name
"""``gpumetrics.v1.MetricsPullService``."""

LOGS_PULL_SERVICE: str = logs_pull_pb2.DESCRIPTOR.services_by_name["LogsPullService"].full_name
"""``gpumetrics.v1.LogsPullService`` (GPU events as OTLP logs)."""

PROFILER_SERVICE: str = profiler_pb2.DESCRIPTOR.services_by_name[
    "ProfilerIntegrationService"
].full_name
"""``gpumetrics.v1.ProfilerIntegrationService``."""

HEALTH_SERVICE: str = health.SERVICE_NAME
"""``grpc.health.v1.Health``."""

REFLECTION_SERVICE = "grpc.reflection.v1alpha.ServerReflection"
"""grpcio-reflection's ``reflection.SERVICE_NAME`` (a test checks they are equal), named here
without importing grpcio-reflection, which only a server with reflection on loads."""

REFLECTION_V1_SERVICE = "grpc.reflection.v1.ServerReflection"
"""``grpc.reflection.v1.ServerReflection`` (same servicer, :mod:`gpumetrics.service.reflection`)."""

OVERALL_HEALTH: str = health.OVERALL_HEALTH
"""``""``: the health name of the server as a whole."""


def service_of(method: str) -> str:
    """Return the service part of a full method path (``/pkg.Service/Method`` → ``pkg.Service``)."""
    return method.lstrip("/").split("/", 1)[0]
