"""Scenario models for devices, their processes, sample buffers and MIG instances.

Convention: a reading that is omitted (or ``null``) makes the matching NVML call return
``NOT_SUPPORTED``, as on hardware that lacks the capability (the NVML API reference lists
NOT_SUPPORTED for each such call). Units are NVML's: bytes, mW, mJ, °C, MHz, KB/s, percent, µs.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from nvmlsim.eventtypes import event_type_bit
from nvmlsim.model.board import (
    Bar1,
    EncoderStats,
    Gpm,
    GpmInstance,
    NvLink,
    RemappedRows,
    RetiredPages,
    Violations,
)
from nvmlsim.model.values import (
    Code,
    Dyn,
    GpuUuid,
    MigUuid,
    RawBytes,
    Strict,
    ValueType,
    Window,
    named_keys,
)

__all__ = [
    "Memory",
    "Power",
    "Clocks",
    "Pcie",
    "Utilization",
    "Codec",
    "Ecc",
    "SampleBuffer",
    "Samples",
    "SAMPLING_TYPES",
    "ProcessUtilizationSpec",
    "ProcessUtilization",
    "Accounting",
    "CallTrigger",
    "Process",
    "ProcessSet",
    "MigInstance",
    "Mig",
    "Pci",
    "ConfCompute",
    "Device",
    "FieldValue",
    "U32",
    "U64",
]

U32 = 0xFFFFFFFF
U64 = 0xFFFFFFFFFFFFFFFF


class Memory(Strict):
    """Framebuffer memory in bytes.

    v1 reports ``used = used_bytes + reserved_bytes``; v2
    reports ``used = used_bytes`` and ``reserved`` separately (NVML API reference,
    ``nvmlMemory_v2_t``).
    """

    total_bytes: int = Field(ge=0, le=U64)
    used_bytes: Dyn = 0
    reserved_bytes: int = Field(default=0, ge=0, le=U64)


class Power(Strict):
    """Board power and limits in milliwatts (``nvmlDeviceGetPowerUsage`` and limits).

    ``default_limit_mw`` answers ``nvmlDeviceGetPowerManagementDefaultLimit``;
    ``min_limit_mw`` and ``max_limit_mw`` together answer
    ``nvmlDeviceGetPowerManagementLimitConstraints`` (NOT_SUPPORTED unless both are given).
    """

    usage_mw: Dyn | None = None
    management_limit_mw: int | None = Field(default=None, ge=0, le=U32)
    enforced_limit_mw: int | None = Field(default=None, ge=0, le=U32)
    default_limit_mw: int | None = Field(default=None, ge=0, le=U32)
    min_limit_mw: int | None = Field(default=None, ge=0, le=U32)
    max_limit_mw: int | None = Field(default=None, ge=0, le=U32)


class Clocks(Strict):
    """Current clocks in MHz per ``NVML_CLOCK_*`` domain (graphics 0, sm 1, mem 2, video 3)."""

    graphics: Dyn | None = None
    sm: Dyn | None = None
    mem: Dyn | None = None
    video: Dyn | None = None


class Pcie(Strict):
    """PCIe throughput in KB/s per direction (``NVML_PCIE_UTIL_TX_BYTES`` 0, ``RX`` 1)."""

    tx_kbps: Dyn | None = None
    rx_kbps: Dyn | None = None


class Utilization(Strict):
    """``nvmlDeviceGetUtilizationRates``: percent of the last sample period."""

    gpu: Dyn = 0
    memory: Dyn = 0


class Codec(Strict):
    """Encoder or decoder utilisation (percent) and its sampling period (µs)."""

    percent: Dyn = 0
    sampling_period_us: int = Field(default=167_000, ge=0, le=U32)


class Ecc(Strict):
    """``nvmlDeviceGetTotalEccErrors`` counts by (error type, counter type)."""

    volatile_corrected: Dyn = 0
    volatile_uncorrected: Dyn = 0
    aggregate_corrected: Dyn = 0
    aggregate_uncorrected: Dyn = 0


class SampleBuffer(Strict):
    """The driver's ring buffer of one sampling type (``nvmlDeviceGetSamples``).

    Samples lie on ``phase_us`` plus multiples of ``period_us`` of the sample clock (a real
    driver's sampling is not aligned to the clock's origin); the newest ``capacity`` are kept.
    ``source`` defaults to the device reading of the same kind (utilisation.gpu for
    ``gpu_utilization``, power.usage_mw for ``total_power``...). ``skip_zero`` records nothing
    while the value is 0 (an idle GPU's empty buffer, F19). ``dirty_high_bytes`` is written
    into bytes 4–7 of the 8-byte union for 32-bit value types (F24). ``sizing: capacity``
    makes the NULL-buffer call report ``capacity`` instead of the number of new samples.
    """

    value_type: ValueType = 1
    period_us: int = Field(default=166_667, gt=0)
    phase_us: int = Field(default=0, ge=0)
    capacity: int = Field(default=120, ge=1, le=100_000)
    source: Dyn | None = None
    skip_zero: bool = False
    dirty_high_bytes: int = Field(default=0, ge=0, le=U32)
    sizing: Literal["exact", "capacity"] = "exact"

    @model_validator(mode="after")
    def _phase_inside_period(self) -> SampleBuffer:
        if self.phase_us >= self.period_us:
            raise ValueError(f"phase_us: must be below period_us ({self.period_us})")
        return self


#: Scenario key -> ``NVML_*_SAMPLES`` sampling type.
SAMPLING_TYPES: dict[str, int] = {
    "total_power": 0,
    "gpu_utilization": 1,
    "memory_utilization": 2,
    "enc_utilization": 3,
    "dec_utilization": 4,
    "processor_clk": 5,
    "memory_clk": 6,
    "module_power": 7,
    "jpg_utilization": 8,
    "ofa_utilization": 9,
}


class Samples(Strict):
    """Sample buffers by sampling type; an omitted type answers ``NOT_SUPPORTED``."""

    total_power: SampleBuffer | None = None
    gpu_utilization: SampleBuffer | None = None
    memory_utilization: SampleBuffer | None = None
    enc_utilization: SampleBuffer | None = None
    dec_utilization: SampleBuffer | None = None
    processor_clk: SampleBuffer | None = None
    memory_clk: SampleBuffer | None = None
    module_power: SampleBuffer | None = None
    jpg_utilization: SampleBuffer | None = None
    ofa_utilization: SampleBuffer | None = None


class ProcessUtilizationSpec(Strict):
    """How the device answers the per-process utilisation calls.

    Each process with a non-zero utilisation has one sample per ``period_us`` (aligned to
    the sample clock plus the process's ``sample_phase_us``); the newest sample newer than
    the caller's cursor is returned, also for processes that exited less than ``buffer_s``
    ago. ``sizing: capacity`` reports ``capacity`` on the sizing call (go-nvml #11).
    """

    period_us: int = Field(default=1_000_000, gt=0)
    buffer_s: float = Field(default=10.0, gt=0)
    sizing: Literal["exact", "capacity"] = "exact"
    capacity: int = Field(default=100, ge=1, le=100_000)


class ProcessUtilization(Strict):
    """A process's utilisation in percent (SM, memory, encoder, decoder, JPEG, OFA)."""

    sm: Dyn = 0
    mem: Dyn = 0
    enc: Dyn = 0
    dec: Dyn = 0
    jpg: Dyn = 0
    ofa: Dyn = 0


class Accounting(Strict):
    """Per-process accounting, as NVML's "Accounting Statistics" calls answer it.

    The calls: ``nvmlDeviceGetAccountingMode``, ``…BufferSize``, ``…Pids``, ``…Stats``.
    ``mode: enabled`` keeps a record of every process that ran on the GPU (its window), in a
    circular buffer of ``buffer_size`` processes: the newest ``buffer_size`` by start time,
    newly created processes overwriting the oldest, exited ones included. ``disabled``:
    ``nvmlDeviceGetAccountingMode`` answers DISABLED and the pid and stats calls answer
    NOT_SUPPORTED (accounting mode must be on); ``unsupported``: every accounting call answers
    NOT_SUPPORTED, as does a device without ``accounting``. Statistics follow the NVML
    reference of ``nvmlAccountingStats_t``: ``time`` is 0 while the process runs and its run
    time in ms after it ended; ``startTime`` µs since the epoch; on a pid collision only the
    newest process of that pid can be queried.
    """

    mode: Literal["enabled", "disabled", "unsupported"] = "enabled"
    buffer_size: int = Field(default=4000, ge=1, le=100_000)


class CallTrigger(Strict):
    """True from the ``calls``-th call of ``function`` on this device on (that call included).

    The default 2 hides a process from a two-call function's sizing call (the 1st call) and
    shows it to the data call (the 2nd): the list grew in between (F20).
    """

    function: str
    calls: int = Field(default=2, ge=1)


class Process(Window):
    """A process using the GPU.

    ``pid`` may be ``self`` or ``parent`` (this Python process or its parent) so /proc
    lookups resolve. The window fields say when it runs (absent: the whole run).
    ``used_memory_bytes: n/a`` reports ``NVML_VALUE_NOT_AVAILABLE`` (2**64-1). ``name``
    answers ``nvmlSystemGetProcessName`` (``name_bytes`` for raw, possibly non-UTF-8 bytes);
    with neither, the lookup gives ``name_error`` (default NOT_FOUND). MIG ids default to
    0xFFFFFFFF, or to the instance's ids under ``mig.instances``. ``visible_after_calls``
    hides the process until the N-th call of a function (list growth between the sizing call
    and the data call, F20). ``start_time_unix`` is the process start time for fake /proc trees.
    """

    pid: Annotated[int, Field(ge=0, le=U32)] | Literal["self", "parent"]
    name: str | None = None
    name_bytes: RawBytes | None = None
    name_error: Code = 6  # NOT_FOUND
    types: list[Literal["compute", "graphics", "mps"]] = Field(
        default_factory=lambda: ["compute"],  # type: ignore[arg-type]
        min_length=1,
    )
    used_memory_bytes: Dyn | Literal["n/a"] = 0
    cc_protected_memory_bytes: int = Field(default=0, ge=0, le=U64)
    gpu_instance_id: int | None = Field(default=None, ge=0, le=U32)
    compute_instance_id: int | None = Field(default=None, ge=0, le=U32)
    utilization: ProcessUtilization | None = None
    sample_phase_us: int = Field(default=0, ge=0)
    visible_after_calls: CallTrigger | None = None
    start_time_unix: float | None = None

    @model_validator(mode="after")
    def _one_name(self) -> Process:
        if self.name is not None and self.name_bytes is not None:
            raise ValueError("name_bytes: give either name or name_bytes, not both")
        return self


class ProcessSet(Window):
    """Many similar processes (for large benchmark scenarios).

    ``count`` processes with pids ``pid_start + k*pid_step``; ``name`` may use
    ``{n}`` (0-based ordinal) and ``{pid}``. Used for large benchmark scenarios.
    """

    count: int = Field(ge=1, le=100_000)
    pid_start: int = Field(ge=1, le=U32)
    pid_step: int = Field(default=1, ge=1)
    name: str = "worker-{n}"
    types: list[Literal["compute", "graphics", "mps"]] = Field(
        default_factory=lambda: ["compute"],  # type: ignore[arg-type]
        min_length=1,
    )
    used_memory_bytes: Dyn | Literal["n/a"] = 0
    utilization: ProcessUtilization | None = None


class MigInstance(Strict):
    """A MIG device in slot ``slot`` of its parent, with its own memory and processes."""

    slot: int = Field(ge=0)
    gpu_instance_id: int = Field(ge=0, le=U32)
    compute_instance_id: int = Field(ge=0, le=U32)
    uuid: MigUuid
    name: str = "NVIDIA MIG device"
    memory: Memory | None = None
    gpm: GpmInstance | None = None
    processes: list[Process] = Field(default_factory=list)
    process_sets: list[ProcessSet] = Field(default_factory=list)


class Mig(Strict):
    """MIG state.

    With ``current: enabled`` the utilisation calls answer NOT_SUPPORTED and
    parent memory/process queries need ``privileged: true`` (else NO_PERMISSION), as the NVML
    API reference's MIG notes say. Slots below ``max_devices`` without an instance are empty
    (NOT_FOUND).
    """

    current: Literal["enabled", "disabled"] = "disabled"
    pending: Literal["enabled", "disabled"] | None = None
    max_devices: int = Field(default=7, ge=0, le=64)
    privileged: bool = False
    instances: list[MigInstance] = Field(default_factory=list)


class Pci(Strict):
    """PCI identity (``nvmlDeviceGetPciInfo_v3``); ``bus_id`` like ``00000000:18:00.0``."""

    bus_id: str = Field(pattern=r"^[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
    device_id: int = Field(default=0x233010DE, ge=0, le=U32)
    subsystem_id: int = Field(default=0, ge=0, le=U32)


class ConfCompute(Strict):
    """``nvmlDeviceGetConfComputeMemSizeInfo`` in KiB."""

    protected_kib: int = Field(default=0, ge=0, le=U64)
    unprotected_kib: int = Field(default=0, ge=0, le=U64)


def _field_ids(value: object) -> object:
    return named_keys(value, "NVML_FI_", "NVML_FI_DEV_", "NVML field id")


class FieldValue(Strict):
    """One ``nvmlDeviceGetFieldValues`` field: its value, value type and optional scope."""

    value: Dyn
    value_type: ValueType = 3
    scope_id: int | None = Field(default=None, ge=0, le=U32)


def _event_types(value: object) -> object:
    if isinstance(value, list):
        for name in value:
            event_type_bit(str(name))  # ValueError naming the known types
        if len(set(value)) != len(value):
            raise ValueError("an event type is listed twice")
    return value


#: Event type names (``nvmlsim.eventtypes``), validated against the NVML bits.
EventTypeList = Annotated[list[str], BeforeValidator(_event_types)]


class Device(Strict):
    """One physical GPU. ``index`` defaults to the position in ``devices``.

    ``field_values`` answers ``nvmlDeviceGetFieldValues``, keyed by field id: a number or an
    ``NVML_FI_*`` name (``POWER_INSTANT`` is short for ``NVML_FI_DEV_POWER_INSTANT``); the
    NVLink and retired-page fields come from ``nvlink`` and ``retired_pages`` unless given
    here. ``fans_percent`` lists each fan's speed (``nvmlDeviceGetNumFans``,
    ``nvmlDeviceGetFanSpeed_v2``); the models of ``gpm``, ``nvlink``, ``bar1``,
    ``remapped_rows``, ``retired_pages``, ``violations_ns`` and ``encoder_stats`` are in
    :mod:`nvmlsim.model.board`.
    ``process_lists: false`` makes every running-process call (all versions and
    ``nvmlDeviceGetRunningProcessDetailList``) answer NOT_SUPPORTED, as Jetson's integrated GPU
    does (an empty list would say "nothing runs", which is a different answer).
    ``accounting`` models per-process accounting (:class:`Accounting`); omitted, every
    accounting call answers NOT_SUPPORTED.
    ``supported_events`` are the event types ``nvmlDeviceGetSupportedEventTypes`` reports and
    ``nvmlDeviceRegisterEvents`` accepts (names of ``nvmlsim.eventtypes``); omitted, both answer
    NOT_SUPPORTED.
    """

    index: int | None = Field(default=None, ge=0)
    uuid: GpuUuid
    name: str | None = "NVIDIA Simulated GPU"
    name_bytes: RawBytes | None = None
    serial: str | None = None
    board_part_number: str | None = None
    vbios_version: str | None = None
    pci: Pci | None = None
    minor_number: int | None = Field(default=None, ge=0, le=U32)
    memory: Memory | None = None
    power: Power = Field(default_factory=Power)
    energy_mj: Dyn | None = None
    temperature_c: Dyn | None = None
    fan_percent: Dyn | None = None
    fans_percent: list[Dyn] | None = Field(default=None, min_length=1, max_length=32)
    pstate: int | None = Field(default=None, ge=0, le=32)
    clocks_mhz: Clocks = Field(default_factory=Clocks)
    clocks_event_reasons: Dyn | None = None
    pcie_kbps: Pcie = Field(default_factory=Pcie)
    utilization: Utilization | None = None
    encoder: Codec | None = None
    decoder: Codec | None = None
    ecc: Ecc | None = None
    samples: Samples = Field(default_factory=Samples)
    process_utilization: ProcessUtilizationSpec | None = None
    accounting: Accounting | None = None
    mig: Mig | None = None
    conf_compute: ConfCompute | None = None
    gpm: Gpm | None = None
    nvlink: NvLink | None = None
    bar1: Bar1 | None = None
    remapped_rows: RemappedRows | None = None
    retired_pages: RetiredPages | None = None
    violations_ns: Violations | None = None
    encoder_stats: EncoderStats | None = None
    field_values: Annotated[dict[int, FieldValue], BeforeValidator(_field_ids)] = Field(
        default_factory=dict
    )
    supported_events: EventTypeList | None = None
    processes: list[Process] = Field(default_factory=list)
    process_sets: list[ProcessSet] = Field(default_factory=list)
    process_lists: bool = True

    @model_validator(mode="after")
    def _one_name(self) -> Device:
        if self.name_bytes is not None and "name" in self.model_fields_set:
            raise ValueError("name_bytes: give either name or name_bytes, not both")
        if not self.process_lists and (self.processes or self.process_sets):
            raise ValueError("processes: a device with process_lists: false lists no processes")
        return self
