"""Running the sidecar until it is told to stop: standalone, or as a go-plugin plugin.

Standalone: SIGTERM and SIGINT request a graceful shutdown within
``runtime.shutdown_timeout_s``; exit 0.

go-plugin (hashicorp/go-plugin's guide to non-Go plugins,
https://github.com/hashicorp/go-plugin/blob/main/docs/guide-plugin-write-non-go.md, and
``server.go``): the caller already redirected fd 1 to
stderr and kept the real stdout for :func:`serve_plugin`. The cookie and the host's variables
are checked; the server gets a listener chosen by the plugin protocol (unix socket in a private
directory, or 127.0.0.1 in the host's port range) plus go-plugin's Controller and Stdio
services and health name ``plugin`` (SERVING while the process serves); it is **started before**
the handshake line is written and flushed. SIGINT is ignored (the host owns shutdown);
SIGTERM, ``GRPCController/Shutdown`` and the death of the parent process stop it within
``plugin.shutdown_timeout_s`` (< 2 s, after which go-plugin kills); a watchdog ends the process
with ``os._exit`` if a step hangs past that.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from gpumetrics.config import SidecarConfig
from gpumetrics.runtime.memory import return_large_buffers_to_the_os
from gpumetrics.runtime.parent import ParentWatcher
from gpumetrics.runtime.sidecar import Sidecar
from gpumetrics.service.auth import AuthPolicy
from gpumetrics.service.plugin import (
    HEALTH_SERVICE_NAME,
    PluginEnvironment,
    PluginServices,
    bind_tcp,
    bind_unix,
    handshake_line,
)

__all__ = ["serve_plugin", "serve_standalone"]

log = logging.getLogger(__name__)

SidecarFactory = Callable[..., Sidecar]


def _install_signals(sidecar: Sidecar, ignore_sigint: bool) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers (tests run in-process)
    signal.signal(signal.SIGTERM, lambda _s, _f: sidecar.request_stop("SIGTERM"))
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGINT, lambda _s, _f: sidecar.request_stop("SIGINT"))


def _exit_code(sidecar: Sidecar) -> int:
    """Return 0, or the code the collector asked for (``nvml.library.EXIT_VERSION_MISMATCH``)."""
    return sidecar.collector_exit_code() or 0


def serve_standalone(config: SidecarConfig, make: SidecarFactory = Sidecar, **kwargs: Any) -> int:
    """Run until SIGTERM/SIGINT (or ``sidecar.request_stop``); return the exit code."""
    return_large_buffers_to_the_os()
    sidecar = make(config, **kwargs)
    _install_signals(sidecar, ignore_sigint=False)
    try:
        sidecar.start()
    except BaseException:
        sidecar.shutdown(config.runtime.shutdown_timeout_s, failed_start=True)  # undo, quietly
        raise
    sidecar.wait()
    sidecar.shutdown(config.runtime.shutdown_timeout_s)
    return _exit_code(sidecar)


def serve_plugin(
    config: SidecarConfig,
    handshake_out: TextIO,
    environ: Mapping[str, str] | None = None,
    make: SidecarFactory = Sidecar,
    **kwargs: Any,
) -> int:
    """Run as a go-plugin plugin (see the module docstring); return the exit code.

    Raises:
        gpumetrics.service.plugin.PluginError: bad cookie, AutoMTLS requested, bad host
            variables, or no listener could be bound (the caller prints it and exits 1).

    """
    env = PluginEnvironment.from_environ(os.environ if environ is None else environ)
    return_large_buffers_to_the_os()
    server_settings = config.server.model_copy(update={"listen": []})
    sidecar = make(config, server_settings=server_settings, **kwargs)
    server = sidecar.parts.server
    services = PluginServices(lambda: sidecar.request_stop("GRPCController/Shutdown"))
    server.add_service(
        lambda s: s.add_generic_rpc_handlers(services.handlers()),
        ["plugin.GRPCController", "plugin.GRPCStdio"],
        AuthPolicy.NONE,
    )
    add_port = server.add_listener
    listener = (
        bind_tcp(add_port, env) if config.plugin.transport == "tcp" else bind_unix(add_port, env)
    )
    sidecar.parts.health.add_service(HEALTH_SERVICE_NAME, follow_ready=False)
    _install_signals(sidecar, ignore_sigint=True)
    watcher = ParentWatcher(
        lambda: sidecar.request_stop("parent exited"), config.plugin.parent_check_interval_s
    )
    try:
        sidecar.start()
        handshake_out.write(handshake_line(env.app_version, listener, env.multiplex))
        handshake_out.flush()
        handshake_out.close()
        log.info(
            "go-plugin handshake sent",
            extra={"network": listener.network, "address": listener.address},
        )
        watcher.start()
        sidecar.wait()
        timeout = config.plugin.shutdown_timeout_s
        _watchdog(watchdog_delay_s(timeout))
        services.close()
        sidecar.shutdown(timeout)
    finally:
        watcher.stop(0.5)
        listener.close()
    return _exit_code(sidecar)


GO_PLUGIN_KILL_AFTER_S = 2.0
"""go-plugin's host kills a plugin this long after ``GRPCController/Shutdown`` (``client.go``)."""


def watchdog_delay_s(shutdown_timeout_s: float) -> float:
    """When the plugin watchdog ends the process (s after shutdown began).

    300 ms after the orderly shutdown's budget, but always 100 ms before go-plugin's kill, so
    the plugin exits by itself (status 0) whatever ``plugin.shutdown_timeout_s`` says.
    """
    return min(shutdown_timeout_s + 0.3, GO_PLUGIN_KILL_AFTER_S - 0.1)


def _watchdog(after_s: float) -> None:
    """End the process with status 0 if the orderly shutdown hangs past ``after_s``."""

    def fire() -> None:
        log.error("shutdown did not finish in %.1fs: exiting now", after_s)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(0)

    timer = threading.Timer(after_s, fire)
    timer.daemon = True
    timer.start()
