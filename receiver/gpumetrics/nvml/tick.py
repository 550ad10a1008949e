"""One tick of one physical GPU (and its MIG instances), run on that GPU's worker.

Order of reads in a tick (each NVML call made at most once; one read feeds every metric that
needs it):

- GPU without MIG: GPM (first, so the two samples of a pair are one tick apart), utilisation
  (samples, snapshot fallback), encoder/decoder, memory, then the board: power (samples,
  snapshot fallback), power limits, energy, temperature, clocks, clock-event reasons, P-state,
  fans, BAR1, encoder sessions, NVLink data counters, PCIe (when due), ECC, NVLink links,
  violation counters and memory repair (when ``errors_interval_s`` is due); then process
  utilisation and the process lists (which filter the utilisation samples), the energy split
  (the energy and utilisation reads again, no call of its own) and the accounting records.
- MIG-enabled GPU: board-level values once on the parent (the board list above; its energy
  delta is all unattributed: no per-process utilisation under MIG);
  utilisation and process utilisation are skipped (documented unsupported under MIG); GPM on
  the parent (the whole GPU) and per GPU instance, after the instances are known; then, per MIG
  instance, memory and process lists on the instance handle. Instances are re-enumerated every
  ``mig_interval_s`` and in the next tick after an instance handle went stale.

While some GPU is failed, each tick first checks the device's index (``nvmlDeviceGetIndex``)
and re-reads its identity if it moved (F11 variant B). A failed device gets only its back-off
probe (:func:`probe`). Fatal answers propagate:
:class:`~gpumetrics.nvml.calls.DeviceLost` marks the device (or instance) failed and ends its
tick; :class:`~gpumetrics.nvml.calls.LibraryDown` ends every device's tick.
"""

from __future__ import annotations

import pynvml

from gpumetrics.nvml.accounting import collect_accounting
from gpumetrics.nvml.board import collect_bar1, collect_encoder_stats, collect_pstate
from gpumetrics.nvml.calls import DeviceLost
from gpumetrics.nvml.clocks import collect_clocks, collect_event_reasons
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.device import Device, check_index, enumerate_mig, read_physical
from gpumetrics.nvml.ecc import collect_ecc
from gpumetrics.nvml.energy import attribute_energy
from gpumetrics.nvml.fans import collect_fans
from gpumetrics.nvml.gpm import collect_gpm, free_gpm
from gpumetrics.nvml.memory import collect_memory
from gpumetrics.nvml.memory_health import collect_memory_health
from gpumetrics.nvml.nvlink import collect_nvlink_io, collect_nvlink_links
from gpumetrics.nvml.pcie import collect_pcie
from gpumetrics.nvml.power import (
    collect_energy,
    collect_power,
    collect_power_constraints,
    collect_power_limit,
)
from gpumetrics.nvml.processes import (
    collect_process_counts,
    collect_process_memory,
    read_processes,
)
from gpumetrics.nvml.procutil import collect_process_utilization, read_process_utilization
from gpumetrics.nvml.query import QueryError
from gpumetrics.nvml.thermal import collect_temperature
from gpumetrics.nvml.utilization import collect_codec, collect_utilization
from gpumetrics.nvml.violations import collect_violations


def _board(dev: Device, tick: Tick) -> int | None:
    """Read the board values; return the energy reading (mJ) for the energy split."""
    collect_power(dev, tick)
    collect_power_limit(dev, tick)
    collect_power_constraints(dev, tick)
    energy_mj = collect_energy(dev, tick)
    collect_temperature(dev, tick)
    collect_clocks(dev, tick)
    collect_event_reasons(dev, tick)
    collect_pstate(dev, tick)
    collect_fans(dev, tick)
    collect_bar1(dev, tick)
    collect_encoder_stats(dev, tick)
    collect_nvlink_io(dev, tick)
    collect_pcie(dev, tick)
    collect_ecc(dev, tick)
    collect_nvlink_links(dev, tick)
    collect_violations(dev, tick)
    collect_memory_health(dev, tick)
    return energy_mj


def _processes(dev: Device, tick: Tick, utilization: bool, energy_mj: int | None = None) -> None:
    """Process utilisation, lists, accounting and (on a GPU without MIG) the energy split."""
    if not tick.ctx.settings.process_metrics:
        if utilization:
            attribute_energy(dev, tick, energy_mj, None, None)
        return
    samples = read_process_utilization(dev, tick) if utilization else None
    counts: dict[str, int] = {}
    entries = read_processes(dev, tick, counts)
    if entries is not None:
        collect_process_memory(dev, tick, entries)
        collect_process_counts(dev, tick, counts)
    live = None if entries is None else entries.keys()
    if samples is not None:
        collect_process_utilization(dev, tick, samples, live)
    if utilization:  # a GPU without MIG: accounting is unsupported with MIG enabled
        attribute_energy(dev, tick, energy_mj, samples, live)
        collect_accounting(dev, tick, live)


