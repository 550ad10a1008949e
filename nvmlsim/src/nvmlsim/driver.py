"""``SimDriver``: the state of one simulated NVML driver and what tests can do with it.

One instance exists per :func:`~nvmlsim.install.install`; a new install is a new
driver (which is how the "process restart" of F12 is simulated). Tests read call counters and
violations, step the clock, start and end processes, request resets and release hangs.
"""

from __future__ import annotations

import ctypes
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nvmlsim import codes
from nvmlsim.clock import Clock, ManualClock
from nvmlsim.driver_profiles import driver_profile
from nvmlsim.events import EventQueue, apply_event
from nvmlsim.eventsets import EventSets
from nvmlsim.faults import FaultEngine, OverrideEngine
from nvmlsim.gpmstore import GpmStore
from nvmlsim.model.devices import Process
from nvmlsim.model.scenario import Event, NvmlEvent, Scenario
from nvmlsim.world import DeviceState, MigState, Timeline, World

__all__ = ["SimDriver", "Violation", "ANY_DEVICE", "LatencyPolicy"]

#: ``call_count(function, ANY_DEVICE)`` sums over every device and system calls.
ANY_DEVICE: Any = object()

#: How injected latency passes: ``clock`` (the clock's own ``sleep``: a manual clock advances,
#: the wall clock blocks), ``block`` (a manual clock: wait until a test advances time past the
#: call's end), or ``off``.
LatencyPolicy = Literal["clock", "block", "off"]


@dataclass(frozen=True)
class Violation:
    """A caller misuse the real library would punish (crash, undefined behaviour).

    ``kind``: ``invalid_handle``, ``shutdown_during_call``, ``call_while_uninitialized``
    (strict mode), ``hang_not_released`` or ``internal_error``.
    """

    kind: str
    function: str
    detail: str
    time_us: int


