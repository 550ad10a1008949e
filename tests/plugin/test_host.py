"""Play the go-plugin host against the sidecar subprocess, as hashicorp/go-plugin's client does.

Environment, handshake parsing (nothing else ever on stdout), health ``plugin``, a pull,
``GRPCController/Shutdown`` with an open ``GRPCStdio`` stream, exit status 0 within go-plugin's
2 s; for a unix socket and for TCP in the host's port range. Wrong/missing cookie: exit 1.
"""

from __future__ import annotations

import os
import queue
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from gpumetrics.metrics import count_points
from gpumetrics.service.plugin import COOKIE_KEY, COOKIE_VALUE
from gpumetrics.v1 import pull_pb2, pull_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

GPUMETRICS = Path(sys.executable).with_name("gpumetrics")  # the console script of this venv
HANDSHAKE = re.compile(r"^1\|(\d+)\|(unix|tcp)\|([^|]+)\|grpc$")


def host_env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMETRICS_", "PLUGIN_"))}
    env.update(
        {
            COOKIE_KEY: COOKIE_VALUE,
            "PLUGIN_PROTOCOL_VERSIONS": "3,1",
            "PLUGIN_MIN_PORT": "10000",
            "PLUGIN_MAX_PORT": "25000",
            "PLUGIN_UNIX_SOCKET_DIR": str(tmp_path),
            # the profiler service's socket: never the machine's default one
            "GPUMETRICS_PROFILER_LISTEN": f"unix:{tmp_path / 'profiler.sock'}",
        }
    )
    env.update(extra)
    return env


