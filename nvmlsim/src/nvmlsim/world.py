"""The simulated system at run time: devices, MIG instances, processes and their lifetimes.

Built once from a :class:`~nvmlsim.model.scenario.Scenario` at install and then
changed only by events, :class:`~nvmlsim.driver.SimDriver` test helpers and the
passing of time. All access happens under the driver's lock.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from nvmlsim.handles import HandleTable
from nvmlsim.model.devices import (
    U32,
    Device,
    MigInstance,
    Process,
    ProcessSet,
    ProcessUtilization,
)
from nvmlsim.model.scenario import Scenario
from nvmlsim.model.values import Dyn, Window

__all__ = ["Timeline", "ProcState", "MigState", "DeviceState", "World", "NEVER", "ALWAYS"]

NEVER = 1 << 62  # "no end" in µs
ALWAYS = -(1 << 62)  # "no start" in µs


@dataclass(frozen=True)
class Timeline:
    """Converts between µs since the epoch, seconds since install and cycles."""

    start_us: int
    cycle_us: int
    boot_us: int

    def cycle(self, now_us: int) -> int:
        """Return the 1-based cycle ``now_us`` falls into (cycle 1 starts at install)."""
        return 1 + max(0, now_us - self.start_us) // self.cycle_us

    def seconds(self, now_us: int) -> float:
        """Seconds since install."""
        return (now_us - self.start_us) / 1_000_000

    def cycle_start_us(self, cycle: int) -> int:
        """When cycle ``cycle`` starts, µs since the epoch."""
        return self.start_us + (cycle - 1) * self.cycle_us

    def span(self, w: Window) -> tuple[int, int]:
        """``[start, end)`` of window ``w`` in µs since the epoch (unbounded: ALWAYS/NEVER)."""
        start, end = ALWAYS, NEVER
        if w.from_cycle is not None:
            start = max(start, self.cycle_start_us(w.from_cycle))
        if w.from_s is not None:
            start = max(start, self.start_us + round(w.from_s * 1e6))
        if w.until_cycle is not None:
            end = min(end, self.cycle_start_us(w.until_cycle))
        if w.until_s is not None:
            end = min(end, self.start_us + round(w.until_s * 1e6))
        return start, end


ProcType = Literal["compute", "graphics", "mps"]


@dataclass(eq=False)
class ProcState:
    """A process as the driver tracks it; alive in ``[start_us, end_us)`` once visible."""

    pid: int
    name: bytes | None
    name_error: int
    local: bool
    types: frozenset[str]
    used_memory: Dyn | None  # None: NVML_VALUE_NOT_AVAILABLE
    cc_memory: int
    gpu_instance_id: int
    compute_instance_id: int
    utilization: ProcessUtilization | None
    phase_us: int
    start_us: int
    end_us: int
    start_time_unix: float
    trigger: tuple[str, int] | None = None

    def alive(self, now_us: int) -> bool:
        """Whether the process runs at ``now_us`` (ignoring visibility triggers)."""
        return self.start_us <= now_us < self.end_us


@dataclass(eq=False)
class MigState:
    """A MIG device inside a parent GPU."""

    parent: DeviceState
    spec: MigInstance
    handle: int = 0
    processes: list[ProcState] = field(default_factory=list)

    @property
    def uuid(self) -> str:
        """The MIG device's UUID (``MIG-...``)."""
        return self.spec.uuid


@dataclass(eq=False)
class DeviceState:
    """A physical GPU: its scenario spec plus what changed at run time."""

    spec: Device
    index: int
    handle: int = 0
    lost: bool = False
    energy_offset_mj: float = 0.0
    processes: list[ProcState] = field(default_factory=list)
    mig: dict[int, MigState] = field(default_factory=dict)
    accounting_cache: tuple[int, int, dict[int, ProcState]] | None = None
    """The accounting buffer as last built: (world version, µs, pid → newest process)."""

    @property
    def uuid(self) -> str:
        """The GPU's UUID (``GPU-...``)."""
        return self.spec.uuid

    @property
    def name_bytes(self) -> bytes:
        """Raw bytes ``nvmlDeviceGetName`` returns."""
        if self.spec.name_bytes is not None:
            return self.spec.name_bytes
        return (self.spec.name or "").encode()

    @property
    def mig_enabled(self) -> bool:
        """Whether MIG mode is currently enabled."""
        return self.spec.mig is not None and self.spec.mig.current == "enabled"


