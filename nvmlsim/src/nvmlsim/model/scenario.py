"""The top level of a scenario file: clock, driver, devices, faults, overrides and events.

See the distribution's ``README.md`` for the format reference and examples. Every model rejects
unknown keys; :func:`nvmlsim.loader.load_scenario` reports errors with the path of
the offending field (``devices[1].processes[0].pid: ...``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from nvmlsim.clock import DEFAULT_START_UNIX
from nvmlsim.eventtypes import event_type_bit
from nvmlsim.model.devices import U64, Device, MigInstance
from nvmlsim.model.values import Code, RawBytes, Strict, Window

__all__ = [
    "ClockSpec",
    "DriverSpec",
    "Fault",
    "Override",
    "Event",
    "NvmlEvent",
    "Scenario",
    "EVENT_ACTIONS",
    "MAX_EVENT_COUNT",
]


class ClockSpec(Strict):
    """Simulated time.

    ``cycle_seconds``: length of one collection cycle (cycle 1 starts at install); at least
    1 µs, the resolution of simulated time (a shorter cycle would round to 0).
    ``start_unix``: where a manual clock starts (seconds since the epoch).
    ``uptime_s``: how long the host has been up at install (origin of the boot clock) under
    a manual clock; the wall clock uses the host's own boot time (``CLOCK_BOOTTIME``).
    """

    cycle_seconds: float = Field(default=1.0, ge=1e-6)
    start_unix: float = Field(default=DEFAULT_START_UNIX, ge=0)
    uptime_s: float = Field(default=259_200.0, ge=0)


class DriverSpec(Strict):
    """The driver and library as the process sees them.

    ``profile`` picks the exported symbols and quirks (see ``driver_profiles``); ``version``,
    ``cuda_version`` (e.g. 12080) and ``nvml_version`` override its strings;
    ``missing_symbols`` removes more symbols. ``v3_record_bytes`` and
    ``bad_struct_version_code`` override the profile's quirks. ``load_failures``: the first N
    attempts to load ``libnvidia-ml.so.1`` fail (``NVMLError_LibraryNotFound``, F14);
    ``library_present: false``: every attempt fails, as on a machine without the NVIDIA driver.
    ``pcie_window_ms``: how long ``nvmlDeviceGetPcieThroughput`` takes (20 ms on hardware,
    F21; 0 turns it off). ``sample_clock``: sample timestamps in Unix-epoch µs or µs since
    boot. ``local_process_names``: ``nvmlSystemGetProcessName`` also answers for pids that are
    not in the scenario from this machine's /proc. ``strict``: record violations for calls
    while uninitialised and for ``nvmlShutdown`` while another call is in flight (F22).
    ``stale_handle_code``: what a handle of a GPU that was reset or a destroyed MIG instance
    returns (F11). ``invalid_handle``: what a call with a NULL or never-issued device handle
    does: ``violation`` (answer INVALID_ARGUMENT and record an ``invalid_handle`` violation) or
    ``abort`` (the process is aborted, as the real library crashes dereferencing it).
    """

    profile: str = "570"
    version: str | None = None
    cuda_version: int | None = Field(default=None, ge=0)
    nvml_version: str | None = None
    missing_symbols: list[str] = Field(default_factory=list)
    v3_record_bytes: Literal[24, 32] | None = None
    bad_struct_version_code: Code | None = None
    load_failures: int = Field(default=0, ge=0)
    library_present: bool = True
    pcie_window_ms: float = Field(default=20.0, ge=0)
    sample_clock: Literal["epoch", "boot"] = "epoch"
    local_process_names: bool = False
    strict: bool = False
    stale_handle_code: Code = 2  # INVALID_ARGUMENT
    invalid_handle: Literal["violation", "abort"] = "violation"


class Fault(Window):
    """Make calls of ``function`` misbehave.

    Matches calls of the C symbol ``function`` (``*`` for every symbol) on ``device`` (index
    or UUID; absent: any, including system calls), optionally only with enum/index argument
    ``arg`` and only the ``sizing`` (NULL buffer) or ``data`` call of two-call functions,
    inside the window. The first ``after_calls`` matching calls pass untouched; then
    ``calls`` calls (absent: all) get the actions: wait ``latency_s`` seconds, and/or ``hang``
    until released, then return ``code`` if given (``SUCCESS`` returns without writing the
    outputs) or answer normally.
    """

    function: str
    device: int | str | None = None
    arg: int | None = None
    call: Literal["any", "sizing", "data"] = "any"
    code: Code | None = None
    latency_s: float | None = Field(default=None, ge=0)
    hang: bool = False
    after_calls: int = Field(default=0, ge=0)
    calls: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _has_action(self) -> Fault:
        if self.code is None and self.latency_s is None and not self.hang:
            raise ValueError("a fault needs at least one of code, latency_s, hang")
        return self


class Override(Window):
    """Write a raw ``value`` into output ``field`` of ``function``, bypassing validation.

    ``field`` is the C struct member (``gpu``, ``memory``, ``total``, ``used``, ``pid``,
    ``usedGpuMemory``, ``smUtil``...) or ``value`` for functions with one scalar output.
    ``pid`` restricts per-process outputs to one process. Use it for garbage such as a GPU
    utilisation of 808334905 (F24). ``calls`` limits how many calls it affects.
    """

    function: str
    field: str
    value: int | float
    device: int | str | None = None
    pid: int | None = None
    arg: int | None = None
    calls: int | None = Field(default=None, ge=1)


#: Allowed ``events[].action`` values.
EVENT_ACTIONS = (
    "lose_gpu",
    "restore_gpu",
    "upgrade_driver",
    "reload_driver",
    "revoke_access",
    "restore_access",
    "reset_energy",
    "destroy_mig_instance",
    "create_mig_instance",
)


class Event(Strict):
    """Something that happens to the system at ``at_cycle`` or ``at_s`` (exactly one).

    ``lose_gpu``: every call on ``device`` answers GPU_IS_LOST (count unchanged).
    ``restore_gpu``: it is back after a reset, with a new handle (old ones answer
    ``driver.stale_handle_code``), energy restarting from 0, optionally at ``new_index``
    (swapping with the device there). ``upgrade_driver``: the library/kernel mismatch of F12;
    every call answers ``code`` (default UNINITIALIZED) and every init LIB_RM_VERSION_MISMATCH
    until a fresh install. ``reload_driver``: the kernel module is reloaded under the process
    (same version): every call answers UNINITIALIZED until the process's NVML reference count
    is back to 0 (``nvmlShutdown``) and it calls ``nvmlInit`` again; event sets created before
    are gone (using one after the new init is an ``invalid_event_set`` violation), device
    handles from before are stale (``driver.stale_handle_code``) and energy counters restart
    from 0. ``revoke_access`` / ``restore_access``: the container loses access
    to the devices; every call, init included, answers UNKNOWN. ``reset_energy``: the
    device's energy counter restarts from 0 (driver reload). ``destroy_mig_instance`` /
    ``create_mig_instance``: a MIG instance in ``slot`` disappears (its handles go stale) or
    ``instance`` appears.
    """

    at_cycle: int | None = Field(default=None, ge=1)
    at_s: float | None = Field(default=None, ge=0)
    action: Literal[
        "lose_gpu",
        "restore_gpu",
        "upgrade_driver",
        "reload_driver",
        "revoke_access",
        "restore_access",
        "reset_energy",
        "destroy_mig_instance",
        "create_mig_instance",
    ]
    device: int | str | None = None
    new_index: int | None = Field(default=None, ge=0)
    slot: int | None = Field(default=None, ge=0)
    instance: MigInstance | None = None
    code: Code | None = None

    @model_validator(mode="after")
    def _when_and_what(self) -> Event:
        if (self.at_cycle is None) == (self.at_s is None):
            raise ValueError("give exactly one of at_cycle, at_s")
        needs_device = self.action in (
            "lose_gpu",
            "restore_gpu",
            "reset_energy",
            "destroy_mig_instance",
            "create_mig_instance",
        )
        if needs_device and self.device is None:
            raise ValueError(f"device: required for action {self.action}")
        if self.action == "destroy_mig_instance" and self.slot is None:
            raise ValueError("slot: required for destroy_mig_instance")
        if self.action == "create_mig_instance" and self.instance is None:
            raise ValueError("instance: required for create_mig_instance")
        return self


#: The most identical events one ``nvml_events`` entry may stand for (a storm).
MAX_EVENT_COUNT = 1_000_000


class NvmlEvent(Strict):
    """An event the driver delivers to event sets (``nvmlEventSetWait_v2``).

    ``type`` is an NVML event type by name (``xid``, ``double_bit_ecc``... see
    ``nvmlsim.eventtypes``) and ``data`` its ``eventData`` (the Xid for ``xid``; 0 otherwise
    unless given). ``device`` is a GPU (index or UUID) or a MIG instance (its UUID): an event of
    an instance carries the instance's GPU/compute-instance ids and reaches sets registered on
    its parent only with ``mig.privileged: true`` (NVML API reference, ``nvmlEventSetWait_v2``);
    a GPU's event carries 0xFFFFFFFF for both. ``count`` identical events happen at once (a
    storm). When: exactly one of ``at_cycle``, ``at_s`` (seconds after install) or
    ``after_registration`` (right after the device's N-th successful
    ``nvmlDeviceRegisterEvents``, by any set), plus ``delay_s`` with the last. An event reaches
    only the sets that have the device registered for its type when it happens, as on hardware.
    """

    device: int | str
    type: str
    data: int = Field(default=0, ge=0, le=U64)
    count: int = Field(default=1, ge=1, le=MAX_EVENT_COUNT)
    at_cycle: int | None = Field(default=None, ge=1)
    at_s: float | None = Field(default=None, ge=0)
    after_registration: int | None = Field(default=None, ge=1)
    delay_s: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _when(self) -> NvmlEvent:
        event_type_bit(self.type)  # ValueError naming the known types
        when = ("at_cycle", "at_s", "after_registration")
        given = [k for k in when if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of at_cycle, at_s, after_registration")
        if self.delay_s and self.after_registration is None:
            raise ValueError("delay_s: only with after_registration")
        return self


class Scenario(Strict):
    """A complete simulated system: what ``load_scenario`` returns and ``install`` runs.

    ``events`` change the system (a GPU lost, a driver upgraded); ``nvml_events`` are what
    the driver reports through event sets (Xid errors, ECC errors...).

    ``extra_process_names`` answers ``nvmlSystemGetProcessName`` for pids that are not GPU
    processes (e.g. an unrelated local process that shares a host pid's number, F15).
    Top-level keys starting with ``x-`` are ignored, as in Compose files: a place for YAML
    anchors shared by several devices (``<<: *h100``).
    """

    @model_validator(mode="before")
    @classmethod
    def _drop_extensions(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {
                k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("x-"))
            }
        return data

    format: Literal[1] = 1
    name: str = ""
    description: str = ""
    clock: ClockSpec = Field(default_factory=ClockSpec)
    driver: DriverSpec = Field(default_factory=DriverSpec)
    devices: list[Device] = Field(default_factory=list)
    faults: list[Fault] = Field(default_factory=list)
    overrides: list[Override] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    nvml_events: list[NvmlEvent] = Field(default_factory=list)
    extra_process_names: dict[int, RawBytes] = Field(default_factory=dict)