class Plugin:
    """The child process with its stdout lines in a queue and stderr collected."""

    def __init__(self, args, env):
        assert GPUMETRICS.exists(), "install the package (pip install -e .) for the console script"
        self.proc = subprocess.Popen(
            [str(GPUMETRICS), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        self._out = threading.Thread(target=self._pump_out, daemon=True)
        self._err = threading.Thread(target=self._pump_err, daemon=True)
        self._out.start()
        self._err.start()

    def _pump_out(self):
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _pump_err(self):
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def rest_of_stdout(self):
        self._out.join(10)
        rest: list[str] = []
        while True:
            item = self.lines.get_nowait()
            if item is None:
                return rest
            rest.append(item)

    def finish(self, timeout=10):
        rc = self.proc.wait(timeout)
        self._err.join(10)
        return rc

    def kill(self):
        """Teardown: kill the child if it runs, join the threads reading its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._out.join(10)  # both end at the end of their pipe
        self._err.join(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def wait_serving(channel, name, timeout=30):
    stub = health_pb2_grpc.HealthStub(channel)
    for response in stub.Watch(health_pb2.HealthCheckRequest(service=name), timeout=timeout):
        if response.status == health_pb2.HealthCheckResponse.SERVING:
            return True
    return False


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_go_plugin_host_lifecycle(tmp_path, transport):
    plugin = Plugin(["serve", "--simulate", "--plugin-transport", transport], host_env(tmp_path))
    try:
        first = plugin.lines.get(timeout=60)
        assert first is not None, "".join(plugin.stderr)
        match = HANDSHAKE.match(first.rstrip("\n"))
        assert match, first
        version, network, address = match.groups()
        assert (version, network) == ("1", transport)
        if transport == "unix":
            assert os.path.isabs(address) and os.path.dirname(os.path.dirname(address)) == str(
                tmp_path
            )
            target = "unix:" + address
        else:
            host, port = address.rsplit(":", 1)
            assert host == "127.0.0.1" and 10000 <= int(port) <= 25000
            target = address
        channel = grpc.insecure_channel(target)
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(service="plugin"), timeout=5).status == (
            health_pb2.HealthCheckResponse.SERVING
        )
        # go-plugin opens the stdio stream right away and keeps it open
        stdio = channel.unary_stream("/plugin.GRPCStdio/StreamStdio")(b"", timeout=60)
        stdio_items: list[bytes] = []
        stdio_reader = threading.Thread(target=lambda: stdio_items.extend(stdio), daemon=True)
        stdio_reader.start()
        assert wait_serving(channel, "")
        response = pull_pb2_grpc.MetricsPullServiceStub(channel).Pull(
            pull_pb2.PullRequest(consumer="host"), timeout=10
        )
        request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(
            response.export_metrics_service_request
        )
        assert count_points(request) >= 1
        names = {
            m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        }
        assert {"hw.power", "hw.gpu.utilization", "hw.gpu.memory.usage"} <= names

        assert channel.unary_unary("/plugin.GRPCController/Shutdown")(b"", timeout=5) == b""
        rc = plugin.finish(timeout=10)
        assert rc == 0, "".join(plugin.stderr)
        # It stopped by itself, in order: the shutdown ran to its end ("stopped", below) and the
        # watchdog that ends the process before go-plugin's 2 s kill never had to fire. (How
        # long it took is a timing, not a test; the bound is test_watchdog_fires_before_the_kill.)
        assert not any("shutdown did not finish" in line for line in plugin.stderr)
        assert plugin.rest_of_stdout() == []  # nothing but the handshake ever reached stdout
        stdio_reader.join(5)
        assert stdio_items == []
        channel.close()
        if transport == "unix":
            assert not os.path.exists(address)
        assert any('"@message": "stopped"' in line for line in plugin.stderr), "".join(
            plugin.stderr
        )
        # hclog-compatible stderr: JSON lines with string @level/@message/@timestamp, or other lines
        json_lines = [line for line in plugin.stderr if line.startswith("{")]
        assert json_lines and all(
            '"@level": "' in line and '"@timestamp": "' in line for line in json_lines
        )
    finally:
        plugin.kill()


@pytest.mark.parametrize(
    ("extra", "args", "text"),
    [
        ({COOKIE_KEY: "wrong"}, ["serve"], "wrong value"),
        ({"PLUGIN_CLIENT_CERT": "-----BEGIN CERTIFICATE-----"}, ["serve"], "AutoMTLS"),
    ],
)
def test_plugin_mode_refusals_exit_1_with_a_message(tmp_path, extra, args, text):
    plugin = Plugin(args, host_env(tmp_path, **extra))
    try:
        assert plugin.finish(timeout=60) == 1
        assert plugin.rest_of_stdout() == []
        assert text in "".join(plugin.stderr)
    finally:
        plugin.kill()


@pytest.mark.parametrize(
    ("extra", "args", "first"),
    [
        (
            {"GPUMETRICS_BATCH_INTERVAL_S": "soon"},
            ["serve", "--plugin", "--simulate"],
            "[ERROR] gpumetrics: 'runtime.batch_interval_s' (from GPUMETRICS_BATCH_INTERVAL_S="
            "'soon'): Input should be a valid number",
        ),
        (
            {},
            ["serve", "--plugin", "--simulate", "h100-8x"],
            "[ERROR] gpumetrics: 'runtime.simulate' (from flag --simulate): h100-8x: no such "
            "profile, field case or file; built-in profiles: ",
        ),
    ],
)
def test_plugin_mode_config_errors_exit_2_before_any_handshake(tmp_path, extra, args, first):
    """In go-plugin mode a configuration error is one ``[ERROR]`` line per problem (go-plugin
    logs that prefix at ERROR; an unprefixed line would be DEBUG) and exit status 2, with
    nothing on stdout: the receiver quotes the line and the status in its start error."""
    plugin = Plugin(args, host_env(tmp_path, **extra))
    try:
        assert plugin.finish(timeout=60) == 2
        assert plugin.rest_of_stdout() == []
        lines = [line for line in plugin.stderr if not line.startswith("[WARN]")]
        assert lines and lines[0].startswith(first), plugin.stderr
        assert all(line.startswith("[ERROR] gpumetrics: ") for line in lines), lines
    finally:
        plugin.kill()


def test_missing_cookie_with_plugin_flag_exits_1(tmp_path):
    env = {k: v for k, v in host_env(tmp_path).items() if k != COOKIE_KEY}
    plugin = Plugin(["serve", "--plugin"], env)
    try:
        assert plugin.finish(timeout=60) == 1
        assert COOKIE_KEY in "".join(plugin.stderr)
        assert plugin.rest_of_stdout() == []
    finally:
        plugin.kill()


def test_tcp_port_range_with_every_port_busy_exits_1(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = str(busy.getsockname()[1])
    try:
        plugin = Plugin(
            ["serve", "--plugin-transport", "tcp"],
            host_env(tmp_path, PLUGIN_MIN_PORT=port, PLUGIN_MAX_PORT=port),
        )
        try:
            assert plugin.finish(timeout=60) == 1
            assert f"{port}..{port}" in "".join(plugin.stderr)
            assert plugin.rest_of_stdout() == []
        finally:
            plugin.kill()
    finally:
        busy.close()


@pytest.mark.parametrize("shutdown_timeout_s", [0.01, 0.5, 1.5, 1.999])
def test_watchdog_fires_before_the_kill(shutdown_timeout_s):
    # Every valid plugin.shutdown_timeout_s (0 < t < 2) leaves the plugin time to exit by itself
    # before go-plugin kills it, and the orderly shutdown gets its whole budget first.
    from gpumetrics.config import SidecarConfig
    from gpumetrics.runtime.run import GO_PLUGIN_KILL_AFTER_S, watchdog_delay_s

    SidecarConfig.model_validate({"plugin": {"shutdown_timeout_s": shutdown_timeout_s}})
    delay = watchdog_delay_s(shutdown_timeout_s)
    assert delay < GO_PLUGIN_KILL_AFTER_S == 2.0
    assert delay >= min(shutdown_timeout_s, 1.9)
