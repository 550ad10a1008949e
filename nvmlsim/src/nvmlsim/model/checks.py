"""Cross-field checks of a parsed scenario, each problem reported with its field path.

Pydantic checks each field on its own; these checks need the whole scenario (unique UUIDs,
contiguous indices, known symbols, ranges of patterns, references from faults and events).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator

from nvmlsim.driver_profiles import ALL_SYMBOLS, DRIVER_PROFILES
from nvmlsim.fields import OVERRIDE_FIELDS
from nvmlsim.model.board import GPM_PERCENT_IDS, Gpm, GpmInstance, GpmTrace
from nvmlsim.model.devices import U32, U64, Device, Memory, MigInstance, Process, ProcessSet
from nvmlsim.model.scenario import Scenario
from nvmlsim.model.values import OLD_MIG_UUID, Dyn, bounds

__all__ = ["check_scenario"]

Problem = tuple[str, str]


def _range(path: str, value: Dyn | None, low: float, high: float) -> Iterator[Problem]:
    if value is None:
        return
    lo, hi = bounds(value)
    # A ramp is unbounded in its direction of travel; only its finite end is checked.
    if (lo < low and lo != -math.inf) or (hi > high and hi != math.inf):
        yield (path, f"must stay within {low:g}..{high:g}, but can be {lo:g}..{hi:g}")


def _symbol(path: str, name: str, allow_star: bool = False) -> Iterator[Problem]:
    if (allow_star and name == "*") or name in ALL_SYMBOLS:
        return
    near = difflib.get_close_matches(name, sorted(ALL_SYMBOLS), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    yield (path, f"unknown NVML symbol {name!r}{hint}")


def _memory(path: str, mem: Memory | None) -> Iterator[Problem]:
    if mem is None:
        return
    lo, hi = bounds(mem.used_bytes)
    if lo < 0:
        yield (f"{path}.used_bytes", "must be >= 0")
    if hi + mem.reserved_bytes > mem.total_bytes:
        yield (f"{path}.used_bytes", "used_bytes + reserved_bytes must be <= total_bytes")


def _processes(path: str, procs: list[Process], sets: list[ProcessSet]) -> Iterator[Problem]:
    unbounded: dict[int | str, int] = {}
    for i, p in enumerate(procs):
        pp = f"{path}.processes[{i}]"
        if p.used_memory_bytes != "n/a":
            yield from _range(f"{pp}.used_memory_bytes", p.used_memory_bytes, 0, U64 - 1)
        if p.utilization is not None:
            for key in ("sm", "mem", "enc", "dec", "jpg", "ofa"):
                yield from _range(f"{pp}.utilization.{key}", getattr(p.utilization, key), 0, 100)
        if p.visible_after_calls is not None:
            yield from _symbol(f"{pp}.visible_after_calls.function", p.visible_after_calls.function)
        always = p.from_cycle is None and p.until_cycle is None
        if always and p.from_s is None and p.until_s is None and p.visible_after_calls is None:
            if p.pid in unbounded:
                yield (
                    f"{pp}.pid",
                    f"duplicates processes[{unbounded[p.pid]}].pid; pid reuse "
                    "needs lifetimes that do not overlap (from_/until_ fields)",
                )
            unbounded[p.pid] = i
    for i, s in enumerate(sets):
        sp = f"{path}.process_sets[{i}]"
        if s.pid_start + (s.count - 1) * s.pid_step > U32:
            yield (f"{sp}.count", "pids would exceed 4294967295")
        if s.used_memory_bytes != "n/a":
            yield from _range(f"{sp}.used_memory_bytes", s.used_memory_bytes, 0, U64 - 1)


def _gpm(path: str, gpm: Gpm | GpmInstance | None) -> Iterator[Problem]:
    """Range-check GPM values; NaN and ±Inf are allowed (a real GPM answer can be non-finite)."""
    if gpm is None:
        return
    for metric_id, value in gpm.metrics.items():
        high = 100 if metric_id in GPM_PERCENT_IDS else math.inf
        checked: Dyn | None = value
        if isinstance(value, GpmTrace):
            finite = [v for v in value.values if math.isfinite(v)]
            checked = value.model_copy(update={"values": finite}) if finite else None
        elif isinstance(value, float) and not math.isfinite(value):
            continue
        yield from _range(f"{path}.metrics[{metric_id}]", checked, 0, high)


def _board(path: str, dev: Device) -> Iterator[Problem]:
    for i, fan in enumerate(dev.fans_percent or ()):
        yield from _range(f"{path}.fans_percent[{i}]", fan, 0, U32)
    yield from _gpm(f"{path}.gpm", dev.gpm)
    if dev.bar1 is not None:
        yield from _range(f"{path}.bar1.used_bytes", dev.bar1.used_bytes, 0, dev.bar1.total_bytes)
    if dev.violations_ns is not None:
        for key in type(dev.violations_ns).model_fields:
            yield from _range(
                f"{path}.violations_ns.{key}", getattr(dev.violations_ns, key), 0, U64
            )
    if dev.nvlink is not None:
        for key in ("data_tx_kib", "data_rx_kib"):
            yield from _range(f"{path}.nvlink.{key}", getattr(dev.nvlink, key), 0, U64)
            for link, traffic in dev.nvlink.per_link.items():
                yield from _range(
                    f"{path}.nvlink.per_link[{link}].{key}", getattr(traffic, key), 0, U64
                )
    rows = dev.remapped_rows
    if rows is not None:
        if dev.ecc is None:
            yield (
                f"{path}.remapped_rows",
                "a board without ecc has no row remapping (nvmlDeviceGetRemappedRows answers "
                "NOT_SUPPORTED there, nvml.h); give ecc or leave remapped_rows out",
            )
        for key in ("correctable", "uncorrectable"):
            yield from _range(f"{path}.remapped_rows.{key}", getattr(rows, key), 0, U32)
        for key in ("pending", "failure"):
            flag = getattr(rows, key)
            if not isinstance(flag, bool):
                yield from _range(f"{path}.remapped_rows.{key}", flag, 0, 1)
    power = dev.power
    if power.min_limit_mw is not None and power.max_limit_mw is not None:
        if power.min_limit_mw > power.max_limit_mw:
            yield (f"{path}.power.min_limit_mw", "must be <= power.max_limit_mw")


def _device(path: str, dev: Device) -> Iterator[Problem]:
    yield from _memory(f"{path}.memory", dev.memory)
    yield from _board(path, dev)
    yield from _range(f"{path}.power.usage_mw", dev.power.usage_mw, 0, U32)
    yield from _range(f"{path}.energy_mj", dev.energy_mj, 0, U64)
    yield from _range(f"{path}.temperature_c", dev.temperature_c, -273, 0x7FFFFFFF)
    yield from _range(f"{path}.fan_percent", dev.fan_percent, 0, U32)
    yield from _range(f"{path}.clocks_event_reasons", dev.clocks_event_reasons, 0, U64)
    for key in ("graphics", "sm", "mem", "video"):
        yield from _range(f"{path}.clocks_mhz.{key}", getattr(dev.clocks_mhz, key), 0, U32)
    for key in ("tx_kbps", "rx_kbps"):
        yield from _range(f"{path}.pcie_kbps.{key}", getattr(dev.pcie_kbps, key), 0, U32)
    if dev.utilization is not None:
        yield from _range(f"{path}.utilization.gpu", dev.utilization.gpu, 0, 100)
        yield from _range(f"{path}.utilization.memory", dev.utilization.memory, 0, 100)
    for key in ("encoder", "decoder"):
        codec = getattr(dev, key)
        if codec is not None:
            yield from _range(f"{path}.{key}.percent", codec.percent, 0, 100)
    if dev.ecc is not None:
        for key in type(dev.ecc).model_fields:
            yield from _range(f"{path}.ecc.{key}", getattr(dev.ecc, key), 0, U64)
    yield from _processes(path, dev.processes, dev.process_sets)
    if dev.mig is None:
        return
    if dev.mig.current == "enabled" and (dev.processes or dev.process_sets):
        yield (f"{path}.processes", "with MIG enabled, processes belong under mig.instances[]")
    slots: dict[int, int] = {}
    ids: dict[tuple[int, int], int] = {}
    gpm_gis: dict[int, int] = {}
    for i, inst in enumerate(dev.mig.instances):
        ip = f"{path}.mig.instances[{i}]"
        if inst.slot >= dev.mig.max_devices:
            yield (f"{ip}.slot", f"must be < mig.max_devices ({dev.mig.max_devices})")
        if inst.slot in slots:
            yield (f"{ip}.slot", f"duplicates mig.instances[{slots[inst.slot]}].slot")
        slots[inst.slot] = i
        yield from _old_mig_uuid(f"{ip}.uuid", inst.uuid, dev.uuid, inst)
        pair = (inst.gpu_instance_id, inst.compute_instance_id)
        if pair in ids:
            yield (f"{ip}.compute_instance_id", f"GI/CI pair duplicates instances[{ids[pair]}]")
        ids[pair] = i
        if inst.gpm is not None:
            if inst.gpu_instance_id in gpm_gis:
                yield (
                    f"{ip}.gpm",
                    f"GPU instance {inst.gpu_instance_id} already has gpm in "
                    f"instances[{gpm_gis[inst.gpu_instance_id]}] (GPM is per GPU instance)",
                )
            gpm_gis[inst.gpu_instance_id] = i
            yield from _gpm(f"{ip}.gpm", inst.gpm)
        yield from _memory(f"{ip}.memory", inst.memory)
        yield from _processes(ip, inst.processes, inst.process_sets)


def _old_mig_uuid(path: str, uuid: str, parent: str, inst: MigInstance) -> Iterator[Problem]:
    """Check that an R450-R465 MIG UUID names the instance's own GPU and ids."""
    old = OLD_MIG_UUID.fullmatch(uuid)
    if old is None:
        return
    if old["gpu"] != parent:
        yield (path, f"names GPU {old['gpu']}, but the instance is on {parent}")
    ids = (int(old["gi"]), int(old["ci"]))
    if ids != (inst.gpu_instance_id, inst.compute_instance_id):
        yield (
            path,
            f"names GPU instance {ids[0]} / compute instance {ids[1]}, but the instance has "
            f"{inst.gpu_instance_id} / {inst.compute_instance_id}",
        )


