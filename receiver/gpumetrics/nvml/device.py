"""Device discovery keyed by UUID, static properties read once, and MIG instances.

Indexes are not stable across reboots or resets (NVML API reference, ``nvmlDeviceGetHandleByIndex``:
the order may change), so every device is keyed by
its UUID. Discovery reads ``nvmlDeviceGetCount`` and each index's handle; an index whose handle
cannot be obtained (UNKNOWN, GPU_IS_LOST, NO_PERMISSION... F10) becomes a placeholder keyed
``index:N`` in state ``failed``, probed again on back-off.

Static properties (UUID, name, serial, VBIOS, driver version, MIG mode, MIG slot count) are read
once per device lifetime; the hot path never re-reads them. Names are decoded leniently: the
binding decodes strictly and raises ``UnicodeDecodeError`` on non-UTF-8 bytes (F26); the bytes
are then decoded with U+FFFD replacements and control characters removed.

MIG: on a GPU whose current MIG mode is enabled, each populated slot is its own device with
``hw.id`` = the MIG UUID and ``hw.parent`` = the GPU's UUID, and its GPU/compute-instance ids.
Board-level values (power, energy, temperature, clocks, PCIe, ECC) are read once, on the parent;
memory and processes are read per instance, never on the parent, so nothing is counted twice
(dcgm-exporter repeats board values on every MIG instance: NVIDIA/dcgm-exporter issues #317, #353).
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import pynvml

from gpumetrics.metrics import names
from gpumetrics.metrics.attribution import NO_ANNOTATION, DeviceAnnotation, DeviceAttribution
from gpumetrics.metrics.buffer import Attributes
from gpumetrics.metrics.gpu import GPU
from gpumetrics.nvml.calls import DeviceCalls, DeviceLost
from gpumetrics.nvml.context import Context
from gpumetrics.nvml.library import PROBED_SYMBOLS
from gpumetrics.nvml.query import ErrorKind, QueryError
from gpumetrics.nvml.records import Buffers
from gpumetrics.nvml.samples import Cursors
from gpumetrics.nvml.state import Backoff, DeviceHealth

MIG_ENABLED = "enabled"
MIG_DISABLED = "disabled"


def lenient_text(err: QueryError) -> str | None:
    """Return the text behind a ``UnicodeDecodeError`` (F26), decoded leniently, or None.

    Invalid UTF-8 becomes U+FFFD; control characters are removed. Returns None when the error
    is not a decoding error or nothing printable remains.
    """
    cause = err.cause
    if not isinstance(cause, UnicodeDecodeError):
        return None
    text = bytes(cause.object).decode("utf-8", "replace")
    text = "".join(ch for ch in text if unicodedata.category(ch)[0] != "C").strip()
    return text or None


def _text(calls: DeviceCalls, cap: str, fn: Any, *args: Any) -> str | None:
    try:
        value = calls.query(cap, cap, fn, *args)
    except QueryError as err:
        return lenient_text(err)
    return str(value) if value else None


@dataclass(eq=False)
class Device:
    """The runtime record of one physical GPU, MIG instance, or handle-less index.

    Attributes:
        gpu: static identity (``hw.*`` attributes).
        handle: the NVML handle, or None while none could be obtained.
        calls: this device's call gate (capability cache, error counting).
        health: this device's state machine.
        index: current NVML index (None for a MIG instance).
        parent: the physical GPU of a MIG instance.
        slot: the MIG slot of an instance.
        mig_mode: ``enabled`` / ``disabled`` for GPUs that support MIG, else None.
        instances: MIG instances by slot (physical GPUs with MIG enabled).
        attrs: attributes of device points (every known ``hw.*`` attribute, MIG mode/ids, then
            the annotation's attributes, e.g. the pod holding the GPU).
        id_attrs: attributes of per-process points (``hw.id``, ``hw.parent``, MIG ids).
        annotation: what a :class:`DeviceAttribution` says about the device (see
            :func:`annotate`).
        start_ns: when the device was first seen (start of its UpDownCounter series).
        cursors: sample-buffer cursors, in the driver's clock domain.
        records: the kept buffers of the multi-record calls (:mod:`gpumetrics.nvml.records`).
        memory_total_bytes: the last memory total read (validates per-process memory).
        state: per-reader state (counter trackers, cadence marks, chosen call versions).

    """

    gpu: GPU
    handle: Any
    calls: DeviceCalls
    health: DeviceHealth
    index: int | None
    start_ns: int
    parent: Device | None = None
    slot: int | None = None
    mig_mode: str | None = None
    max_mig_slots: int = 0
    instances: dict[int, Device] = field(default_factory=dict)
    attrs: Attributes = ()
    id_attrs: Attributes = ()
    annotation: DeviceAnnotation = NO_ANNOTATION
    cursors: Cursors = field(default_factory=Cursors)
    records: Buffers = field(default_factory=Buffers)
    memory_total_bytes: int | None = None
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def uuid(self) -> str:
        """The device's key: its UUID (``index:N`` for a placeholder)."""
        return self.gpu.uuid

    @property
    def is_mig_instance(self) -> bool:
        """True for a MIG instance."""
        return self.parent is not None

    @property
    def mig_enabled(self) -> bool:
        """True for a physical GPU whose current MIG mode is enabled."""
        return self.mig_mode == MIG_ENABLED

    def refresh_attrs(self) -> None:
        """Recompute ``attrs`` and ``id_attrs`` from ``gpu`` and the MIG facts."""
        attrs = dict(self.gpu.attributes())
        ids = dict(self.gpu.id_attributes())
        if self.mig_mode is not None:
            attrs[names.AttrMIGMode] = self.mig_mode
        for key, value in (
            (names.AttrMIGGPUInstanceID, self.gpu.gpu_instance_id),
            (names.AttrMIGComputeInstanceID, self.gpu.compute_instance_id),
        ):
            if value is not None:
                attrs[key] = value
                ids[key] = value
        for key, value in self.annotation.attributes:
            attrs.setdefault(key, value)  # never over the GPU's own attributes
        self.attrs = tuple(attrs.items())
        self.id_attrs = tuple(ids.items())


def annotate(source: DeviceAttribution, devices: Iterable[Device], log: logging.Logger) -> None:
    """Apply ``source``'s annotations to ``devices`` (physical GPUs and MIG instances).

    A device whose annotation changed gets its attributes rebuilt; the others keep theirs. An
    exception from ``source`` is logged and changes nothing: attribution never fails a cycle.
    """
    devs = list(devices)
    try:
        notes = source.annotate([d.gpu for d in devs])
    except Exception:  # noqa: BLE001 - outside data must not stop collection
        log.exception("device attribution failed; device attributes left as they were")
        return
    for dev in devs:
        note = notes.get(dev.uuid, NO_ANNOTATION)
        if note != dev.annotation:
            dev.annotation = note
            dev.refresh_attrs()


def component_attrs(dev: Device, kind: str, index: int) -> Attributes:
    """Attributes of component ``index`` of kind ``kind`` (``fan``, ``nvlink``) of GPU ``dev``.

    ``hw.id`` = ``<GPU UUID>:<kind>:<index>``, ``hw.name`` = ``<GPU name>/<kind><index>``,
    ``hw.parent`` = the GPU's UUID (semantic conventions, ``hw.parent``: the parent component's
    ``hw.id``).
    """
    return (
        (names.AttrHwID, f"{dev.uuid}:{kind}:{index}"),
        (names.AttrHwName, f"{dev.gpu.name}/{kind}{index}"),
        (names.AttrHwParent, dev.uuid),
    )


def new_device(
    ctx: Context,
    gpu: GPU,
    handle: Any,
    index: int | None,
    now_ns: int,
    parent: Device | None = None,
) -> Device:
    """Build a :class:`Device` with its own call gate and state machine."""
    s = ctx.settings
    dev = Device(
        gpu=gpu,
        handle=handle,
        calls=DeviceCalls(gpu.uuid, ctx.telemetry, ctx.log),
        health=DeviceHealth(
            gpu.uuid, Backoff(s.device_backoff_initial_s, s.device_backoff_max_s), ctx.log
        ),
        index=index,
        start_ns=now_ns,
        parent=parent,
    )
    for symbol in PROBED_SYMBOLS:
        if not ctx.session.has(symbol):
            dev.calls.disable(symbol, ErrorKind.FUNCTION_MISSING)
    dev.refresh_attrs()
    return dev


def placeholder(ctx: Context, index: int, now_ns: int, reason: str) -> Device:
    """Build the record of an index without handle: keyed ``index:N``, state failed (F10)."""
    gpu = GPU(uuid=f"index:{index}", index=index, name=f"gpu{index}")
    dev = new_device(ctx, gpu, None, index, now_ns)
    dev.health.fail(ctx.monotonic_ns(), reason)
    return dev


def read_physical(ctx: Context, calls: DeviceCalls, handle: Any, index: int, now_ns: int) -> Device:
    """Read a physical GPU's static properties once and build its :class:`Device`.

    ``calls`` is the gate used for the identity calls (the UUID must be known before the
    device's own gate exists).

    Raises:
        QueryError: the UUID could not be read (the caller makes a placeholder).
        DeviceLost, LibraryDown: as from the gate.

    """
    uuid = calls.query("nvmlDeviceGetUUID", "nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle)
    gpu = GPU(uuid=str(uuid), index=index, name=f"gpu{index}")
    dev = new_device(ctx, gpu, handle, index, now_ns)
    c = dev.calls
    dev.gpu = _static_identity(ctx, dev, index)
    mode = c.get(
        "nvmlDeviceGetMigMode", "nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, handle
    )
    if mode is not None:
        dev.mig_mode = (
            MIG_ENABLED if int(mode[0]) == pynvml.NVML_DEVICE_MIG_ENABLE else MIG_DISABLED
        )
    if dev.mig_enabled:
        slots = c.get(
            "nvmlDeviceGetMaxMigDeviceCount",
            "nvmlDeviceGetMaxMigDeviceCount",
            pynvml.nvmlDeviceGetMaxMigDeviceCount,
            handle,
        )
        dev.max_mig_slots = int(slots or 0)
    dev.refresh_attrs()
    return dev


def _static_identity(ctx: Context, dev: Device, index: int) -> GPU:
    """Read the static identity (name, serial, VBIOS, minor number) of ``dev`` at ``index``."""
    c, handle = dev.calls, dev.handle
    model = _text(c, "nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle)
    serial = None
    if c.enabled("nvmlDeviceGetSerial"):
        serial = _text(c, "nvmlDeviceGetSerial", pynvml.nvmlDeviceGetSerial, handle)
    vbios = None
    if c.enabled("nvmlDeviceGetVbiosVersion"):
        vbios = _text(c, "nvmlDeviceGetVbiosVersion", pynvml.nvmlDeviceGetVbiosVersion, handle)
    minor = c.get(
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetMinorNumber",
        pynvml.nvmlDeviceGetMinorNumber,
        handle,
    )
    return GPU(
        uuid=dev.uuid,
        index=index,
        name=f"gpu{index}",
        model=model,
        serial_number=serial,
        driver_version=ctx.session.driver_version,
        firmware_version=vbios,
        minor_number=_small_int(minor, MAX_MINOR_NUMBER),
    )


def check_index(ctx: Context, dev: Device) -> bool:
    """Re-read a physical GPU's static identity if its NVML index moved (F11 variant B).

    ``nvmlDeviceGetIndex`` on the device's handle; when it differs from the known index, the
    device takes the new index and its static properties (``hw.name`` = ``gpu<index>``,
    model, serial, VBIOS) are read again, so every point of this tick carries the identity
    it has now. MIG instances take the parent's new name. Returns True when it moved.

    Raises:
        DeviceLost, LibraryDown: as from the gate.

    """
    got = dev.calls.get(
        "nvmlDeviceGetIndex", "nvmlDeviceGetIndex", pynvml.nvmlDeviceGetIndex, dev.handle
    )
    if got is None or dev.index is None or int(got) == dev.index:
        return False
    old, dev.index = dev.index, int(got)
    dev.gpu = _static_identity(ctx, dev, dev.index)
    dev.refresh_attrs()
    for slot, inst in dev.instances.items():
        inst.gpu = replace(inst.gpu, name=f"{dev.gpu.name}/mig{slot}")
        inst.refresh_attrs()
    ctx.log.info("GPU %s moved from index %d to %d; identity re-read", dev.uuid, old, dev.index)
    return True


def enumerate_mig(ctx: Context, parent: Device, now_ns: int) -> None:
    """(Re-)enumerate the MIG instances of ``parent``: slots gone are removed, new ones read once.

    An instance is matched by UUID, so one that survives keeps its series start times; a slot
    whose UUID changed is a new instance. Errors on a slot are handled by the parent's gate
    (NOT_FOUND: empty slot).
    """
    found: dict[int, Device] = {}
    c = parent.calls
    for slot in range(parent.max_mig_slots):
        try:
            handle = c.query(
                "nvmlDeviceGetMigDeviceHandleByIndex",
                "nvmlDeviceGetMigDeviceHandleByIndex",
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
                parent.handle,
                slot,
            )
        except QueryError:
            continue
        try:
            uuid = str(
                c.query("nvmlDeviceGetUUID", "nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle)
            )
        except QueryError:
            continue
        old = parent.instances.get(slot)
        if old is not None and old.uuid == uuid:
            old.handle = handle
            found[slot] = old
            continue
        found[slot] = _read_instance(ctx, parent, handle, slot, uuid, now_ns)
    for slot, old in parent.instances.items():
        if slot not in found or found[slot] is not old:
            ctx.log.info("GPU %s: MIG instance %s (slot %d) is gone", parent.uuid, old.uuid, slot)
    parent.instances = found
    parent.state["mig_enumerated_ns"] = ctx.monotonic_ns()


def _read_instance(
    ctx: Context, parent: Device, handle: Any, slot: int, uuid: str, now_ns: int
) -> Device:
    gpu = GPU(uuid=uuid, parent_uuid=parent.uuid)
    dev = new_device(ctx, gpu, handle, None, now_ns, parent=parent)
    c = dev.calls
    gi = c.get(
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetGpuInstanceId",
        pynvml.nvmlDeviceGetGpuInstanceId,
        handle,
    )
    ci = c.get(
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        pynvml.nvmlDeviceGetComputeInstanceId,
        handle,
    )
    dev.gpu = GPU(
        uuid=uuid,
        name=f"{parent.gpu.name}/mig{slot}",
        model=_text(c, "nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle),
        driver_version=parent.gpu.driver_version,
        firmware_version=parent.gpu.firmware_version,
        serial_number=parent.gpu.serial_number,
        parent_uuid=parent.uuid,
        gpu_instance_id=_small_id(gi),
        compute_instance_id=_small_id(ci),
    )
    dev.slot = slot
    dev.refresh_attrs()
    ctx.log.info("GPU %s: MIG instance %s in slot %d", parent.uuid, uuid, slot)
    return dev


MAX_MIG_ID = 64
"""MIG GPU/compute-instance ids are small (at most 7 GPU instances per GPU on current parts)."""


MAX_MINOR_NUMBER = 255
"""``/dev/nvidia<minor>`` minors are 0-254 (255 is the control device, ``/dev/nvidiactl``)."""


def _small_int(value: Any, limit: int) -> int | None:
    if value is None:
        return None
    v = int(value)
    return v if 0 <= v < limit else None


def _small_id(value: Any) -> int | None:
    return _small_int(value, MAX_MIG_ID)


def discover(ctx: Context, system: DeviceCalls, known: dict[str, Device]) -> list[Device]:
    """Enumerate the GPUs NVML sees, reusing the :class:`Device` of each known UUID.

    Args:
        ctx: collector context.
        system: the gate for system-level calls (count, handles, UUIDs).
        known: devices from an earlier session by UUID; a device found again keeps its series
            start times and counter trackers but gets a fresh handle, index and capabilities.

    Returns:
        One device per index, in index order (placeholders for indexes without a handle).

    Raises:
        QueryError: ``nvmlDeviceGetCount`` failed (the session is unusable).
        LibraryDown: a lifecycle code.

    """
    now_ns = ctx.clock_ns()
    count = int(system.query("nvmlDeviceGetCount", "nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount))
    out: list[Device] = []
    for index in range(count):
        try:
            handle = system.query(
                "nvmlDeviceGetHandleByIndex",
                "nvmlDeviceGetHandleByIndex",
                pynvml.nvmlDeviceGetHandleByIndex,
                index,
            )
            dev = read_physical(ctx, system, handle, index, now_ns)
        except QueryError as err:
            out.append(placeholder(ctx, index, now_ns, err.code_name))
            continue
        except DeviceLost as exc:
            out.append(placeholder(ctx, index, now_ns, exc.error.code_name))
            continue
        old = known.get(dev.uuid)
        if old is not None:
            dev.start_ns = old.start_ns
            dev.state = {k: v for k, v in old.state.items() if k in _CARRIED_STATE}
        if dev.mig_enabled:
            enumerate_mig(ctx, dev, now_ns)
            if old is not None:
                for slot, inst in dev.instances.items():
                    prev = old.instances.get(slot)
                    if prev is not None and prev.uuid == inst.uuid:
                        inst.start_ns = prev.start_ns
        out.append(dev)
    return out


_CARRIED_STATE = frozenset({"energy", "ecc", "counters", "accounting", "energy_split"})
"""Reader state that survives a re-init (counter trackers keep detecting resets)."""
