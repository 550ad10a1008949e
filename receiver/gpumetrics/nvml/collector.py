"""The :class:`Collector`: NVML session, devices, one worker per device, ticks into the producer.

Runtime contract (``docs/architecture.md``, "Runtime contracts"):

- ``Collector(producer, settings, telemetry=NO_TELEMETRY)``;
- :meth:`Collector.start` returns at once; NVML init is retried in the background with back-off;
- :attr:`Collector.ready` (``threading.Event``) is set after the first complete collection cycle;
- :meth:`Collector.nvml_up`;
- :meth:`Collector.stop` stops scheduling, joins the workers, then calls ``nvmlShutdown`` exactly
  once, and only when no worker can still be inside an NVML call (F22);
- :meth:`Collector.attach_events` (optional, before :meth:`start`): listen for NVML events
  (``nvml/events.py``) on their own thread; the listener follows the session's devices after
  every cycle, and is stopped (its event set freed) before every ``nvmlShutdown``.

Tests drive cycles explicitly with :meth:`Collector.collect_once`; the threaded scheduler only
paces those calls. A cycle commits each device's points to the producer only when that device's
work finished within its deadlines, so a hung or lost device contributes no (stale) points, and a
lifecycle error (F12) discards the whole cycle.

**NVML that stopped answering altogether** (field case F32: a container that lost access to
``/dev/nvidia*`` after a host ``systemctl daemon-reload``, where every call and every later
``nvmlInit`` answer UNKNOWN until the container restarts): when no call of a cycle succeeded on
any device and some answered UNKNOWN, one ``nvmlDeviceGetCount`` tells a broken library from
broken GPUs. If it answers UNKNOWN too, the cycle is discarded like a lifecycle error:
``gpumetrics.nvml.up`` = 0 with reason ``unknown``, no device metrics, ``nvmlShutdown`` once and
re-init on back-off. :meth:`Collector.nvml_down_s` tells the runtime how long NVML has been down
(the sidecar's health follows it, ``runtime.unhealthy_after_nvml_down_s``).

**Devices that changed index** (F11 variant B): while any GPU is failed, every other GPU's tick
starts with ``nvmlDeviceGetIndex``; a GPU found at a new index gets its static properties
(``hw.name`` = ``gpu<index>``, model, serial, VBIOS) re-read in that same tick. Indexes only
move when GPUs drop off and come back, so a healthy node makes no extra call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpumetrics.events import EventSettings, EventSink
from gpumetrics.metrics import names
from gpumetrics.metrics.producer import Producer
from gpumetrics.nvml.calls import DeviceCalls, DeviceLost, LibraryDown
from gpumetrics.nvml.commit import commit, publish_devices, with_instances
from gpumetrics.nvml.context import Context, Points, Tick, read_pid_max
from gpumetrics.nvml.device import Device, annotate, discover
from gpumetrics.nvml.events import EventListener
from gpumetrics.nvml.gpm import free_gpm
from gpumetrics.nvml.library import Session
from gpumetrics.nvml.query import UNKNOWN_CODE, QueryError
from gpumetrics.nvml.samples import TimeBase, boot_time_ns
from gpumetrics.nvml.settings import CollectionSettings
from gpumetrics.nvml.tick import probe, run_tick
from gpumetrics.nvml.workers import Job, Status, WorkerPool
from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry

_GPU_TYPE = ((names.AttrHwType, names.HwTypeGPU),)


@dataclass
class CycleReport:
    """What one :meth:`Collector.collect_once` did.

    Attributes:
        up: NVML was up for the cycle.
        reason: ``gpumetrics.nvml.up`` reason (``ok``, ``released``,
            ``lib_rm_version_mismatch``...).
        states: ``hw.state`` per device UUID (MIG instances included).
        timed_out: device UUIDs whose NVML call ran past the per-call deadline this cycle (or
            is still running since): their readings are dropped and they are ``degraded``.
        overrun: device UUIDs abandoned at the cycle deadline with no call past its per-call
            deadline: readings dropped, health unchanged (``nvml/workers.py``).
        points: data points committed to the producer.

    """

    up: bool
    reason: str
    states: dict[str, str] = field(default_factory=dict)
    timed_out: list[str] = field(default_factory=list)
    overrun: list[str] = field(default_factory=list)
    points: int = 0


class Collector:
    """Reads every GPU through NVML on a schedule and records points into a producer.

    Args:
        producer: where points go (host buffer for device metrics, one per process).
        settings: cadences, deadlines, back-off, enabled metrics.
        telemetry: self-telemetry (errors, drops, durations, devices by state, nvml up).
        clock_ns: wall clock, Unix-epoch ns (point times). Tests pass the simulator's clock.
        monotonic_ns: monotonic clock, ns (cadences and back-off).
        boot_time_ns: the host boot time in Unix-epoch ns (converts boot-domain sample times).
        log: logger (default ``gpumetrics.nvml``).

    """

    def __init__(
        self,
        producer: Producer,
        settings: CollectionSettings,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        boot_time_ns: Callable[[], int] = boot_time_ns,
        log: logging.Logger | None = None,
    ) -> None:
        self._producer = producer
        self._settings = settings
        self._telemetry = telemetry
        self._log = log or logging.getLogger("gpumetrics.nvml")
        self._session = Session(settings, monotonic_ns, self._log)
        self._ctx = Context(
            settings=settings,
            session=self._session,
            telemetry=telemetry,
            log=self._log,
            clock_ns=clock_ns,
            monotonic_ns=monotonic_ns,
            timebase=TimeBase(boot_time_ns),
            pid_max=settings.pid_max or read_pid_max(settings.proc_root),
        )
        self._system = DeviceCalls("system", telemetry, self._log)
        self._pool = WorkerPool(settings.call_timeout_s)
        self._devices: list[Device] = []
        self._known: dict[str, Device] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._overrun_logged = False
        self._shut_down = False
        self._down_since_ns: int | None = None
        self._events: EventListener | None = None
        self._generation = 0  # counts successful NVML inits (the listener's sessions)
        self.ready = threading.Event()
        """Set after the first complete collection cycle."""
        self.exit_requested = threading.Event()
        """Set when the sidecar should exit non-zero (:attr:`exit_code`), e.g. F12."""
        self._publish_up()

    # --- public API --------------------------------------------------------------------
    @property
    def exit_code(self) -> int | None:
        """The exit code requested with :attr:`exit_requested`, or None."""
        return self._session.exit_code

    @property
    def driver_version(self) -> str | None:
        """The driver version NVML reported at init (``nvmlSystemGetDriverVersion``), or None."""
        return self._session.driver_version

    def nvml_up(self) -> bool:
        """Return True while NVML is initialised and answering."""
        return self._session.up

    @property
    def nvml_reason(self) -> str:
        """The ``gpumetrics.nvml.up`` reason (``ok``, ``unknown``, ``released``...)."""
        return self._session.reason

    def nvml_down_s(self) -> float | None:
        """Seconds (on the collector's monotonic clock) since NVML stopped answering.

        None while NVML is up, while it is released on request (F13: deliberate, not a
        failure), and before the first cycle. Counted from the first cycle that found NVML
        down (a failed first init counts from that cycle). Safe to call from any thread.
        """
        since = self._down_since_ns
        if since is None:
            return None
        return max(0, self._ctx.monotonic_ns() - since) / 1e9

    def devices(self) -> list[Device]:
        """Return the current devices (physical GPUs, placeholders; MIG instances hang off them)."""
        with self._lock:
            return list(self._devices)

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no device worker is inside a job (e.g. a hung call returned); True if so.

        For tests and diagnostics; the scheduler never waits on it.
        """
        return self._pool.wait_idle(timeout_s)

    def attach_events(self, sink: EventSink, settings: EventSettings) -> None:
        """Listen for NVML events into ``sink`` (call before :meth:`start`; tests may skip it).

        Nothing happens when ``settings.enabled`` is False. The listener thread starts with the
        first cycle that has devices.
        """
        if settings.enabled and self._events is None:
            s = self._settings
            self._events = EventListener(
                sink,
                settings,
                self._telemetry,
                self._log,
                clock_ns=self._ctx.clock_ns,
                register_backoff_s=(s.device_backoff_initial_s, s.device_backoff_max_s),
            )

    @property
    def events(self) -> EventListener | None:
        """The event listener, when :meth:`attach_events` set one up (for tests, diagnostics)."""
        return self._events

    def _nvml_quiet(self) -> bool:
        """Tell whether no worker and no listener call can be in flight (shutdown is safe)."""
        return not self._pool.busy() and (self._events is None or self._events.idle())

    def _quiesce_events(self, timeout_s: float) -> bool:
        """Suspend the listener and wait until it freed its set and left NVML; True when so."""
        if self._events is None:
            return True
        self._events.suspend()
        return self._events.wait_idle(timeout_s)

    def start(self) -> None:
        """Start the scheduler thread and return at once (init is retried in the background)."""
        with self._lock:
            if self._thread is not None or self._stopped:
                return
            self._thread = threading.Thread(
                target=self._run, name="gpumetrics-nvml-scheduler", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        interval = self._settings.interval_s
        while not self._stop.is_set():
            began = time.monotonic()
            self.collect_once()
            if self.exit_requested.is_set():
                return
            self._stop.wait(max(0.0, interval - (time.monotonic() - began)))

    def begin_stop(self) -> None:
        """Stop scheduling and tell the event listener to end, without waiting for either.

        The first half of :meth:`stop`, for a shutdown that has other steps to take first: the
        scheduler's cycle and the listener's ``nvmlEventSetWait_v2`` (at most
        ``events.wait_timeout_s``) then end while those run, so the share of the budget
        :meth:`stop` gets is not spent waiting for them. Makes no NVML call.
        """
        self._stopped = True
        self._stop.set()
        if self._events is not None:
            self._events.stop(0.0)

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop scheduling, join the workers, then call ``nvmlShutdown`` exactly once.

        Returns:
            True when every worker stopped and NVML was shut down (or never initialised);
            False when a worker (or the scheduler) is still inside an NVML call after
            ``timeout_s``: ``nvmlShutdown`` is then not called, since shutting down under an
            in-flight call crashes the real library (F22). Calling ``stop`` again later retries
            the join and the shutdown; ``nvmlShutdown`` is never called twice.

        """
        end = time.monotonic() + timeout_s
        self._stopped = True
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, end - time.monotonic()))
        if not self._lock.acquire(timeout=max(0.0, end - time.monotonic())):
            self._log.error(
                "collector stop: a cycle is still inside an NVML call; not shutting down"
            )
            return False
        try:
            if self._shut_down:
                return True
            events_stopped = True
            if self._events is not None:
                events_stopped = self._events.stop(max(0.0, end - time.monotonic()))
            clean = self._pool.close(max(0.0, end - time.monotonic())) and events_stopped
            if not clean or (thread is not None and thread.is_alive()):
                self._log.error(
                    "NVML calls still in flight after %.1f s; not calling nvmlShutdown", timeout_s
                )
                return False
            self._free_device_buffers()
            self._session.shutdown()
            self._shut_down = True
            self._publish_up()
            return True
        finally:
            self._lock.release()

    def release(self, timeout_s: float = 5.0) -> bool:
        """Release NVML on request (driver unbind, GPU reset, MIG reconfiguration; F13).

        Stops device work, calls ``nvmlShutdown`` and makes no NVML call until :meth:`resume`.
        Returns False (and releases nothing) if a worker is stuck in a call.
        """
        if not self._lock.acquire(timeout=timeout_s):
            return False
        try:
            if (
                self._pool.busy()
                or not self._quiesce_events(timeout_s)
                or not self._pool.close(timeout_s)
            ):
                self._log.error("cannot release NVML: a call is still in flight")
                return False
            self._pool = WorkerPool(self._settings.call_timeout_s)
            self._free_device_buffers()
            self._forget_devices()
            self._session.release()
            self._publish_up()
            return True
        finally:
            self._lock.release()

    def resume(self) -> None:
        """Allow NVML to be initialised again after :meth:`release` (at the next cycle)."""
        with self._lock:
            self._session.resume()

    # --- one cycle ---------------------------------------------------------------------
    def collect_once(self) -> CycleReport:
        """Run one collection cycle now and commit its points to the producer."""
        with self._lock:
            began = time.perf_counter()
            report = self._cycle()
            self._telemetry.set(
                "gpumetrics.collection.duration", time.perf_counter() - began, {"cadence": "tick"}
            )
            self._publish_up()
            self._track_down()
            if self._session.exit_code is not None:
                self.exit_requested.set()
            elif report.up:
                self.ready.set()
            return report

    def _track_down(self) -> None:
        s = self._session
        if s.up or s.released:
            self._down_since_ns = None
        elif self._down_since_ns is None:
            self._down_since_ns = self._ctx.monotonic_ns()

    def _cycle(self) -> CycleReport:
        s = self._session
        if self._stopped:
            return CycleReport(False, "stopped")
        if not s.up:
            if not s.ensure(safe=self._nvml_quiet()) or not self._discover():
                self._count_init_errors()
                self._publish_devices()
                return CycleReport(False, s.reason)
            self._generation += 1
            self._count_init_errors()
        ctx = self._ctx
        attribution = self._producer.device_attribution
        if attribution is not None:  # from memory; a MIG instance found mid-tick waits a cycle
            annotate(attribution, self._all_devices(), self._log)
        now_ns, mono_ns = ctx.clock_ns(), ctx.monotonic_ns()
        jobs: dict[str, Job] = {}
        ticks: dict[str, Tick] = {}
        check_index = any(d.health.failed for d in self._devices)  # indexes may have moved
        for dev in self._devices:
            if dev.health.failed and not dev.health.probe_due(mono_ns):
                continue
            tick = ticks[dev.uuid] = Tick(ctx, now_ns, mono_ns, check_index=check_index)
            jobs[dev.uuid] = self._job(dev, tick)
        outcomes = self._pool.run(jobs, self._settings.cycle_deadline_s)
        report = CycleReport(True, "ok")
        points: list[Points] = []
        replaced: dict[str, Device] = {}
        for key, out in outcomes.items():
            dev = next(d for d in self._devices if d.uuid == key)
            if out.status is Status.DONE:
                fresh, got = out.result
                if fresh is not dev:
                    replaced[key] = fresh
                if got is not None:
                    points.append(got)
            elif out.status is Status.FAILED:
                if isinstance(out.error, LibraryDown):
                    return self._library_down(out.error.error)
                self._log.error("GPU %s: collection failed: %r", key, out.error, exc_info=out.error)
                dev.health.tick_done(True, type(out.error).__name__)
            elif out.status is Status.OVERRUN:
                report.overrun.append(key)
                self._overrun(dev, out.function)
            else:
                report.timed_out.append(key)
                self._timeout(dev, out.function, out.status is Status.BUSY)
        down = self._nothing_answered(outcomes, replaced)
        if down is not None:
            return self._library_down(down)
        self._replace(replaced)
        report.points = self._commit(points, now_ns)
        report.states = {d.uuid: d.health.state.value for d in self._all_devices()}
        if self._events is not None:
            self._events.sync(self._devices, self._generation)
        return report

    def _nothing_answered(
        self, outcomes: dict[str, Any], replaced: dict[str, Device]
    ) -> QueryError | None:
        """Return the error to end the session with when NVML as a whole stopped answering (F32).

        Only when every ticked device finished, none had a successful call and at least one
        call answered UNKNOWN; then one ``nvmlDeviceGetCount`` decides: UNKNOWN (or a
        lifecycle code) means the library, not the GPUs, is gone.
        """
        if not outcomes or any(o.status is not Status.DONE for o in outcomes.values()):
            return None
        ticked = [d for d in self._devices if d.uuid in outcomes] + list(replaced.values())
        unknown = 0
        for d in with_instances(ticked):
            if d.calls.answered:
                return None
            unknown += d.calls.unknown
        if not unknown:
            return None
        try:
            self._system.query(
                "nvmlDeviceGetCount", "nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount
            )
        except LibraryDown as down:
            return down.error
        except QueryError as err:
            if err.code == UNKNOWN_CODE:
                self._log.error(
                    "every NVML call answered UNKNOWN this cycle, nvmlDeviceGetCount too: NVML "
                    "has stopped answering (a container that lost access to /dev/nvidia*, e.g. "
                    "after a host `systemctl daemon-reload`, stays so until it is restarted); "
                    "no device metrics until it answers again"
                )
                return err
        return None

    def _job(self, dev: Device, tick: Tick) -> Job:
        # The record the job works on now: a probe that recovers a failed GPU swaps in a fresh
        # record mid-job, and the per-call deadline must watch that record's calls from then on.
        current = [dev]

        def run() -> tuple[Device, Points | None]:
            if dev.health.failed:
                fresh = probe(dev, tick)
                if fresh is None:
                    return dev, None
                _carry(dev, fresh)
                current[0] = fresh
            try:
                run_tick(current[0], tick)
            except DeviceLost as lost:
                current[0].health.fail(tick.mono_ns, lost.error.code_name)
                return current[0], None
            return current[0], tick.points

        return Job(run, _in_flight(current))

    def _timeout(self, dev: Device, function: str | None, busy: bool) -> None:
        if not busy:
            self._telemetry.add(
                "gpumetrics.collection.timeouts", 1, {"nvml.function": function or "unknown"}
            )
        dev.health.tick_done(True, f"timeout in {function or 'unknown'}")

    def _overrun(self, dev: Device, function: str | None) -> None:
        # The tick ran out of time without an NVML call past its deadline: the sidecar was
        # slow, not the GPU (nvml/workers.py). The readings are dropped; health is unchanged.
        self._telemetry.add("gpumetrics.collection.overruns", 1, {})
        if not self._overrun_logged:
            self._overrun_logged = True
            self._log.warning(
                "GPU %s: tick abandoned at the cycle deadline (%s s) while %s; its readings for "
                "this tick are dropped (the sidecar is short of CPU time?). Counted in "
                "gpumetrics.collection.overruns; logged once",
                dev.uuid,
                self._settings.cycle_deadline_s,
                f"in {function}" if function else "between NVML calls",
            )

    def _replace(self, replaced: dict[str, Device]) -> None:
        for old_key, fresh in replaced.items():
            keep = [d for d in self._devices if d.uuid != fresh.uuid or d.uuid == old_key]
            self._devices = [fresh if d.uuid == old_key else d for d in keep]
            if old_key != fresh.uuid:
                self._pool.forget(old_key)
            self._log.info("GPU %s is back (index %s)", fresh.uuid, fresh.index)

    def _discover(self) -> bool:
        try:
            self._devices = discover(self._ctx, self._system, self._known)
        except LibraryDown as down:
            self._library_down(down.error)
            return False
        except (QueryError, DeviceLost) as err:
            qe = err if isinstance(err, QueryError) else err.error
            self._library_down(qe)
            return False
        self._system.end_tick(True)
        self._known.update({d.uuid: d for d in self._devices})
        self._log.info("NVML sees %d GPU(s)", len(self._devices))
        return True

    def _library_down(self, err: QueryError) -> CycleReport:
        if self._events is not None:
            # The listener frees its set while NVML still answers; its wait in flight ends
            # within events.wait_timeout_s, so the one nvmlShutdown can follow at once.
            self._quiesce_events(self._events.longest_call_s)
        self._session.lost(err, safe=self._nvml_quiet())
        self._forget_devices()
        self._publish_devices()
        return CycleReport(False, self._session.reason)

    def _forget_devices(self) -> None:
        self._known.update({d.uuid: d for d in self._devices})
        for d in self._devices:
            self._pool.forget(d.uuid)
        self._devices = []

    def _free_device_buffers(self) -> None:
        """Free what NVML allocated for the devices (GPM sample buffers) before a shutdown."""
        if self._session.up:
            for dev in self._devices:
                free_gpm(dev)

    def _count_init_errors(self) -> None:
        errors, self._session.init_errors = self._session.init_errors, []
        for err in errors:
            self._telemetry.add(
                "gpumetrics.nvml.errors",
                1,
                {"nvml.function": err.function, "nvml.return_code": err.code_name},
            )

    # --- output ------------------------------------------------------------------------
    def _all_devices(self) -> list[Device]:
        return with_instances(self._devices)

    def _commit(self, points: list[Points], now_ns: int) -> int:
        if self._events is not None and self._settings.wants(names.MetricGPUEvents):
            events = Points(self._producer.specs)
            self._events.counter_points(self._all_devices(), now_ns, events)
            points.append(events)
        return commit(self._producer, self._telemetry, self._devices, points, now_ns)

    def _publish_devices(self) -> None:
        publish_devices(self._telemetry, self._all_devices())

    def _publish_up(self) -> None:
        up = self._session.up
        self._telemetry.replace(
            "gpumetrics.nvml.up", {(("reason", self._session.reason),): int(up)}
        )


def _in_flight(current: list[Device]) -> Callable[[], tuple[str, float] | None]:
    """Watch the NVML call in flight on the job's current record (and its MIG instances)."""

    def probe_flight() -> tuple[str, float] | None:
        dev = current[0]
        for d in (dev, *dev.instances.values()):
            flight = d.calls.in_flight
            if flight is not None:
                return flight
        return None

    return probe_flight


def _carry(old: Device, fresh: Device) -> None:
    """Give a recovered device the series state of its old record (same UUID only)."""
    if old.uuid != fresh.uuid:
        return
    fresh.start_ns = old.start_ns
    fresh.cursors = old.cursors
    for key in ("energy", "ecc", "counters", "process_start"):
        if key in old.state:
            fresh.state[key] = old.state[key]