def _identities(scn: Scenario) -> Iterator[Problem]:
    seen: dict[str, str] = {}
    indices: dict[int, int] = {}
    for i, dev in enumerate(scn.devices):
        path = f"devices[{i}]"
        index = i if dev.index is None else dev.index
        if index in indices:
            yield (f"{path}.index", f"duplicates devices[{indices[index]}] (index {index})")
        indices[index] = i
        uuids = [(f"{path}.uuid", dev.uuid)]
        if dev.mig is not None:
            uuids += [
                (f"{path}.mig.instances[{k}].uuid", m.uuid) for k, m in enumerate(dev.mig.instances)
            ]
        for p, u in uuids:
            if u in seen:
                yield (p, f"UUID {u!r} duplicates {seen[u]}")
            seen[u] = p
    if indices and sorted(indices) != list(range(len(scn.devices))):
        yield ("devices", f"indices must be 0..{len(scn.devices) - 1}, got {sorted(indices)}")


def _device_ref(path: str, ref: int | str | None, scn: Scenario) -> Iterator[Problem]:
    if ref is None:
        return
    if isinstance(ref, int):
        if not 0 <= ref < len(scn.devices):
            yield (path, f"no device with index {ref} (scenario has {len(scn.devices)})")
        return
    uuids = {d.uuid for d in scn.devices}
    for d in scn.devices:
        if d.mig is not None:
            uuids |= {m.uuid for m in d.mig.instances}
    for e in scn.events:
        if e.instance is not None:
            uuids.add(e.instance.uuid)
    if ref not in uuids:
        yield (path, f"no device or MIG instance with UUID {ref!r}")


