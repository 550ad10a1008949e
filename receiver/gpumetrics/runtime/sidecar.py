"""The sidecar runtime: builds and wires collector → producer → batcher → store → server (+ push).

GPU events run beside the metrics: the collector's event listener → ``EventProducer`` → the
batcher (one log batch with each metric batch) → the log store → ``LogsPullService`` (+ push
with OTLP ``LogsService.Export``), unless ``events.enabled`` is false.

Start order (``docs/architecture.md``, runtime contracts): the simulated driver is installed
first when asked; then the server starts listening (health ``""`` NOT_SERVING), pod attribution
starts reading the kubelet (when on, ``docs/kubernetes.md``), the collector starts (NVML init
retried in the background), the batcher starts, and push starts. Health turns SERVING after the
first batch that follows ``Collector.ready``; after each batch the NVML liveness gate
(``runtime.liveness``) turns ``""`` and the pull service NOT_SERVING while NVML has been down
longer than ``runtime.unhealthy_after_nvml_down_s``.

Shutdown order (:meth:`Sidecar.shutdown`), all inside one time budget: health NOT_SERVING and the
server stops accepting (calls in flight get a short grace); the batcher stops; the collector
stops (its workers are joined before it calls ``nvmlShutdown``, exactly once); pod attribution
stops; one last batch
takes what was recorded since; push flushes it; done.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import gpumetrics
from gpumetrics.config import ConfigError, SidecarConfig
from gpumetrics.config.model import batch_cap
from gpumetrics.events import EventProducer
from gpumetrics.identity import (
    DeclaredStore,
    IdentityMode,
    ProcfsReader,
    check_profiler_mode_rules,
    is_observed_key,
    load_relabel_configs,
    new_process_resourcer,
    process_observer,
)
from gpumetrics.metrics import Producer
from gpumetrics.nvml.context import DEFAULT_PID_MAX
from gpumetrics.runtime.batcher import Batcher
from gpumetrics.runtime.liveness import NvmlLiveness
from gpumetrics.runtime.simulation import (
    default_profile,
    install_simulation,
    uninstall_simulation,
)
from gpumetrics.runtime.summary import NvmlFacts, StartupSummary
from gpumetrics.selftelemetry import SelfTelemetry, Telemetry, WithAttributes
from gpumetrics.service import ListenError, ServerSettings, SidecarHealth, SidecarServer
from gpumetrics.service.declarers import Observation
from gpumetrics.service.errors import SettingError
from gpumetrics.store import (
    BatchStore,
    SqliteJournal,
    StorePathError,
    StoreRefusedError,
    signals,
)

if TYPE_CHECKING:  # imported where they are configured: an idle subsystem costs no memory
    from gpumetrics.kubernetes.attribution import PodAttribution
    from gpumetrics.service.push import PushExporter

__all__ = ["CollectorLike", "Sidecar", "SidecarParts", "default_collector_factory"]

log = logging.getLogger(__name__)


class CollectorLike(Protocol):
    """What the runtime needs of ``gpumetrics.nvml.collector.Collector``.

    Optionally also ``exit_requested: threading.Event`` and ``exit_code: int | None``: the
    collector asks the process to exit non-zero (NVML library/driver mismatch, F12); and
    ``nvml_down_s() -> float | None`` / ``nvml_reason``: how long NVML has been down, which
    health follows (``runtime.liveness``, F32).
    ``attach_events(sink, settings)``: the collector listens for NVML events into ``sink``.
    """

    ready: threading.Event

    def start(self) -> None:
        """Start collecting; return at once."""

    def begin_stop(self) -> None:
        """Stop scheduling and tell the event listener to end; return at once (no NVML call)."""

    def stop(self, timeout_s: float = ...) -> object:
        """Stop scheduling, join the workers, then ``nvmlShutdown`` once."""


CollectorFactory = Callable[[Producer, Any, Telemetry], CollectorLike]
"""``(producer, CollectionSettings, telemetry) -> collector``."""


def default_collector_factory(
    producer: Producer, settings: Any, telemetry: Telemetry
) -> CollectorLike:
    """Build the real NVML collector (imported lazily: only ``serve`` needs ``pynvml``)."""
    from gpumetrics.nvml.collector import Collector

    collector: CollectorLike = Collector(producer, settings, telemetry=telemetry)
    return collector


@dataclass
class SidecarParts:
    """Everything :class:`Sidecar` built (for tests and for the go-plugin mode)."""

    telemetry: Telemetry
    health: SidecarHealth
    producer: Producer
    store: BatchStore
    declared: DeclaredStore
    server: SidecarServer
    collector: CollectorLike
    batcher: Batcher
    push: PushExporter | None
    attribution: PodAttribution | None = None
    events: EventProducer | None = None
    logs_store: BatchStore | None = None
    push_logs: PushExporter | None = None


def _simulated_node_config(config: SidecarConfig) -> SidecarConfig:
    """Return the configuration for a simulated node.

    The simulated node's pids are not this machine's, so unless ``collection.pid_max`` is set
    they are checked against Linux's largest ``pid_max`` (2^22) rather than this machine's
    ``/proc/sys/kernel/pid_max``, which would discard a profile's process lists as implausible
    (a container's default is 32768).
    """
    if config.collection.pid_max is not None:
        return config
    collection = config.collection.model_copy(update={"pid_max": DEFAULT_PID_MAX})
    return config.model_copy(update={"collection": collection})


def _host_attributes(config: SidecarConfig, node: str, in_k8s: bool) -> dict[str, Any]:
    ident = config.identity
    attrs: dict[str, Any] = {}
    if in_k8s:
        attrs["k8s.node.name"] = node
        if ident.host_name:
            attrs["host.name"] = ident.host_name
    else:
        attrs["host.name"] = ident.host_name or node
    return attrs


class Sidecar:
    """One sidecar process's components and their lifecycle.

    Args:
        config: validated configuration.
        server_settings: overrides ``config.server`` (go-plugin mode passes one without
            ``listen``, then adds its own listener).
        collector_factory: builds the collector (tests pass a stub).
        simulate: installs the simulated driver (default :func:`install_simulation`).
        batch_wait: the batcher's ``wait(seconds) -> bool`` (tests drive batches themselves).
        environ: where ``KUBERNETES_SERVICE_HOST`` is looked up.
        config_file: the configuration file that was loaded (named in the start-up summary).

    When ready (the first collection stored) it logs one INFO line, the start-up summary
    (:mod:`gpumetrics.runtime.summary`).

    Raises (from the constructor): :class:`ConfigError` naming the setting (``server.*``,
    ``identity.relabel_config``, ``push.*``, ``runtime.simulate``) of a file or profile that cannot
    be used: a token or TLS file, relabel rules, push certificates, the simulated profile.

    """

    def __init__(
        self,
        config: SidecarConfig,
        server_settings: ServerSettings | None = None,
        collector_factory: CollectorFactory = default_collector_factory,
        simulate: Callable[[str], bool | None] = install_simulation,
        batch_wait: Callable[[float], bool] | None = None,
        environ: dict[str, str] | None = None,
        config_file: str | None = None,
    ) -> None:
        self.config = config
        self.config_file = config_file
        self.relabel_rules = 0
        self.stop_requested = threading.Event()
        self.stop_reason = ""
        self._simulate = simulate
        env = dict(os.environ if environ is None else environ)
        self._owns_simulation = False
        if config.runtime.simulate is not None:
            # before anything can load the real library
            self._owns_simulation = simulate(config.runtime.simulate) is True
            config = self.config = _simulated_node_config(config)
        self._opened: list[BatchStore] = []
        try:
            self.parts = self._build(
                config, server_settings or config.server, collector_factory, batch_wait, env
            )
        except BaseException:
            for opened in self._opened:
                opened.close()  # its file, and the file's lock
            self._uninstall_simulation()  # leave pynvml as this sidecar found it
            raise

    def _build(
        self,
        config: SidecarConfig,
        server_settings: ServerSettings,
        collector_factory: CollectorFactory,
        batch_wait: Callable[[float], bool] | None,
        env: dict[str, str],
    ) -> SidecarParts:
        ident = config.identity
        if not os.path.isdir(ident.proc_root):
            raise ConfigError.setting(
                "identity.proc_root",
                f"{ident.proc_root!r} is not a directory; it must be a procfs (the host's /proc, "
                "mounted read-only into a container, e.g. /host/proc)",
            )
        telemetry = Telemetry()
        health = SidecarHealth()
        procfs = ProcfsReader(
            ident.proc_root,
            host_pid_namespace=ident.host_pid_namespace,
            include_env_vars=ident.include_env_vars,
        )
        declared = DeclaredStore(
            **ident.declared.model_dump(),
            pid_max=config.collection.pid_max or DEFAULT_PID_MAX,
            start_time_reader=procfs.start_time_ticks,
        )
        node = ident.node_name or os.uname().nodename
        in_k8s = (
            ident.in_kubernetes
            if ident.in_kubernetes is not None
            else bool(env.get("KUBERNETES_SERVICE_HOST"))
        )
        rules = _relabel_rules(ident.relabel_config, ident.mode)
        self.relabel_rules = len(rules)
        resourcer = new_process_resourcer(
            None,
            declared,
            node,
            in_k8s,
            rules,
            procfs=procfs,
            host_name=ident.host_name,
            read_process_context=ident.read_process_context,
            mode=ident.mode,
            limits=ident.resource_limits.limits(),
            cache_max_bytes=ident.resource_limits.cache_max_bytes,
            telemetry=telemetry,
        )
        host_attributes = _host_attributes(config, node, in_k8s)
        producer = Producer(
            host_attributes=host_attributes,
            disabled_metrics=config.collection.disabled_metrics,
            telemetry=telemetry,
            self_telemetry=telemetry,
        )
        producer.set_process_resourcer(resourcer)
        attribution = None
        if config.kubernetes.enabled(in_k8s):
            from gpumetrics.kubernetes.attribution import PodAttribution  # only in Kubernetes

            attribution = PodAttribution(config.kubernetes, telemetry, node_name=node)
            producer.set_device_attribution(attribution)
        cap = batch_cap(server_settings, config.push)
        with _store_setting():
            store = BatchStore(
                config.store.limits(),
                telemetry=telemetry,
                max_batch_bytes=cap,
                journal=_journal(config, node, signals.METRICS),
            )
            self._opened.append(store)
            events, logs_store = _events(config, host_attributes, telemetry, cap, node)
            if logs_store is not None:
                self._opened.append(logs_store)
        try:
            server = SidecarServer(
                server_settings,
                store,
                declared,
                health,
                telemetry,
                logs_store=logs_store,
                proc_root=ident.proc_root,
                observation=Observation(
                    is_observed_key, process_observer(ident.proc_root, ident.host_pid_namespace)
                ),
            )
        except SettingError as exc:
            raise ConfigError.setting(f"server.{exc.setting}", exc.reason) from None
        collector = collector_factory(producer, config.collection, telemetry)
        liveness = NvmlLiveness(collector, health, config.runtime.unhealthy_after_nvml_down_s)
        attach = getattr(collector, "attach_events", None)
        companions = []
        if events is not None and logs_store is not None:
            if attach is not None:
                attach(events, config.events)
            companions.append(partial(_flush_events, events, logs_store))
        batcher = Batcher(
            producer,
            store,
            config.runtime.batch_interval_s,
            collector.ready,
            lambda: self._ready(health, server, collector),
            batch_wait,
            companions=companions,
            after_batch=liveness.check,
            max_collection_bytes=config.store.max_collection_bytes,
        )
        push = push_logs = None
        if config.push.endpoint:
            push = _push_exporter(store, config, telemetry)
            if logs_store is not None:
                push_logs = _push_exporter(
                    logs_store, config, WithAttributes(telemetry, {"signal": "logs"}), "logs"
                )
        return SidecarParts(
            telemetry,
            health,
            producer,
            store,
            declared,
            server,
            collector,
            batcher,
            push,
            attribution,
            events,
            logs_store,
            push_logs,
        )

    def start(self) -> None:
        """Start serving, collecting, batching and pushing (returns at once).

        Raises:
            ConfigError: naming the ``server.*`` listener that cannot be bound (in use, a live
                unix socket, a missing directory); nothing else was started.

        """
        p = self.parts
        try:
            p.server.start()
        except (SettingError, ListenError) as exc:
            raise ConfigError.setting(f"server.{exc.setting}", exc.reason) from None
        if p.attribution is not None:  # the first batch should already carry pods
            p.attribution.start(wait_first_s=self.config.kubernetes.timeout_s)
        p.collector.start()
        p.batcher.start()
        for push in (p.push, p.push_logs):
            if push is not None:
                push.start()
        ident = self.config.identity
        log.info(
            "sidecar started",
            extra={
                "listen": ",".join(p.server.addresses.listen),
                "identity_mode": str(ident.mode),
                "include_env_vars": ",".join(ident.include_env_vars),
            },
        )

    def summary(self) -> StartupSummary:
        """Return the start-up summary as of now (it is logged once, when ready)."""
        p = self.parts
        return self._summary(p.server, p.collector)

    def _summary(self, server: SidecarServer, collector: CollectorLike) -> StartupSummary:
        devices = getattr(collector, "devices", None)
        simulated = self.config.runtime.simulate
        if simulated == "default":
            simulated = default_profile()
        nvml = NvmlFacts(
            simulated=simulated,
            driver_version=getattr(collector, "driver_version", None),
            gpus=len(devices()) if callable(devices) else None,
        )
        store = None
        if self.config.store.path:
            p = self.parts
            states = [f"metrics {p.store.durable_state}"]
            if p.logs_store is not None:
                states.append(f"logs {p.logs_store.durable_state}")
            store = f"{self.config.store.path} ({', '.join(states)})"
        return StartupSummary.build(
            server.settings, server.addresses, self.config_file, self.relabel_rules, nvml, store
        )

    def _ready(
        self, health: SidecarHealth, server: SidecarServer, collector: CollectorLike
    ) -> None:
        health.mark_ready()
        log.info(self._summary(server, collector).message())

    def request_stop(self, reason: str) -> None:
        """Ask the main thread to shut down (signal handlers and RPC handlers call this)."""
        if not self.stop_requested.is_set():
            self.stop_reason = reason
            self.stop_requested.set()

    def wait(self, timeout_s: float | None = None, poll_s: float = 0.25) -> bool:
        """Block until a stop is requested (or the collector asks to exit); True if it was.

        The collector's ``exit_requested`` is checked every ``poll_s`` seconds.
        """
        end = None if timeout_s is None else time.monotonic() + timeout_s
        exit_requested = getattr(self.parts.collector, "exit_requested", None)
        while True:
            step = poll_s if end is None else max(0.0, min(poll_s, end - time.monotonic()))
            if self.stop_requested.wait(step):
                return True
            if exit_requested is not None and exit_requested.is_set():
                self.request_stop(
                    f"collector asked to exit with status {self.collector_exit_code()}"
                )
                return True
            if end is not None and time.monotonic() >= end:
                return False

    def collector_exit_code(self) -> int | None:
        """Return the non-zero exit status the collector asked for, or None."""
        requested = getattr(self.parts.collector, "exit_requested", None)
        if requested is None or not requested.is_set():
            return None
        code = getattr(self.parts.collector, "exit_code", None)
        return code if isinstance(code, int) and code else 1

    def shutdown(
        self,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        failed_start: bool = False,
    ) -> bool:
        """Graceful shutdown within ``timeout_s`` (see the module docstring); True if clean.

        Each step gets a share of what is left of the budget, so a hung step cannot take it all.
        ``failed_start``: undo a :meth:`start` that raised; logged at DEBUG only, so the start
        error stays the last thing a user reads.
        """
        p = self.parts
        end = clock() + timeout_s
        level = logging.DEBUG if failed_start else logging.INFO

        def left(share: float) -> float:
            return max(0.0, (end - clock()) * share)

        log.log(level, "shutting down", extra={"reason": self.stop_reason or "requested"})
        p.health.enter_graceful_shutdown()
        # The NVML threads end their bounded waits (the event listener's nvmlEventSetWait_v2,
        # up to events.wait_timeout_s) while the server and batcher stop, not inside the share
        # collector.stop gets: nvmlShutdown must not run under an in-flight call.
        p.collector.begin_stop()
        p.server.stop(grace=min(1.0, left(0.2)))
        clean = p.batcher.stop(left(0.2))
        p.collector.stop(left(0.5))
        if p.attribution is not None:
            p.attribution.stop(min(1.0, left(0.2)))
        try:
            p.batcher.run_once(final=True)
        except Exception:  # noqa: BLE001 - the last batch is best effort; keep shutting down
            log.exception("final batch failed")
        if p.push_logs is not None:
            p.push_logs.shutdown(flush_timeout_s=left(0.3))
        if p.push is not None:
            p.push.shutdown(flush_timeout_s=left(1.0))
        for store in (p.store, p.logs_store):
            if store is not None:
                store.close()  # after the last batch and the last push: all of it is on disk
        self._uninstall_simulation()  # after nvmlShutdown
        log.log(level, "stopped", extra={"clean": clean})
        return clean

    def _uninstall_simulation(self) -> None:
        """Uninstall the simulated driver if this sidecar installed it (pynvml as it was found)."""
        if self._owns_simulation:
            uninstall_simulation()
            self._owns_simulation = False


def _events(
    config: SidecarConfig,
    host_attributes: dict[str, Any],
    telemetry: Telemetry,
    max_batch_bytes: int,
    node: str,
) -> tuple[EventProducer | None, BatchStore | None]:
    """Build the GPU events' producer and log store, or (None, None) when events are disabled.

    The log store has its own size limits (``events.max_*``), the metric store's consumer
    limits and batch size (so a PullLogs answer and a push export carry any batch; a larger
    log batch is split by log records), and its own file in ``store.path``; its
    self-telemetry carries ``signal=logs``.
    """
    if not config.events.enabled:
        return None, None
    logs_store = BatchStore(
        config.log_store_limits(),
        telemetry=WithAttributes(telemetry, {"signal": "logs"}),
        max_batch_bytes=max_batch_bytes,
        signal=signals.LOGS,
        journal=_journal(config, node, signals.LOGS),
    )
    return EventProducer(config.events, host_attributes, telemetry), logs_store


def _journal(config: SidecarConfig, node: str, signal: signals.Signal) -> SqliteJournal | None:
    """Return the store's file in ``store.path`` (None: memory only)."""
    if not config.store.path:
        return None
    return SqliteJournal.in_directory(
        config.store.path, signal=signal.name, node=node, written_by=gpumetrics.__version__
    )


@contextmanager
def _store_setting() -> Iterator[None]:
    """Report a foreign store file or a bad path as a configuration error of ``store.path``.

    A file of another node, signal or format, or a path that is not a directory, is one line
    naming it; the file is left as it is.
    """
    try:
        yield
    except (StoreRefusedError, StorePathError) as exc:
        raise ConfigError.setting("store.path", str(exc)) from None


def _flush_events(events: EventProducer, store: BatchStore, final: bool) -> None:
    events.flush_to(store, final)


def _relabel_rules(path: str | None, mode: IdentityMode) -> Any:
    if path is None:
        return ()
    try:
        with open(path, "rb") as f:
            rules = load_relabel_configs(f.read())
        if mode is IdentityMode.PROFILER:
            check_profiler_mode_rules(rules)
        return rules
    except OSError as exc:
        raise ConfigError.setting(
            "identity.relabel_config", f"{path}: {exc.strerror or exc}"
        ) from None
    except ValueError as exc:
        raise ConfigError.setting("identity.relabel_config", f"{path}: {exc}") from None


def _push_exporter(
    store: BatchStore, config: SidecarConfig, telemetry: SelfTelemetry, signal: str = "metrics"
) -> PushExporter:
    """Build a push exporter of ``signal``; a certificate file it cannot read names its setting.

    Raises:
        ConfigError: naming ``push.ca_file``, ``push.cert_file`` or ``push.key_file``.

    """
    from gpumetrics.service.push import LOGS, METRICS, PushExporter  # only when push is configured

    try:
        return PushExporter(
            store, config.push, telemetry=telemetry, signal=LOGS if signal == "logs" else METRICS
        )
    except OSError as exc:
        files = ("ca_file", "cert_file", "key_file")
        setting = next((f for f in files if getattr(config.push, f) == exc.filename), None)
        if setting is None:
            raise
        raise ConfigError.setting(
            f"push.{setting}", f"cannot read {exc.filename!r}: {exc.strerror or exc}"
        ) from None
