"""``push.endpoint`` forms: a TCP endpoint without a port is refused when the configuration is
loaded (grpc would dial port 443 and retry for ever), naming the setting."""

from __future__ import annotations

import pytest
from gpumetrics.config import ConfigError, load_config


@pytest.mark.parametrize(
    "endpoint",
    ["collector:4317", "127.0.0.1:4317", "[::1]:4317", "unix:/run/otelcol.sock", "dns:///c:4317"],
)
def test_endpoints_grpc_reads_as_written_are_accepted(endpoint: str) -> None:
    config = load_config(None, environ={"GPUMETRICS_PUSH_ENDPOINT": endpoint})
    assert config.push.endpoint == endpoint


@pytest.mark.parametrize("endpoint", ["localhost", "collector", "[::1]", "collector:0", "c:http"])
def test_an_endpoint_without_a_usable_port_names_the_setting(endpoint: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={"GPUMETRICS_PUSH_ENDPOINT": endpoint})
    message = str(info.value)
    assert "'push.endpoint'" in message and "GPUMETRICS_PUSH_ENDPOINT" in message, message
    assert "needs a port 1..65535 (grpc would dial port 443)" in message, message