def _driver(scn: Scenario) -> Iterator[Problem]:
    if scn.driver.profile not in DRIVER_PROFILES:
        yield (
            "driver.profile",
            f"unknown driver profile {scn.driver.profile!r}; known: " + ", ".join(DRIVER_PROFILES),
        )
    for i, name in enumerate(scn.driver.missing_symbols):
        yield from _symbol(f"driver.missing_symbols[{i}]", name)


def _faults_and_events(scn: Scenario) -> Iterator[Problem]:
    for i, f in enumerate(scn.faults):
        yield from _symbol(f"faults[{i}].function", f.function, allow_star=True)
        yield from _device_ref(f"faults[{i}].device", f.device, scn)
    for i, o in enumerate(scn.overrides):
        path = f"overrides[{i}]"
        yield from _symbol(f"{path}.function", o.function)
        yield from _device_ref(f"{path}.device", o.device, scn)
        fields = OVERRIDE_FIELDS.get(o.function)
        if o.function in ALL_SYMBOLS and fields is None:
            yield (f"{path}.function", f"{o.function} has no overridable numeric output")
        elif fields is not None and o.field not in fields:
            yield (
                f"{path}.field",
                f"unknown field {o.field!r} of {o.function}; known: " + ", ".join(fields),
            )
        elif (
            fields is not None
            and isinstance(o.value, int)
            and not (-0x80000000 <= o.value <= fields[o.field])
        ):
            yield (f"{path}.value", f"does not fit the C field (max {fields[o.field]})")
    for i, e in enumerate(scn.events):
        yield from _device_ref(f"events[{i}].device", e.device, scn)
        if e.new_index is not None and e.new_index >= len(scn.devices):
            yield (f"events[{i}].new_index", f"must be < {len(scn.devices)} (the device count)")
    for i, n in enumerate(scn.nvml_events):
        yield from _device_ref(f"nvml_events[{i}].device", n.device, scn)
        yield from _supported(f"nvml_events[{i}].type", n.device, n.type, scn)


def _supported(path: str, ref: int | str, event_type: str, scn: Scenario) -> Iterator[Problem]:
    """Flag an event of a type its GPU does not support: it could never be delivered."""
    for position, dev in enumerate(scn.devices):
        instances = {m.uuid for m in dev.mig.instances} if dev.mig is not None else set()
        index = position if dev.index is None else dev.index
        if ref in (index, dev.uuid) or ref in instances:
            if event_type not in (dev.supported_events or ()):
                yield (path, f"{event_type!r} is not in the GPU's supported_events")
            return


def check_scenario(scn: Scenario) -> list[Problem]:
    """Return every cross-field problem of ``scn`` as ``(path, message)`` pairs (empty if ok)."""
    problems: list[Problem] = []
    problems += _driver(scn)
    problems += _identities(scn)
    for i, dev in enumerate(scn.devices):
        problems += _device(f"devices[{i}]", dev)
    problems += _faults_and_events(scn)
    return problems
