"""The NVML event listener: one event set per NVML session, waited on by its own thread.

NVML delivers Xid errors, ECC errors, page-retirement/row-remap events, recovery actions and
more through *event sets* (NVML API reference, "Event Handling Methods",
https://docs.nvidia.com/deploy/nvml-api/group__nvmlEvents.html): ``nvmlEventSetCreate``, then
``nvmlDeviceRegisterEvents`` per GPU with the types it supports
(``nvmlDeviceGetSupportedEventTypes``), then ``nvmlEventSetWait_v2`` returns one event at a time
or TIMEOUT, and ``nvmlEventSetFree``. The :class:`EventListener` does that on the thread
``gpumetrics-nvml-events``, apart from the device workers, so a wait never delays a tick:

* **Registration.** The collector hands it the devices of the current session after every
  cycle (:meth:`EventListener.sync`); when they change, the listener acts between two waits: a
  new session gets a new set; a GPU recovered with a new handle is registered on the set it has
  (no events of the other GPUs are lost to a new set). Each GPU's supported types are probed
  once per session (NOT_SUPPORTED disables it for the session, logged once) and registered ANDed
  with ``events.types``; one INFO per GPU names the configured types it lacks. A registration
  answering UNKNOWN leaves the set "in undefined state" (nvml.h): it is freed, the other GPUs
  go on a new set and the failed GPU is retried on back-off (one WARNING per episode). MIG:
  NVML registers physical GPUs only (per-instance registration through MIG handles is not
  supported); an event with instance ids is attributed to the matching MIG instance.
* **Recovery actions.** ``nvmlEventTypeGpuRecoveryAction`` carries ``eventData`` 0; the action
  is read with ``nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)`` as the event
  arrives (unknown when that read fails).
* **Waiting.** ``nvmlEventSetWait_v2`` with ``events.wait_timeout_s`` (1 s): the bound on how
  long a stop or a re-registration waits for the thread. TIMEOUT just loops.
* **GPU lost.** A wait answering GPU_IS_LOST (drivers rarely deliver Xid 79 as an event; the
  wait fails instead) makes the listener build a new set (the old one would keep answering
  GPU_IS_LOST; the wait answered it only once its queued events were read): registering the
  lost GPU fails with GPU_IS_LOST, which names it. It yields one ``gpu_lost`` event per loss
  (also when the collector's ticks see the loss first), and the GPU is registered again when the
  collector recovers it (a new handle); its events resume from then on. The listener logs the
  loss at DEBUG: the device state machine's state change is its one WARNING.
* **Lifecycle.** The collector suspends the listener before the NVML session goes down
  (library error, :meth:`Collector.release`, :meth:`Collector.stop`) and waits until it is idle
  (at most one wait timeout): the thread frees its set while NVML is still initialised and makes
  no further call until the next :meth:`sync`, so ``nvmlShutdown`` never meets a set or a wait
  in flight (F22). A lifecycle code answered to the listener itself drops the set without more
  calls; the collector re-initialises on its own.
* **Errors.** Calls go through per-device gates (:mod:`gpumetrics.nvml.calls`): counted in
  ``gpumetrics.nvml.errors``, logged once. Repeated wait failures back off (1 s doubling to
  30 s), so a broken driver never makes the thread spin. A driver without
  ``nvmlEventSetWait_v2`` (older than R450) disables events for the session, logged once.

Events go to an :class:`~gpumetrics.events.EventSink` (the ``EventProducer``), which counts
them, limits storms and renders the log records.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pynvml

from gpumetrics.events import INSTANCE_ID_ANY, EventSettings, EventSink, GpuEvent, event_catalogue
from gpumetrics.metrics import names
from gpumetrics.nvml.calls import NVML_ERRORS, DeviceCalls, DeviceLost, LibraryDown
from gpumetrics.nvml.context import Points
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.fields import read_one_field
from gpumetrics.nvml.query import (
    GPU_LOST_CODES,
    LIFECYCLE_CODES,
    UNKNOWN_CODE,
    ErrorKind,
    QueryError,
    code_name,
    query,
)
from gpumetrics.nvml.state import Backoff
from gpumetrics.selftelemetry import NO_TELEMETRY, SelfTelemetry

__all__ = ["EventListener", "RECOVERY_ACTION_FIELD", "SUPPORTED_TYPES", "WAIT"]

REGISTER_BACKOFF_S = (1.0, 30.0)
"""Back-off of repeated wait failures, and the default of a registration retried (s)."""

SUPPORTED_TYPES = "nvmlDeviceGetSupportedEventTypes"
REGISTER = "nvmlDeviceRegisterEvents"
WAIT = "nvmlEventSetWait_v2"
RECOVERY_ACTION_FIELD = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
"""Field 230: the ``nvmlDeviceGpuRecoveryAction_t`` a recovery-action event announces."""
REGISTERED_DEVICES = "gpumetrics.events.registered_devices"
_GPU_LOST_NAMES = frozenset(code_name(c) for c in GPU_LOST_CODES)
_UNKNOWN = frozenset({UNKNOWN_CODE})


def handle_value(handle: Any) -> int:
    """Return the address an nvidia-ml-py device handle holds (0 for None/NULL)."""
    if handle is None:
        return 0
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


@dataclass
class _Registered:
    dev: Device
    handle: int


@dataclass
class _Retry:
    """A GPU whose registration failed transiently: retried on back-off, warned once."""

    backoff: Backoff
    attempts: int = 0


class EventListener:
    """Listens for NVML events of the current session's GPUs (see the module docstring).

    Args:
        sink: where events go.
        settings: ``events`` settings (types, wait timeout).
        telemetry: NVML errors, ``gpumetrics.events.registered_devices``.
        log: the collector's logger.
        clock_ns: wall clock, Unix-epoch ns (observed times). Tests pass the simulator's.
        backoff: the back-off of repeated wait failures (default 1 s doubling to 30 s).
        register_backoff_s: (initial, max) back-off of a GPU whose registration failed
            transiently (UNKNOWN), in seconds, per GPU; the collector passes its device
            back-off (``collection.device_backoff_initial_s`` / ``_max_s``).

    Threads: :meth:`sync`, :meth:`suspend`, :meth:`idle` and :meth:`stop` are called by the
    collector's scheduler; everything that calls NVML runs on the listener's own thread.

    """

    def __init__(
        self,
        sink: EventSink,
        settings: EventSettings,
        telemetry: SelfTelemetry = NO_TELEMETRY,
        log: logging.Logger | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        backoff: Backoff | None = None,
        register_backoff_s: tuple[float, float] = REGISTER_BACKOFF_S,
    ) -> None:
        self._sink = sink
        self._settings = settings
        self._wanted = settings.mask()
        self._telemetry = telemetry
        self._log = log or logging.getLogger("gpumetrics.nvml")
        self._clock_ns = clock_ns
        self._backoff = backoff or Backoff(*REGISTER_BACKOFF_S)
        self._backoff_s = register_backoff_s
        self._cat = event_catalogue()
        self._cond = threading.Condition()
        # state shared with the scheduler (under _cond)
        self._devices: list[Device] = []
        self._signature: tuple[Any, ...] = ()
        self._generation = 0  # NVML session of _devices
        self._active = False  # the session is up and may be used
        self._dirty = False
        self._stopping = False
        self._idle = True  # no NVML call in flight and no set allocated
        self._refreshing = False  # the listener took a rebuild and is registering the GPUs
        self._registered_count = 0
        self._rebuilds = 0
        self._thread: threading.Thread | None = None
        # the listener thread's own state
        self._set: Any = None
        self._set_generation = -1
        self._registered: dict[int, _Registered] = {}
        self._gates: dict[str, DeviceCalls] = {}
        self._masks: dict[str, int] = {}
        self._lacking: dict[str, int] = {}  # uuid -> the configured types it lacks (logged)
        self._retry: dict[str, _Retry] = {}  # uuid -> registration retried on back-off
        # uuid -> the record it was lost on (held, so that record is never mistaken for a new one)
        self._lost: dict[str, Device] = {}
        self._new_set_needed = False  # a registered GPU was lost: this set answers GPU_IS_LOST
        self._disabled_generation = -1
        self._set_calls = DeviceCalls("event set", telemetry, self._log)

    # -- the scheduler's side --------------------------------------------------------------------
    def sync(self, devices: Iterable[Device], generation: int) -> None:
        """Listen to ``devices`` of NVML session ``generation`` (called after every cycle).

        Starts the thread on first use. A change (new session, new handle or device record)
        makes the thread build a new set; failed GPUs lost to GPU_IS_LOST and friends get their
        one ``gpu_lost`` event here when the ticks saw the loss first.
        """
        devs = list(devices)
        signature = tuple((d.uuid, id(d), handle_value(d.handle), d.health.failed) for d in devs)
        for d in devs:
            if d.health.failed and d.health.reason in _GPU_LOST_NAMES:
                self._mark_lost(d, d.health.reason)
        with self._cond:
            for d in devs:  # a new record of a lost GPU that is healthy: that loss is over
                if not d.health.failed and self._lost.get(d.uuid, d) is not d:
                    del self._lost[d.uuid]
            if self._stopping:
                return
            changed = generation != self._generation or signature != self._signature
            self._devices, self._signature = devs, signature
            self._generation, self._active = generation, True
            if changed:
                self._dirty = True
                self._cond.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="gpumetrics-nvml-events", daemon=True
                )
                self._thread.start()

    def suspend(self) -> None:
        """Make no more NVML calls until the next :meth:`sync`; free the set (asynchronously).

        Call :meth:`idle` (or :meth:`wait_idle`) to know when the thread is done with NVML.
        """
        with self._cond:
            self._active = False
            self._cond.notify_all()

    @property
    def longest_call_s(self) -> float:
        """How long the listener may stay inside NVML: one wait timeout, plus a margin (s)."""
        return self._settings.wait_timeout_s + 1.0

    def idle(self) -> bool:
        """Tell whether no listener call is in flight and no event set is allocated."""
        with self._cond:
            return self._idle

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until :meth:`idle` (at most ``timeout_s``: one wait timeout is enough)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._idle, timeout=timeout_s)

    def wait_registered(self, count: int, timeout_s: float) -> bool:
        """Block until a set with at least ``count`` GPUs is built for the latest devices.

        For tests and diagnostics (events of a GPU reach the set only once it is registered).
        """
        with self._cond:
            return self._cond.wait_for(
                lambda: (
                    not self._dirty and not self._refreshing and self._registered_count >= count
                ),
                timeout=timeout_s,
            )

    @property
    def rebuilds(self) -> int:
        """Return how many sets the listener has created (for tests and diagnostics)."""
        with self._cond:
            return self._rebuilds

    def stop(self, timeout_s: float) -> bool:
        """Stop the thread (it frees its set first) and join it; True when it ended in time."""
        with self._cond:
            self._stopping = True
            self._active = False
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            return not thread.is_alive()
        return True

    def counter_points(self, devices: Iterable[Device], now_ns: int, points: Points) -> None:
        """Add the ``nvidia.gpu.events`` points of ``devices`` (GPUs and MIG instances)."""
        for d in devices:
            for total in self._sink.totals(d.uuid):
                points.add(
                    names.MetricGPUEvents,
                    total.value,
                    now_ns,
                    d.attrs + total.attributes,
                    total.start_ns,
                )

    # -- the listener thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: (
                        self._stopping
                        or (self._active and (self._dirty or self._set is not None))
                        or (not self._active and self._set is not None)
                    ),
                    timeout=self._retry_in_s(),
                )
                if self._stopping or not self._active:
                    active = False
                else:
                    active, rebuild = True, self._dirty or self._retry_due()
                    self._dirty = False
                    devices, generation = list(self._devices), self._generation
                    self._refreshing = rebuild or generation != self._set_generation
                self._idle = False
            try:
                if not active:
                    self._free()
                elif rebuild or generation != self._set_generation:
                    self._refresh(devices, generation)
                elif self._set is not None:
                    self._wait_once()
            except Exception:  # noqa: BLE001 - the listener must outlive any bug, logged
                self._log.exception("GPU event listener: unexpected error; rebuilding the set")
                self._drop_set()
                self._pause()
            finally:
                with self._cond:
                    self._idle = self._set is None
                    self._refreshing = False
                    self._registered_count = len(self._registered)
                    self._cond.notify_all()
                    done = self._stopping and self._set is None
            if done:
                return

    def _pause(self) -> None:
        """Back off after a failure (interrupted by stop, suspend or a new sync)."""
        delay_s = self._backoff.failed(time.monotonic_ns()) / 1e9
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or not self._active, timeout=delay_s)
            self._dirty = True

    def _gate(self, dev: Device) -> DeviceCalls:
        gate = self._gates.get(dev.uuid)
        if gate is None:
            gate = self._gates[dev.uuid] = DeviceCalls(dev.uuid, self._telemetry, self._log)
        return gate

    def _new_session(self, generation: int) -> None:
        """Capabilities are re-probed per session (a new driver may differ)."""
        self._gates.clear()
        self._masks.clear()
        self._retry.clear()
        self._set_generation = generation

    def _retry_due(self) -> bool:
        """Tell whether a GPU waiting to be registered again may be tried now."""
        now = time.monotonic_ns()
        return any(r.backoff.due(now) for r in self._retry.values())

    def _retry_in_s(self) -> float | None:
        """Seconds until the next registration retry is due (None: none waits)."""
        if not self._retry:
            return None
        now = time.monotonic_ns()
        waits = [max(0, (r.backoff.next_ns or now) - now) for r in self._retry.values()]
        return min(waits) / 1e9

    def _refresh(self, devices: list[Device], generation: int) -> None:
        """Register what is not registered yet; on a new session or a lost GPU, on a new set.

        A registration answering UNKNOWN leaves the set undefined (nvml.h,
        ``nvmlDeviceRegisterEvents``: it "should be freed"): the set is freed and every GPU
        that was on it is registered on a new one, while the GPU that failed waits for its
        back-off. Each round puts one more GPU on back-off, so this ends.
        """
        try:
            self._register_all(devices, generation)
        finally:
            # A retry still due was not attempted (the GPU is gone, lost, without a handle, or
            # no set could be made) or ended otherwise (registered, NOT_SUPPORTED): forget it,
            # so it cannot wake the thread again and again.
            now = time.monotonic_ns()
            for uuid in [u for u, r in self._retry.items() if r.backoff.due(now)]:
                del self._retry[uuid]
        self._telemetry.set(REGISTERED_DEVICES, len(self._registered))
        if not self._registered:
            self._free()

    def _register_all(self, devices: list[Device], generation: int) -> None:
        for _ in range(len(devices) + 1):
            if self._set is None or self._new_set_needed or generation != self._set_generation:
                if not self._new_set(generation):
                    return
            current = {(d.uuid, handle_value(d.handle)) for d in devices if d.handle is not None}
            for key, reg in list(self._registered.items()):
                if (reg.dev.uuid, reg.handle) not in current:
                    del self._registered[key]  # a reset or vanished GPU: that handle says nothing
            undefined = False
            for dev in devices:
                if not self._wants_registration(dev):
                    continue
                try:
                    undefined = not self._register(dev)
                except LibraryDown:
                    self._drop_set()  # the session is gone; the collector re-initialises
                    return
                if undefined:
                    self._new_set_needed = True  # free it; the others go on a new set
                    break
            if not undefined:
                return

    def _wants_registration(self, dev: Device) -> bool:
        if dev.handle is None or dev.parent is not None:
            return False  # no handle yet, or a MIG instance (NVML registers GPUs only)
        if handle_value(dev.handle) in self._registered:
            return False
        with self._cond:
            if self._lost.get(dev.uuid) is dev:
                # Lost on this record: its handle answers GPU_IS_LOST, or after a reset
                # INVALID_ARGUMENT (a retired handle). It is registered again on the record the
                # collector makes when it reads the GPU's new handle.
                return False
        retry = self._retry.get(dev.uuid)
        return retry is None or retry.backoff.due(time.monotonic_ns())

    def _new_set(self, generation: int) -> bool:
        """Free the set and create a new one (a new session re-probes capabilities)."""
        self._free()
        self._new_set_needed = False
        if generation != self._set_generation:
            self._new_session(generation)
        if self._disabled_generation == generation:
            return False
        try:
            self._set = self._set_calls.query(
                "nvmlEventSetCreate", "nvmlEventSetCreate", pynvml.nvmlEventSetCreate
            )
        except LibraryDown:
            self._set = None
            return False
        except QueryError as err:
            self._set = None
            if err.kind in (ErrorKind.FUNCTION_MISSING, ErrorKind.UNSUPPORTED):
                self._disable(generation, "nvmlEventSetCreate", err)
            else:
                self._pause()
            return False
        with self._cond:
            self._rebuilds += 1
        return True

    def _supported(self, dev: Device) -> int | None:
        """Return the configured types ``dev`` supports (``nvmlDeviceGetSupportedEventTypes``).

        0 when it supports none or cannot tell (NOT_SUPPORTED: probed once per session); None
        after a transient failure (retried on back-off). Logs one INFO per GPU naming the
        configured types it lacks.
        """
        mask = self._masks.get(dev.uuid)
        if mask is None:
            gate = self._gate(dev)
            value = gate.get(SUPPORTED_TYPES, SUPPORTED_TYPES, _supported_types, dev.handle)
            if value is None and gate.enabled(SUPPORTED_TYPES):
                return None  # a transient failure (counted and logged by the gate)
            mask = self._masks[dev.uuid] = int(value) if value is not None else 0
            if value is not None:
                self._log_lacking(dev, mask)
        return mask & self._wanted

    def _log_lacking(self, dev: Device, supported: int) -> None:
        lacking = self._wanted & ~supported
        if not lacking or self._lacking.get(dev.uuid) == lacking:
            return
        self._lacking[dev.uuid] = lacking
        missing = ", ".join(s.type for s in self._cat.nvml_types if s.bit & lacking)
        if not supported & self._wanted:
            self._log.info(
                "GPU %s supports none of the configured event types (events.types: %s, per "
                "nvmlDeviceGetSupportedEventTypes); no events are read from it",
                dev.uuid,
                missing,
            )
            return
        self._log.info(
            "GPU %s does not support the configured event types %s "
            "(nvmlDeviceGetSupportedEventTypes); it is registered for the others",
            dev.uuid,
            missing,
        )

    def _register(self, dev: Device) -> bool:
        """Register ``dev`` on the set; False when the set is now undefined and must be freed."""
        try:
            mask = self._supported(dev)
            if mask is None:
                self._retry_later(dev)
                return True
            if not mask:
                return True
            self._gate(dev).query(
                REGISTER,
                REGISTER,
                pynvml.nvmlDeviceRegisterEvents,
                dev.handle,
                mask,
                self._set,
                retry_codes=_UNKNOWN,
            )
        except DeviceLost as lost:
            self._mark_lost(dev, lost.error.code_name)
            return True
        except QueryError as err:
            if err.code == UNKNOWN_CODE:
                self._set_undefined(dev, err)
                return False
            return True  # counted and logged by the gate; NOT_SUPPORTED disables it for the session
        self._registered[handle_value(dev.handle)] = _Registered(dev, handle_value(dev.handle))
        self._sink.listening(dev.uuid, self._clock_ns())  # the first registration's time stays
        retry = self._retry.pop(dev.uuid, None)
        if retry is not None and retry.attempts:
            self._log.info(
                "GPU %s: registered for events after %d failed attempt(s); its events are read "
                "from now on",
                dev.uuid,
                retry.attempts,
            )
        with self._cond:
            back = self._lost.pop(dev.uuid, None) is not None
        if back:  # the collector's state line already said it is back
            self._log.debug("GPU %s: registered for events again; its events resume", dev.uuid)
        return True

    def _retry_later(self, dev: Device) -> _Retry:
        retry = self._retry.get(dev.uuid)
        if retry is None:
            retry = self._retry[dev.uuid] = _Retry(Backoff(self._backoff_s[0], self._backoff_s[1]))
        retry.backoff.failed(time.monotonic_ns())
        return retry

    def _set_undefined(self, dev: Device, err: QueryError) -> None:
        """Count a registration that answered UNKNOWN; warn once per episode (until it works)."""
        self._telemetry.add(
            NVML_ERRORS, 1, {"nvml.function": REGISTER, "nvml.return_code": err.code_name}
        )
        retry = self._retry_later(dev)
        retry.attempts += 1
        level = logging.WARNING if retry.attempts == 1 else logging.DEBUG
        self._log.log(
            level,
            "GPU %s: %s answered UNKNOWN (attempt %d): the event set is in an undefined state "
            "(nvml.h) and is freed; the other GPUs are registered on a new set, this one is "
            "retried on back-off (%g s doubling to %g s) and its events are not read meanwhile",
            dev.uuid,
            REGISTER,
            retry.attempts,
            *self._backoff_s,
        )

    def _mark_lost(self, dev: Device, reason: str) -> None:
        """Emit the one ``gpu_lost`` event of this loss of ``dev`` (idempotent until it is back).

        Logged at DEBUG: the collector's device state machine logs the one WARNING of the loss
        (its state change), and the loss is also a FATAL ``nvidia.gpu.lost`` log record.
        """
        with self._cond:
            if dev.uuid in self._lost:
                return
            self._lost[dev.uuid] = dev
        self._log.debug("GPU %s is lost (%s); its events stop until it is back", dev.uuid, reason)
        self._sink.record(
            GpuEvent(
                type="gpu_lost",
                data=0,
                device_id=dev.uuid,
                attributes=dev.attrs,
                observed_ns=self._clock_ns(),
                reason=reason,
            )
        )

    def _disable(self, generation: int, function: str, err: QueryError) -> None:
        self._disabled_generation = generation
        self._log.warning(
            "GPU events are off for this NVML session: %s answered %s (a driver older than "
            "the event API nvidia-ml-py calls?)",
            function,
            err.code_name,
        )

    def _wait_once(self) -> None:
        timeout_ms = max(1, round(self._settings.wait_timeout_s * 1000))
        try:
            data = query(WAIT, pynvml.nvmlEventSetWait_v2, self._set, timeout_ms)
        except QueryError as err:
            self._wait_failed(err)
            return
        self._backoff.reset()
        self._deliver(data)

    def _wait_failed(self, err: QueryError) -> None:
        if err.code == pynvml.NVML_ERROR_TIMEOUT:
            self._backoff.reset()
            return
        self._telemetry.add(
            "gpumetrics.nvml.errors", 1, {"nvml.function": WAIT, "nvml.return_code": err.code_name}
        )
        if err.code in GPU_LOST_CODES:
            self._new_set_needed = True
            with self._cond:
                self._dirty = True  # a new set names the lost GPU (its registration fails)
            if self._backoff.due(time.monotonic_ns()):
                self._backoff.failed(time.monotonic_ns())
                return
            self._pause()
        elif err.code in LIFECYCLE_CODES:
            self._drop_set()  # the library is gone: no more calls on this session's set
        elif err.kind is ErrorKind.FUNCTION_MISSING:
            self._disable(self._set_generation, WAIT, err)
            self._free()
        else:
            self._set_calls.record(err)
            self._free()
            self._pause()

    def _deliver(self, data: Any) -> None:
        reg = self._registered.get(handle_value(data.device))
        spec = self._cat.by_bit(int(data.eventType))
        if reg is None or spec is None:
            self._log.debug(
                "GPU event of an unregistered device or unknown type 0x%x ignored",
                int(data.eventType),
            )
            return
        dev, gi, ci = reg.dev, int(data.gpuInstanceId), int(data.computeInstanceId)
        target = dev
        if gi != INSTANCE_ID_ANY:
            for inst in list(dev.instances.values()):
                if inst.gpu.gpu_instance_id == gi and inst.gpu.compute_instance_id in (ci, None):
                    target = inst
                    break
        action, reason = None, ""
        if spec.type == "gpu_recovery_action":  # eventData is 0: the action is a field value
            action, reason = self._recovery_action(dev)
        self._sink.record(
            GpuEvent(
                type=spec.type,
                data=int(data.eventData),
                device_id=target.uuid,
                attributes=target.attrs,
                observed_ns=self._clock_ns(),
                gpu_instance_id=gi if gi != INSTANCE_ID_ANY else None,
                compute_instance_id=ci if ci != INSTANCE_ID_ANY else None,
                nvml_type=int(data.eventType),
                reason=reason,
                recovery_action=action,
            )
        )

    def _recovery_action(self, dev: Device) -> tuple[int | None, str]:
        """Read the action a recovery-action event announces: (value, "") or (None, why).

        nvml.h: ``nvmlEventData_t.eventData`` "is 0 for any other event" than an Xid, so the
        action is ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, read when the event arrives.
        """
        value, why = read_one_field(
            self._gate(dev), self._telemetry, dev.handle, "recovery_action", RECOVERY_ACTION_FIELD
        )
        return (None, why) if value is None else (int(value), "")

    def _free(self) -> None:
        es, self._set = self._set, None
        self._registered.clear()
        self._telemetry.set(REGISTERED_DEVICES, 0)
        if es is None:
            return
        try:
            self._set_calls.query(
                "nvmlEventSetFree", "nvmlEventSetFree", pynvml.nvmlEventSetFree, es
            )
        except (QueryError, LibraryDown):
            pass  # counted and logged by the gate; the set is gone either way

    def _drop_set(self) -> None:
        """Forget the set without calling NVML (the library no longer answers)."""
        self._set = None
        self._registered.clear()
        self._telemetry.set(REGISTERED_DEVICES, 0)


def _supported_types(handle: Any) -> int:
    return int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