class SimDriver:
    """A running simulated driver. Build it with ``install()``, not directly.

    Args:
        scenario: the validated scenario.
        clock: time source; a :class:`ManualClock` for tests, a ``WallClock`` for demos.
        latency: how injected latency passes (see :data:`LatencyPolicy`).
        strict: record lifecycle misuse as violations (default: ``scenario.driver.strict``).
        max_hang_s: real seconds after which a hung or ``block``-latency call gives up
            (recording ``hang_not_released``) so no test thread waits forever.

    """

    def __init__(
        self,
        scenario: Scenario,
        clock: Clock,
        *,
        latency: LatencyPolicy = "clock",
        strict: bool | None = None,
        max_hang_s: float = 30.0,
    ) -> None:
        spec = scenario.driver
        profile = driver_profile(spec.profile)
        self.scenario = scenario
        self.clock = clock
        self.latency: LatencyPolicy = latency
        self.strict = spec.strict if strict is None else strict
        self.max_hang_s = max_hang_s
        self.symbols = profile.symbols - frozenset(spec.missing_symbols)
        self.driver_version = (spec.version or profile.version).encode()
        self.cuda_version = spec.cuda_version or profile.cuda_version
        nvml = spec.nvml_version or f"{self.cuda_version // 1000}.{self.driver_version.decode()}"
        self.nvml_version = nvml.encode()
        self.v3_record_bytes = spec.v3_record_bytes or profile.v3_record_bytes
        self.bad_struct_version_code = (
            spec.bad_struct_version_code
            if spec.bad_struct_version_code is not None
            else profile.bad_struct_version_code
        )
        self.pcie_window_s = spec.pcie_window_ms / 1000.0
        start = clock.now_us()
        host_boot = getattr(clock, "boot_time_us", None)  # the wall clock: the host's boot (F31)
        boot = host_boot() if callable(host_boot) else start - round(scenario.clock.uptime_s * 1e6)
        self.timeline = Timeline(start, round(scenario.clock.cycle_seconds * 1e6), boot)
        self.sample_origin_us = boot if spec.sample_clock == "boot" else 0
        self.world = World(scenario, self.timeline)
        self.faults = FaultEngine(scenario.faults, self.timeline)
        self.overrides = OverrideEngine(scenario.overrides, self.timeline)
        self.events = EventQueue(scenario.events, self.timeline)
        self.event_sets = EventSets(scenario.nvml_events, self.timeline, self.world)
        self.lock = threading.RLock()
        self.event_wakeup = threading.Condition(self.lock)
        """Notified when a waiting ``nvmlEventSetWait_v2`` should look again (time moved, an
        event was emitted, the driver closed)."""
        self.init_count = 0
        self.load_attempts = 0
        self.upgraded_code: int | None = None
        self.revoked = False
        self.reloaded = False
        self.in_flight = 0
        self.held = 0
        self.watchers = 0  # threads in wait_until_*: only then do calls notify
        self.activity = threading.Condition(self.lock)
        self.closed = False
        self.counts: Counter[tuple[str, int | None]] = Counter()
        self._violations: list[Violation] = []
        self.reset_log: list[tuple[str, int]] = []
        self.hang_event = threading.Event()
        self.error_strings: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self.sample_cache: dict[tuple[int, int, int, int], Any] = {}
        self.gpm = GpmStore(0x6000_0000_0000 + (secrets.randbelow(1 << 24) << 20))
        self.gpm_strings: dict[int, Any] = {}
        self.driver_ns = 0
        self.driver_cpu_ns = 0
        self.wait_ns = 0
        self.uninstaller: Callable[[SimDriver], None] | None = None
        subscribe = getattr(clock, "subscribe", None)
        if subscribe is not None:  # a manual clock: wake waiting event calls when time moves
            subscribe(self._time_moved)

    # -- counters, time and violations -----------------------------------------------------
    @property
    def calls(self) -> dict[tuple[str, int | None], int]:
        """Calls so far per (C symbol, device index or None for system calls); a copy."""
        with self.lock:
            return dict(self.counts)

    def call_count(self, function: str, device: int | None | Any = ANY_DEVICE) -> int:
        """How often C symbol ``function`` was called on ``device`` (index, None, ANY)."""
        with self.lock:
            if device is ANY_DEVICE:
                return sum(n for (f, _), n in self.counts.items() if f == function)
            return self.counts.get((function, device), 0)

    def reset_calls(self) -> None:
        """Forget every call counted so far."""
        with self.lock:
            self.counts.clear()

    def seen(self, function: str, index: int | None) -> int:
        """Return how often ``function`` was called on device ``index`` (no lock).

        The current call is included: ``visible_after_calls`` shows a process from the N-th call.
        """
        return self.counts.get((function, index), 0)

    @property
    def violations(self) -> list[Violation]:
        """Misuse recorded so far (a copy); tests usually assert it is empty."""
        with self.lock:
            return list(self._violations)

    def violation(self, kind: str, function: str, detail: str) -> None:
        """Record a :class:`Violation` (called by the dispatcher and handlers)."""
        with self.lock:
            self._violations.append(Violation(kind, function, detail, self.clock.now_us()))

    @property
    def gpm_samples_live(self) -> int:
        """GPM sample buffers allocated (``nvmlGpmSampleAlloc``) and not yet freed."""
        with self.lock:
            return self.gpm.live

    @property
    def now_us(self) -> int:
        """Current simulated time, µs since the epoch."""
        return self.clock.now_us()

    @property
    def cycle(self) -> int:
        """Current cycle (1-based; cycle 1 starts at install, each lasts cycle_seconds)."""
        return self.timeline.cycle(self.clock.now_us())

    @property
    def time_in_driver_s(self) -> float:
        """Real seconds spent inside the simulated functions, injected waits excluded."""
        return self.driver_ns / 1e9

    @property
    def cpu_in_driver_s(self) -> float:
        """CPU seconds the calling threads spent inside the simulated functions.

        Unlike :attr:`time_in_driver_s` (real time), this leaves out time a call spent blocked:
        waiting for the interpreter lock or the driver lock, or in ``nvmlEventSetWait_v2``
        waiting for an event (which costs no CPU on hardware either). What benchmarks
        subtract to get an exporter's own CPU.
        """
        return self.driver_cpu_ns / 1e9

    @property
    def injected_wait_s(self) -> float:
        """Real seconds spent in injected latency and hangs."""
        return self.wait_ns / 1e9

    def _manual(self) -> ManualClock:
        if not isinstance(self.clock, ManualClock):
            raise TypeError(
                "advance()/next_cycle() need a ManualClock; this driver uses "
                f"{type(self.clock).__name__}"
            )
        return self.clock

    def advance(self, seconds: float) -> None:
        """Move the manual clock ``seconds`` forward (TypeError on a wall clock)."""
        self._manual().advance(seconds)

    def next_cycle(self, n: int = 1) -> int:
        """Advance the manual clock to the start of the ``n``-th next cycle; returns it."""
        clock = self._manual()
        target = self.cycle + n
        clock.advance_to_us(self.timeline.cycle_start_us(target))
        return target

    # -- scheduled changes -----------------------------------------------------------------
    def apply_due(self, now_us: int) -> None:
        """Apply the scenario events and deliver the NVML events due by ``now_us`` (under lock)."""
        changed = False
        if self.events.next_us is not None and self.events.next_us <= now_us:
            for at, event in self.events.due(now_us):
                apply_event(self, event, at)
            changed = True
        due = self.event_sets.next_us
        if due is not None and due <= now_us:
            self.event_sets.apply_due(now_us)
            changed = True
        if changed:  # a waiting event call on another thread may have something to return
            self.event_wakeup.notify_all()

    def next_due_us(self) -> int | None:
        """When the next scenario event or NVML event is due (µs since the epoch), or None."""
        times = [t for t in (self.events.next_us, self.event_sets.next_us) if t is not None]
        return min(times) if times else None

    def _time_moved(self) -> None:
        with self.lock:
            self.event_wakeup.notify_all()

    # -- world changes for tests -----------------------------------------------------------
    def _owner(self, device: int | str, mig_slot: int | None) -> DeviceState | MigState:
        dev = self.world.device(device)
        if dev is None:
            raise KeyError(f"device: no device {device!r}")
        if mig_slot is None:
            return dev
        if mig_slot not in dev.mig:
            raise KeyError(f"mig_slot: device {device!r} has no MIG instance in slot {mig_slot}")
        return dev.mig[mig_slot]

    def add_process(
        self, device: int | str, pid: int | str, *, mig_slot: int | None = None, **fields: Any
    ) -> None:
        """Start a process on ``device`` (index or UUID) now.

        ``fields`` are those of a scenario process (``name``, ``name_bytes``,
        ``used_memory_bytes``, ``types``, ``utilization``...), validated the same way.

        Raises:
            KeyError: no such device or MIG slot. pydantic.ValidationError: bad fields.

        """
        spec = Process.model_validate({"pid": pid, **fields})
        with self.lock:
            owner = self._owner(device, mig_slot)
            ids = None
            if isinstance(owner, MigState):
                ids = (owner.spec.gpu_instance_id, owner.spec.compute_instance_id)
            proc = self.world.make_process(spec, ids)
            proc.start_us = max(proc.start_us, self.clock.now_us())
            if spec.start_time_unix is None:
                proc.start_time_unix = proc.start_us / 1e6  # started now, not before install
            self.world.add_process(owner, owner.processes, proc)

    def remove_process(self, device: int | str, pid: int, *, mig_slot: int | None = None) -> int:
        """End process ``pid`` on ``device`` now; returns how many entries ended (0 or 1)."""
        with self.lock:
            owner = self._owner(device, mig_slot)
            return self.world.end_process(owner.processes, pid, self.clock.now_us())

    def live_processes(self) -> list[dict[str, Any]]:
        """List the processes alive now, for fake /proc trees (pid reuse needs start times).

        Each entry: ``device`` (index), ``uuid`` (GPU or MIG), ``pid``, ``name`` (bytes or
        None) and ``start_time_unix`` (seconds).
        """
        now = self.clock.now_us()
        with self.lock:
            out = []
            for dev in self.world.devices:
                owners: list[DeviceState | MigState] = [dev, *dev.mig.values()]
                for owner in owners:
                    for p in owner.processes:
                        if p.alive(now):
                            out.append(
                                {
                                    "device": dev.index,
                                    "uuid": owner.uuid,
                                    "pid": p.pid,
                                    "name": p.name,
                                    "start_time_unix": p.start_time_unix,
                                }
                            )
            return out

    def trigger(self, action: str, **fields: Any) -> None:
        """Apply an event (same fields as ``events[]`` in a scenario) right now."""
        event = Event.model_validate({"at_s": 0, "action": action, **fields})
        with self.lock:
            apply_event(self, event)
            self.event_wakeup.notify_all()

    def emit_event(self, device: int | str, type: str, data: int = 0, count: int = 1) -> int:
        """Make ``device`` (index, GPU or MIG UUID) raise NVML event ``type`` now.

        Same fields as ``nvml_events[]`` in a scenario (``type`` by name, ``data`` the
        ``eventData``, ``count`` identical events). Returns how many event sets it reached (0
        when none has the device registered for the type, as on hardware).

        Raises:
            KeyError: no such device. pydantic.ValidationError: bad fields.

        """
        event = NvmlEvent.model_validate(
            {"at_s": 0, "device": device, "type": type, "data": data, "count": count}
        )
        with self.lock:
            reached = self.event_sets.deliver(event)
            self.event_wakeup.notify_all()
            return reached

    def request_reset(self, device: int | str) -> int:
        """Request an external GPU reset / driver unbind (F13).

        Returns IN_USE (19) while this process holds NVML initialised (init count > 0),
        otherwise resets the device (new handles, energy from 0) and returns SUCCESS (0).
        """
        with self.lock:
            dev = self.world.device(device)
            if dev is None:
                raise KeyError(f"device: no device {device!r}")
            if self.init_count > 0:
                self.reset_log.append((dev.uuid, codes.IN_USE))
                return codes.IN_USE
            apply_event(self, Event(at_s=0, action="restore_gpu", device=dev.uuid))
            self.reset_log.append((dev.uuid, codes.SUCCESS))
            return codes.SUCCESS

    def release_hangs(self) -> None:
        """Let every call currently hung by a ``hang`` fault return; later hangs block again."""
        with self.lock:
            event, self.hang_event = self.hang_event, threading.Event()
        event.set()

    def wait_until_held(self, count: int = 1, timeout_s: float = 10.0) -> bool:
        """Block until ``count`` calls are held by the driver (or ``timeout_s`` passes).

        A call is held while a ``hang`` fault blocks it, or while it waits for a manual clock
        to reach the end of its latency (``latency="block"``). Returns True when reached;
        lets a test act while a collector thread is stuck, without sleeping.
        """
        with self.activity:
            self.watchers += 1
            try:
                return self.activity.wait_for(lambda: self.held >= count, timeout=timeout_s)
            finally:
                self.watchers -= 1

    def wait_until_in_flight(self, count: int = 1, timeout_s: float = 10.0) -> bool:
        """Block until ``count`` calls are inside the driver at once (or ``timeout_s``)."""
        with self.activity:
            self.watchers += 1
            try:
                return self.activity.wait_for(lambda: self.in_flight >= count, timeout=timeout_s)
            finally:
                self.watchers -= 1

    def close(self) -> None:
        """Stop answering (every later call: UNINITIALIZED) and release all hangs."""
        with self.lock:
            self.closed = True
            self.event_wakeup.notify_all()
        self.hang_event.set()
        unsubscribe = getattr(self.clock, "unsubscribe", None)
        if unsubscribe is not None:
            unsubscribe(self._time_moved)

    def __enter__(self) -> SimDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.uninstaller is not None:
            self.uninstaller(self)
        else:
            self.close()

    def stats(self) -> Mapping[str, float]:
        """Totals for benchmarks: calls, time in driver, injected waits (seconds)."""
        with self.lock:
            return {
                "calls": float(sum(self.counts.values())),
                "time_in_driver_s": self.time_in_driver_s,
                "cpu_in_driver_s": self.cpu_in_driver_s,
                "injected_wait_s": self.injected_wait_s,
            }