def _instance(inst: Device, tick: Tick) -> bool:
    """Read one MIG instance into its own points; True when its handle went stale."""
    inst.calls.begin_tick()
    sub = Tick(tick.ctx, tick.now_ns, tick.mono_ns)
    try:
        collect_memory(inst, sub)
        _processes(inst, sub, utilization=False)
    except DeviceLost as lost:
        inst.health.fail(tick.mono_ns, lost.error.code_name)
        return True
    stale = any(r in ("INVALID_ARGUMENT", "NOT_FOUND") for r in inst.calls.reasons)
    inst.health.tick_done(inst.calls.degraded, ",".join(inst.calls.reasons))
    inst.calls.end_tick(_read_anything(sub))
    tick.points.extend(sub.points)
    return stale


def _read_anything(tick: Tick) -> bool:
    return bool(tick.points)


def run_tick(dev: Device, tick: Tick) -> None:
    """Read every due metric of a healthy physical GPU into ``tick.points``.

    Raises:
        DeviceLost: the GPU is lost (its points for this tick must be discarded; its GPM
            sample buffers are freed first).
        LibraryDown: a lifecycle code (every device's points must be discarded).

    """
    try:
        _read_device(dev, tick)
    except DeviceLost:
        free_gpm(dev)
        raise


def _read_device(dev: Device, tick: Tick) -> None:
    dev.calls.begin_tick()
    if tick.check_index:
        check_index(tick.ctx, dev)
    if dev.mig_enabled:
        # no per-process utilisation under MIG: the parent's energy is all unattributed
        attribute_energy(dev, tick, _board(dev, tick), None, None)
        last = dev.state.get("mig_enumerated_ns")
        due = last is None or tick.mono_ns - last >= round(tick.ctx.settings.mig_interval_s * 1e9)
        if due or dev.state.pop("mig_stale", False):
            enumerate_mig(tick.ctx, dev, tick.now_ns)
        collect_gpm(dev, tick)
        for inst in list(dev.instances.values()):
            if _instance(inst, tick):
                dev.state["mig_stale"] = True
    else:
        collect_gpm(dev, tick)
        collect_utilization(dev, tick)
        collect_codec(dev, tick)
        collect_memory(dev, tick)
        energy_mj = _board(dev, tick)
        _processes(dev, tick, utilization=True, energy_mj=energy_mj)
    dev.health.tick_done(dev.calls.degraded, ",".join(dev.calls.reasons))
    dev.calls.end_tick(_read_anything(tick))


def probe(dev: Device, tick: Tick) -> Device | None:
    """One back-off probe of a failed device; return its fresh record when it answers again.

    A device with a known UUID is looked up with ``nvmlDeviceGetHandleByUUID`` (it may come
    back at another index, F11 variant B) and must answer ``nvmlDeviceGetIndex``; a placeholder
    (``index:N``) retries ``nvmlDeviceGetHandleByIndex(N)`` and reads its identity (F10).
    Returns None (and schedules the next probe) while it still fails.

    Raises:
        LibraryDown: a lifecycle code.

    """
    c = dev.calls
    c.begin_tick()
    try:
        if dev.uuid.startswith("index:"):
            assert dev.index is not None
            handle = c.query(
                "nvmlDeviceGetHandleByIndex",
                "nvmlDeviceGetHandleByIndex",
                pynvml.nvmlDeviceGetHandleByIndex,
                dev.index,
            )
            return read_physical(tick.ctx, c, handle, dev.index, tick.now_ns)
        handle = c.query(
            "nvmlDeviceGetHandleByUUID",
            "nvmlDeviceGetHandleByUUID",
            pynvml.nvmlDeviceGetHandleByUUID,
            dev.uuid,
        )
        index = int(
            c.query("nvmlDeviceGetIndex", "nvmlDeviceGetIndex", pynvml.nvmlDeviceGetIndex, handle)
        )
        return read_physical(tick.ctx, c, handle, index, tick.now_ns)
    except DeviceLost as lost:
        dev.health.fail(tick.mono_ns, lost.error.code_name)
        return None
    except QueryError as err:
        dev.health.fail(tick.mono_ns, err.code_name)
        return None
