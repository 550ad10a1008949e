"""The go-plugin protocol pieces: cookie, versions, listeners, handshake, go-plugin services."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from concurrent import futures

import grpc
import pytest
from gpumetrics.runtime.parent import ParentWatcher
from gpumetrics.service.gate import join_pool
from gpumetrics.service.plugin import (
    COOKIE_KEY,
    COOKIE_VALUE,
    AutoMTLSUnsupportedError,
    CookieError,
    PluginEnvironment,
    PluginError,
    PluginListener,
    PluginServices,
    bind_tcp,
    bind_unix,
    encode_stdio_data,
    handshake_line,
    negotiate_version,
)

HOST_ENV = {COOKIE_KEY: COOKIE_VALUE, "PLUGIN_PROTOCOL_VERSIONS": "1"}


@pytest.mark.parametrize(
    ("offered", "supported", "expected"),
    [
        ("1", (1,), 1),
        ("3,1,2", (1, 2), 2),  # the host's order is not fixed: the highest shared wins
        ("2, 1", (1, 2), 2),
        ("5,6", (1, 2), 1),  # nothing shared: our lowest, so the host reports the mismatch
        (None, (1, 2), 1),
        ("x,2", (1, 2), 2),  # a non-integer item is skipped, as go-plugin does
    ],
)
def test_version_negotiation(offered, supported, expected):
    assert negotiate_version(offered, supported) == expected


def test_environment_is_parsed():
    env = PluginEnvironment.from_environ(
        {
            **HOST_ENV,
            "PLUGIN_MIN_PORT": "10000",
            "PLUGIN_MAX_PORT": "25000",
            "PLUGIN_MULTIPLEX_GRPC": "true",
        }
    )
    assert (env.app_version, env.min_port, env.max_port, env.multiplex) == (1, 10000, 25000, True)
    assert env.socket_group is None and env.socket_dir is None


@pytest.mark.parametrize(
    ("environ", "error", "text"),
    [
        ({}, CookieError, f"{COOKIE_KEY} variable is not set"),
        ({COOKIE_KEY: "nope"}, CookieError, "wrong value"),
        ({**HOST_ENV, "PLUGIN_CLIENT_CERT": "-----BEGIN"}, AutoMTLSUnsupportedError, "P-521"),
        ({**HOST_ENV, "PLUGIN_MIN_PORT": "ten"}, PluginError, "PLUGIN_MIN_PORT='ten'"),
        ({**HOST_ENV, "PLUGIN_MAX_PORT": "70000"}, PluginError, "PLUGIN_MAX_PORT='70000'"),
        (
            {**HOST_ENV, "PLUGIN_MIN_PORT": "20", "PLUGIN_MAX_PORT": "10"},
            PluginError,
            "PLUGIN_MIN_PORT value of 20 is greater than PLUGIN_MAX_PORT value of 10",
        ),
        ({**HOST_ENV, "PLUGIN_UNIX_SOCKET_GROUP": "no-such-group-x"}, PluginError, "no such group"),
    ],
)
def test_environment_errors_name_the_variable(environ, error, text):
    with pytest.raises(error, match=text):
        PluginEnvironment.from_environ(environ)


def test_handshake_lines():
    unix = PluginListener("unix", "/tmp/d/plugin.sock")
    assert handshake_line(1, unix) == "1|1|unix|/tmp/d/plugin.sock|grpc\n"
    assert handshake_line(2, unix, multiplex=True) == "1|2|unix|/tmp/d/plugin.sock|grpc||false\n"


def new_server():
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.so_reuseport", 0)]
    )


def test_unix_socket_lives_in_a_private_directory_under_the_host_dir(tmp_path):
    server = new_server()
    env = PluginEnvironment(app_version=1, socket_dir=str(tmp_path), socket_group=os.getgid())
    listener = bind_unix(server.add_insecure_port, env)
    try:
        private = os.path.dirname(listener.address)
        assert os.path.dirname(private) == str(tmp_path)
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o710
        assert stat.S_IMODE(os.stat(listener.address).st_mode) == 0o660
        assert os.stat(listener.address).st_gid == os.getgid()
    finally:
        server.stop(0).wait()
        listener.close()
    assert not os.path.exists(private)


def test_unix_socket_without_group_is_in_a_0700_directory(tmp_path):
    server = new_server()
    listener = bind_unix(
        server.add_insecure_port, PluginEnvironment(app_version=1, socket_dir=str(tmp_path))
    )
    try:
        assert stat.S_IMODE(os.stat(os.path.dirname(listener.address)).st_mode) == 0o700
    finally:
        server.stop(0).wait()
        listener.close()


def test_tcp_skips_busy_ports_within_the_range():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    # find a free neighbour to make a two-port range [busy, free]
    server = new_server()
    try:
        for candidate in (port + 1, port - 1):
            probe = socket.socket()
            try:
                probe.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            finally:
                probe.close()
            lo, hi = min(port, candidate), max(port, candidate)
            listener = bind_tcp(
                server.add_insecure_port, PluginEnvironment(1, min_port=lo, max_port=hi)
            )
            assert listener.network == "tcp"
            assert listener.address == f"127.0.0.1:{candidate}"
            break
        else:
            pytest.skip("no free neighbouring port")
    finally:
        server.stop(0).wait()
        busy.close()


def test_tcp_range_exhausted_is_an_error():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        with pytest.raises(PluginError, match=f"{port}..{port}"):
            bind_tcp(
                new_server().add_insecure_port, PluginEnvironment(1, min_port=port, max_port=port)
            )
    finally:
        busy.close()


def test_stdio_data_is_encoded_like_protobuf():
    assert encode_stdio_data(2, b"hi") == b"\x08\x02\x12\x02hi"
    assert encode_stdio_data(1, b"x" * 300)[:4] == b"\x08\x01\x12\xac"
    assert encode_stdio_data(0, b"") == b""


@pytest.fixture
def served():
    shutdown = threading.Event()
    services = PluginServices(shutdown.set)
    pool = futures.ThreadPoolExecutor(max_workers=4)
    server = grpc.server(pool, options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers(services.handlers())
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield services, shutdown, channel
    channel.close()
    server.stop(0).wait()
    assert join_pool(pool, time.monotonic() + 10), "the plugin services' threads did not end"


def test_controller_shutdown_answers_at_once_and_signals(served):
    _, shutdown, channel = served
    assert channel.unary_unary("/plugin.GRPCController/Shutdown")(b"", timeout=5) == b""
    assert shutdown.is_set()


def test_stdio_stream_stays_open_until_closed(served):
    services, _, channel = served
    call = channel.unary_stream("/plugin.GRPCStdio/StreamStdio")(b"", timeout=30)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.extend(call))
    reader.start()
    assert services.wait_for_streams(1, timeout_s=5)
    assert reader.is_alive()
    services.close()
    reader.join(5)
    assert not reader.is_alive() and got == []
    assert call.code() == grpc.StatusCode.OK


def test_stdio_stream_ends_when_the_host_cancels(served):
    services, _, channel = served
    call = channel.unary_stream("/plugin.GRPCStdio/StreamStdio")(b"", timeout=30)
    assert services.wait_for_streams(1, timeout_s=5)
    call.cancel()
    assert services.wait_for_streams(0, timeout_s=5)
    assert services.open_streams() == 0


def test_parent_watcher_fires_once_when_the_parent_changes():
    parents = iter([100, 100, 1])
    calls: list[str] = []
    watcher = ParentWatcher(lambda: calls.append("dead"), getppid=lambda: next(parents))
    assert not watcher.check()
    assert watcher.check()
    assert calls == ["dead"]
