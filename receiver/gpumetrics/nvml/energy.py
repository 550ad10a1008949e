"""Per-process energy: each interval's board energy split by SM utilisation share.

``nvidia.gpu.process.energy`` (J, a cumulative Sum on each process's resource) and
``nvidia.gpu.energy.unattributed`` (J, a cumulative Sum on the device) come from the two reads
the tick already makes: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ, the ``hw.energy`` read)
and the per-process utilisation samples (``smUtil``, the ``nvidia.gpu.process.utilization``
read). No NVML call of their own.

**Method.** Per GPU and interval (two consecutive energy readings), the delta ``E`` in integer
millijoules (NVML's unit) is split across the processes of this tick's share table: every
validated sample's pid that is in the running-process lists, plus running processes without a
sample (idle: share 0, as NVML returns samples only for processes "that had some non-zero
utilization during the last sample period"). Process ``i`` with SM utilisation ``s_i`` (%)
gets ``E * s_i / D`` with ``D = max(100, Σ s)``: a GPU busy 30 % of the interval for one process
attributes 30 % of the energy to it, and the rest is unattributed (idle power, and time no
process had a kernel on the SMs); when the samples sum above 100 % (time-sliced or MPS processes
overlapping) the shares are normalised to the whole delta. The split is exact in integers: the
attributed total is ``floor(E * Σ s / D)``, each process gets ``floor(E * s_i / D)`` and the
millijoules left over go one each to the processes with the largest remainders (ties to the
process listed first: sampled pids in the driver's order, then idle ones by pid), the Hamilton
/ largest-remainder method; the unattributed part is ``E`` minus the
attributed total. So per GPU and interval, attributed + unattributed == the board's delta,
exactly, in mJ (the emitted values are those integers ÷ 1000).

**Intervals without a split.** All of the delta is unattributed when no per-process
utilisation was read in the tick (the call failed, is unsupported, answered NOT_FOUND: no
process had a sample; process metrics are off) and on MIG-enabled GPUs, where NVML's
per-process utilisation is unsupported (NVML API reference, ``nvmlDeviceGetProcessUtilization``;
its samples are per physical GPU, never per GPU instance), so MIG energy is attributed at the
parent: the parent's delta, all of it unattributed. A reading that failed leaves its interval
to the next reading (the delta then spans both).

**Counter resets.** A reading below the previous one is a reset (driver reload, GPU reset;
field case F23): the interval's delta is the new reading itself, the energy counted since the
reset (what ``hw.energy``'s new series reports from an implicit zero), and all of it is
unattributed, since the processes and sample cursor of before the reset say nothing about it.
No delta is ever negative. These are the sidecar's own cumulative counters, so they do not
restart with ``hw.energy``: they count from the device's first interval.

**Series.** A process's series starts at the start of the first interval it has a share in
and is emitted every tick it is in the share table; a pid that leaves the table (it ended, or
no sample was read for it with the lists unreadable) ends its series, so a reused pid starts a
new one. The state (per pid: millijoules and start) is bounded by the processes of one tick.
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import add

from gpumetrics.metrics import names
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.procutil import ProcessSamples

_MJ_PER_J = 1000.0


def split_mj(delta_mj: int, sm_percent: Sequence[int]) -> tuple[list[int], int]:
    """Split ``delta_mj`` by SM utilisation share, exactly, in integer millijoules.

    Args:
        delta_mj: the interval's board energy (mJ, >= 0).
        sm_percent: each process's SM utilisation (%, 0-100); on equal remainders the process
            listed first gets the extra millijoule.

    Returns:
        ``(shares, unattributed)``: each process's mJ and the rest, ``sum(shares) +
        unattributed == delta_mj``, every part >= 0.

    Raises:
        ValueError: a negative delta or percentage.

    """
    if delta_mj < 0 or (sm_percent and min(sm_percent) < 0):
        raise ValueError("delta_mj and sm_percent must be >= 0")
    total = sum(sm_percent)
    if not delta_mj or not total:
        return [0] * len(sm_percent), delta_mj
    denominator = max(100, total)
    attributed = delta_mj * total // denominator
    scaled = list(map(delta_mj.__mul__, sm_percent))
    shares = list(map(denominator.__rfloordiv__, scaled))
    left = attributed - sum(shares)
    if left:  # largest remainders first (a stable sort: ties to the process listed first)
        remainders = list(map(denominator.__rmod__, scaled))
        for i in sorted(range(len(shares)), key=remainders.__getitem__, reverse=True)[:left]:
            shares[i] += 1
    return shares, delta_mj - attributed


@dataclass
class EnergySplit:
    """One GPU's attribution state (``Device.state["energy_split"]``).

    Attributes:
        last_mj: the previous energy reading (mJ), None before the first.
        last_ns: its time (Unix ns): the start of the next interval.
        unattributed_mj: the unattributed total since ``unattributed_start_ns``.
        unattributed_start_ns: the unattributed series' start (Unix ns).
        pids: the share table's pids of the last interval, in its order.
        totals: per pid of ``pids``, its attributed total (mJ) of its current series.
        starts: per pid of ``pids``, its series start (Unix ns).
        held: pid → (total, start) of running processes that were not in the last table
            (their sample was dropped as garbage): their series go on when they come back.

    """

    last_mj: int | None = None
    last_ns: int = 0
    unattributed_mj: int = 0
    unattributed_start_ns: int = 0
    pids: list[int] = field(default_factory=list)
    totals: list[int] = field(default_factory=list)
    starts: array[int] = field(default_factory=lambda: array("q"))
    held: dict[int, tuple[int, int]] = field(default_factory=dict)


def _share_table(
    samples: ProcessSamples, live: Collection[int] | None
) -> tuple[list[int], list[int]]:
    """``(pids, sm %)``: sampled pids (mean per pid) in ``live`` and idle ``live`` pids (0)."""
    pids: list[int] = list(samples.pids)
    sm: list[int] = list(samples.percents[0])
    if len(set(pids)) != len(pids):  # several samples of one pid: their mean, rounded down
        sums: dict[int, list[int]] = {}
        for pid, s in zip(pids, sm, strict=True):
            entry = sums.setdefault(pid, [0, 0])
            entry[0] += s
            entry[1] += 1
        pids = list(sums)
        sm = [total // count for total, count in sums.values()]
    if live is None:
        return pids, sm
    live_set = live if isinstance(live, frozenset | set) else frozenset(live)
    if not live_set.issuperset(pids):  # samples of processes that are gone: not theirs
        keep = list(map(live_set.__contains__, pids))
        pids = list(compress(pids, keep))
        sm = list(compress(sm, keep))
    idle = sorted(live_set.difference(samples.sampled))
    pids.extend(idle)
    sm.extend(repeat(0, len(idle)))
    return pids, sm


def attribute_energy(
    dev: Device,
    tick: Tick,
    energy_mj: int | None,
    samples: ProcessSamples | None,
    live: Collection[int] | None,
) -> None:
    """Split this interval's energy delta; add the process and unattributed points.

    Args:
        dev: a physical GPU (MIG-enabled ones pass ``samples`` None).
        tick: the current tick.
        energy_mj: this tick's ``nvmlDeviceGetTotalEnergyConsumption`` reading (mJ), or None
            when it was not read (nothing happens: the interval joins the next one).
        samples: this tick's per-process utilisation answer, or None when none was read.
        live: pids of this tick's running-process lists, or None when unreadable.

    """
    if energy_mj is None or not tick.wants(
        names.MetricProcessEnergy, names.MetricGPUEnergyUnattributed
    ):
        return
    st: EnergySplit | None = dev.state.get("energy_split")
    if st is None:
        st = dev.state["energy_split"] = EnergySplit()
    now = tick.now_ns
    if st.last_mj is None or now <= st.last_ns:
        st.last_mj, st.last_ns = energy_mj, now  # the first reading: no interval yet
        return
    interval_start = st.last_ns
    reset = energy_mj < st.last_mj
    delta = energy_mj if reset else energy_mj - st.last_mj
    st.last_mj, st.last_ns = energy_mj, now
    if not st.unattributed_start_ns:
        st.unattributed_start_ns = interval_start
    if samples is None:
        st.unattributed_mj += delta
    else:
        pids, sm = _share_table(samples, live)
        # a reset's interval: the processes keep their totals, the delta is unattributed
        shares, rest = ([0] * len(pids), delta) if reset else split_mj(delta, sm)
        st.unattributed_mj += rest
        _add_processes(dev, tick, st, pids, shares, interval_start, live)
    if tick.wants(names.MetricGPUEnergyUnattributed):
        tick.points.add(
            names.MetricGPUEnergyUnattributed,
            st.unattributed_mj / _MJ_PER_J,
            now,
            dev.attrs,
            st.unattributed_start_ns,
        )


def _add_processes(
    dev: Device,
    tick: Tick,
    st: EnergySplit,
    pids: list[int],
    shares: list[int],
    interval_start: int,
    live: Collection[int] | None,
) -> None:
    if pids != st.pids:  # the processes changed (a C-level compare; the same ones: no lookups)
        _realign(st, pids, interval_start, live)
    st.totals = list(map(add, st.totals, shares))
    if not pids or not tick.wants(names.MetricProcessEnergy):
        return
    tick.points.block(
        names.MetricProcessEnergy,
        dev.id_attrs,
        array("q", pids),
        array("d", map(_MJ_PER_J.__rtruediv__, st.totals)),
        tick.now_ns,
        array("q", st.starts),
    )


def _realign(
    st: EnergySplit, pids: list[int], interval_start: int, live: Collection[int] | None
) -> None:
    """Line the totals and starts up with a new share table.

    A pid no longer running (or, without process lists, not in the table) ends its series; a
    running one missing from the table keeps its series in ``held``; a new pid starts one at
    ``interval_start``.
    """
    old = dict(zip(st.pids, zip(st.totals, st.starts, strict=True), strict=True))
    old.update(st.held)
    new = (0, interval_start)
    rows = [old.pop(pid, new) for pid in pids]
    keep = frozenset(live) if live is not None else frozenset()
    st.held = {pid: row for pid, row in old.items() if pid in keep}
    st.pids = list(pids)
    st.totals = [total for total, _ in rows]
    st.starts = array("q", [start for _, start in rows])