Target = DeviceState | MigState


def _resolve_pid(pid: int | str) -> tuple[int, bool]:
    if pid == "self":
        return os.getpid(), True
    if pid == "parent":
        return os.getppid(), True
    assert isinstance(pid, int)
    return pid, False


class World:
    """Devices by index and UUID, handles, and a pid index for name lookups."""

    def __init__(self, scenario: Scenario, timeline: Timeline) -> None:
        self.timeline = timeline
        self.handles: HandleTable[Target] = HandleTable()
        self.devices: list[DeviceState] = []
        self.by_uuid: dict[str, Target] = {}
        self.by_pid: dict[int, list[ProcState]] = {}
        self.version = 0
        self._cache: dict[int, tuple[int, int, int, list[ProcState]]] = {}
        for pos, spec in enumerate(scenario.devices):
            dev = DeviceState(spec, pos if spec.index is None else spec.index)
            dev.handle = self.handles.issue(dev)
            self.by_uuid[dev.uuid] = dev
            self._add_procs(dev, dev.processes, spec.processes, spec.process_sets, None)
            if spec.mig is not None:
                for inst in spec.mig.instances:
                    self.create_mig(dev, inst)
            self.devices.append(dev)
        self.devices.sort(key=lambda d: d.index)

    # -- processes -------------------------------------------------------------------------
    def make_process(self, p: Process, ids: tuple[int, int] | None) -> ProcState:
        """Build the run-time state of scenario process ``p`` (``ids``: MIG GI/CI)."""
        pid, local = _resolve_pid(p.pid)
        start, end = self.timeline.span(p)
        gi = p.gpu_instance_id if p.gpu_instance_id is not None else (ids or (U32, U32))[0]
        ci = p.compute_instance_id if p.compute_instance_id is not None else (ids or (U32, U32))[1]
        name = (
            p.name_bytes
            if p.name_bytes is not None
            else (p.name.encode() if p.name is not None else None)
        )
        born = start if start != ALWAYS else self.timeline.start_us - 3_600_000_000
        trigger = None
        if p.visible_after_calls is not None:
            trigger = (p.visible_after_calls.function, p.visible_after_calls.calls)
        return ProcState(
            pid=pid,
            name=name,
            name_error=p.name_error,
            local=local,
            types=frozenset(p.types),
            used_memory=None if p.used_memory_bytes == "n/a" else p.used_memory_bytes,
            cc_memory=p.cc_protected_memory_bytes,
            gpu_instance_id=gi,
            compute_instance_id=ci,
            utilization=p.utilization,
            phase_us=p.sample_phase_us,
            start_us=start,
            end_us=end,
            start_time_unix=p.start_time_unix if p.start_time_unix is not None else born / 1e6,
            trigger=trigger,
        )

    def _expand(self, s: ProcessSet) -> Iterable[Process]:
        window = s.model_dump(include={"from_cycle", "until_cycle", "from_s", "until_s"})
        for n in range(s.count):
            pid = s.pid_start + n * s.pid_step
            yield Process(
                pid=pid,
                name=s.name.format(n=n, pid=pid),
                types=s.types,
                used_memory_bytes=s.used_memory_bytes,
                utilization=s.utilization,
                **window,
            )

    def _add_procs(
        self,
        owner: Target,
        into: list[ProcState],
        procs: Iterable[Process],
        sets: Iterable[ProcessSet],
        ids: tuple[int, int] | None,
    ) -> None:
        for p in procs:
            self.add_process(owner, into, self.make_process(p, ids))
        for s in sets:
            for p in self._expand(s):
                self.add_process(owner, into, self.make_process(p, ids))

    def add_process(self, owner: Target, into: list[ProcState], proc: ProcState) -> None:
        """Register ``proc`` on ``owner`` (its process list is ``into``)."""
        into.append(proc)
        self.by_pid.setdefault(proc.pid, []).append(proc)
        self.version += 1

    def processes(
        self, target: Target, now_us: int, seen: Callable[[str, int], int]
    ) -> list[ProcState]:
        """List the processes alive and visible on ``target`` at ``now_us``.

        A MIG-enabled parent lists every instance's processes. ``seen(function, index)``
        returns how often a function was called on a device (for visibility triggers).
        """
        key = id(target)
        cached = self._cache.get(key)
        if cached is not None and cached[0] == self.version and cached[1] <= now_us < cached[2]:
            return cached[3]
        if isinstance(target, DeviceState) and target.mig_enabled:
            pool = [p for m in target.mig.values() for p in m.processes]
            index = target.index
        elif isinstance(target, DeviceState):
            pool, index = target.processes, target.index
        else:
            pool, index = target.processes, target.parent.index
        valid_from, valid_until, hidden = ALWAYS, NEVER, False
        result = []
        for p in pool:
            if p.trigger is not None and seen(p.trigger[0], index) < p.trigger[1]:
                hidden = True
                continue
            if p.start_us <= now_us < p.end_us:
                result.append(p)
                valid_until = min(valid_until, p.end_us)
                valid_from = max(valid_from, p.start_us)
            elif now_us < p.start_us:
                valid_until = min(valid_until, p.start_us)
            else:
                valid_from = max(valid_from, p.end_us)
        if not hidden:
            self._cache[key] = (self.version, valid_from, valid_until, result)
        return result

    def end_process(self, procs: list[ProcState], pid: int, now_us: int) -> int:
        """End every alive process ``pid`` in ``procs`` at ``now_us``; returns how many."""
        ended = 0
        for p in procs:
            if p.pid == pid and p.alive(now_us):
                p.end_us = now_us
                ended += 1
        self.version += ended
        return ended

    # -- devices and MIG -------------------------------------------------------------------
    def device(self, ref: int | str) -> DeviceState | None:
        """Return the physical device with index or UUID ``ref``."""
        if isinstance(ref, int):
            return self.devices[ref] if 0 <= ref < len(self.devices) else None
        target = self.by_uuid.get(ref)
        return target if isinstance(target, DeviceState) else None

    def target(self, ref: int | str) -> Target | None:
        """Return the device (by index or UUID) or MIG instance (by UUID) named by ``ref``."""
        return self.device(ref) if isinstance(ref, int) else self.by_uuid.get(ref)

    def create_mig(self, dev: DeviceState, inst: MigInstance) -> MigState:
        """Create MIG instance ``inst`` on ``dev`` with a fresh handle."""
        mig = MigState(dev, inst)
        mig.handle = self.handles.issue(mig)
        ids = (inst.gpu_instance_id, inst.compute_instance_id)
        self._add_procs(mig, mig.processes, inst.processes, inst.process_sets, ids)
        dev.mig[inst.slot] = mig
        self.by_uuid[inst.uuid] = mig
        self.version += 1
        return mig

    def destroy_mig(self, dev: DeviceState, slot: int, stale_code: int) -> None:
        """Remove the instance in ``slot``; its handle answers ``stale_code`` from now on."""
        mig = dev.mig.pop(slot, None)
        if mig is None:
            return
        self.handles.retire(mig.handle, stale_code)
        self.by_uuid.pop(mig.uuid, None)
        self.version += 1

    def renew_handles(self, dev: DeviceState, stale_code: int) -> None:
        """After a reset: old handles of ``dev`` and its MIG instances go stale."""
        self.handles.retire(dev.handle, stale_code)
        dev.handle = self.handles.issue(dev)
        for mig in dev.mig.values():
            self.handles.retire(mig.handle, stale_code)
            mig.handle = self.handles.issue(mig)

    def move(self, dev: DeviceState, new_index: int) -> None:
        """Give ``dev`` index ``new_index``, swapping with the device that had it."""
        other = self.devices[new_index]
        other.index, dev.index = dev.index, new_index
        self.devices.sort(key=lambda d: d.index)
        self.version += 1
