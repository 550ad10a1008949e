"""Per-process energy: the exact split of each interval's board energy (issue 26).

The identity checked everywhere: per GPU and interval, the per-process energy added plus the
unattributed energy added equals the board's delta (``hw.energy``), exactly, in mJ.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from gpumetrics.metrics import names
from gpumetrics.nvml.energy import split_mj
from hypothesis import given
from hypothesis import strategies as st

import nvmlsim as sim

ENERGY = names.MetricEnergy
PROCESS = names.MetricProcessEnergy
REST = names.MetricGPUEnergyUnattributed


def _mj(joules: float) -> int:
    mj = round(joules * 1000)
    assert mj / 1000 == joules  # the value is an integer number of mJ, exactly
    return mj


class Ledger:
    """Cumulative series → per-interval deltas (a new start time restarts from 0)."""

    def __init__(self) -> None:
        self.last: dict[Any, tuple[int, int]] = {}

    def delta(self, key: Any, start: int, value: int) -> int:
        prev = self.last.get(key)
        self.last[key] = (start, value)
        if prev is None or prev[0] != start:
            return value
        assert value >= prev[1], f"{key}: cumulative went down"
        return value - prev[1]


def check_identity(run: Any, cycles: int, outputs: list[Any] | None = None) -> int:
    """Collect ``cycles`` times; assert the identity per GPU and interval; return intervals.

    Each cycle's output is appended to ``outputs`` when given.
    """
    ledger = Ledger()
    checked = 0
    seen_board: set[str] = set()
    for _ in range(cycles):
        run.cycle()
        out = run.output()
        if outputs is not None:
            outputs.append(out)
        board: dict[str, int] = {}
        split: dict[str, int] = defaultdict(int)
        for p in out.find(ENERGY):
            gpu = p.attrs["hw.id"]
            d = ledger.delta((ENERGY, gpu), p.start, _mj(p.value))
            if gpu in seen_board:
                board[gpu] = d
            seen_board.add(gpu)
        for p in out.find(REST):
            gpu = p.attrs["hw.id"]
            split[gpu] += ledger.delta((REST, gpu), p.start, _mj(p.value))
        for p in out.find(PROCESS):
            gpu = p.attrs["hw.id"]
            key = (PROCESS, gpu, p.resource["process.pid"])
            split[gpu] += ledger.delta(key, p.start, _mj(p.value))
        assert set(split) == set(board), (split, board)
        for gpu, delta in board.items():
            assert split[gpu] == delta, f"{gpu}: attributed + unattributed != board delta"
            checked += 1
    return checked


PROFILES = sim.list_profiles()


@pytest.mark.parametrize("profile", PROFILES)
def test_energy_identity_holds_exactly_on_every_profile(nvml_run, profile):
    run = nvml_run(profile)
    intervals = check_identity(run, 6)
    has_energy = any(d.energy_mj is not None for d in run.drv.scenario.devices)
    assert (intervals > 0) == has_energy  # every GPU with an energy counter was checked


def test_the_profiles_attribute_energy_to_processes(nvml_run):
    # the identity is not vacuous: a profile with busy processes attributes most of its energy
    run = nvml_run("h100-8x-training")
    run.cycle(4)
    out = run.output()
    assert sum(p.value for p in out.find(PROCESS)) > 0
    assert {p.resource["process.pid"] for p in out.find(PROCESS)}


@pytest.mark.parametrize("profile", ["a100-mig", "h100-mig"])
def test_mig_energy_is_attributed_at_the_parent_all_unattributed(nvml_run, profile):
    run = nvml_run(profile)
    assert check_identity(run, 5) > 0
    out = run.output()
    assert out.find(PROCESS) == []  # no per-process utilisation under MIG


def _one_gpu(processes: list[dict[str, Any]], energy: Any) -> dict[str, Any]:
    return {
        "clock": {"cycle_seconds": 1.0},
        "driver": {"profile": "570"},
        "devices": [
            {
                "uuid": "GPU-00000000-0000-4000-8000-0000000000e1",
                "energy_mj": energy,
                "process_utilization": {},
                "processes": processes,
            }
        ],
    }


def test_a_counter_reset_interval_is_unattributed_and_never_negative(nvml_run):
    energy = {"pattern": "trace", "per": "cycle", "values": [1000000, 1001000, 3000, 9000, 9500]}
    run = nvml_run(_one_gpu([{"pid": 42, "utilization": {"sm": 50}}], energy))
    rest, proc, starts = [], [], set()
    for _ in range(5):
        run.cycle()
        out = run.output()
        rest += [_mj(p.value) for p in out.find(REST)]
        proc += [_mj(p.value) for p in out.find(PROCESS, pid=42)]
        starts |= {p.start for p in out.find(REST)}
    # board deltas: +1000, reset (3000 since it), +6000, +500; halves to pid 42 except the
    # reset's interval, all unattributed; the sidecar's own series never restart
    assert proc == [500, 500, 3500, 3750]
    assert rest == [500, 3500, 6500, 6750]
    assert len(starts) == 1


def test_shares_follow_sm_utilisation_and_idle_processes_get_zero(nvml_run):
    energy = {"pattern": "ramp", "start": 0, "per_s": 100000}  # 100 J per 1 s cycle
    procs = [
        {"pid": 7, "utilization": {"sm": 30}},
        {"pid": 8, "utilization": {"sm": 10}},
        {"pid": 9},  # runs, no sample: idle
    ]
    run = nvml_run(_one_gpu(procs, energy))
    run.cycle(3)
    out = run.output()
    last = {p.resource["process.pid"]: _mj(p.value) for p in out.find(PROCESS)}
    assert last == {7: 60000, 8: 20000, 9: 0}  # two intervals of 100 J: 30 %, 10 %, 0 %
    assert _mj(out.find(REST)[-1].value) == 120000


@given(
    delta=st.integers(min_value=0, max_value=10**12),
    sm=st.lists(st.integers(min_value=0, max_value=100), max_size=64),
)
def test_split_is_exact_and_proportional(delta, sm):
    shares, rest = split_mj(delta, sm)
    assert sum(shares) + rest == delta
    assert rest >= 0 and all(s >= 0 for s in shares)
    denominator = max(100, sum(sm))
    for s, share in zip(sm, shares, strict=True):
        exact = delta * s / denominator
        assert abs(share - exact) < 1 + 1e-9 * exact  # within one mJ of the exact share
    if sum(sm) >= 100:
        assert rest == 0  # busy the whole interval: nothing left over


def test_split_refuses_negative_input():
    with pytest.raises(ValueError, match="delta_mj"):
        split_mj(-1, [10])


def test_the_left_over_millijoules_go_to_the_largest_remainders():
    # 7 mJ at 30/45/25 %: 2.1, 3.15, 1.75 -> floors 2, 3, 1; the one left goes to 1.75
    assert split_mj(7, [30, 45, 25]) == ([2, 3, 2], 0)
    # equal remainders: the process listed first; an idle GPU share stays unattributed
    assert split_mj(10, [50, 25, 25]) == ([5, 3, 2], 0)
    assert split_mj(10, [20, 10]) == ([2, 1], 7)


def test_a_pid_that_leaves_ends_its_series_and_a_reused_pid_starts_anew(nvml_run):
    energy = {"pattern": "ramp", "start": 0, "per_s": 100000}
    procs = [
        {"pid": 50, "until_s": 2.5, "utilization": {"sm": 50}},
        {"pid": 50, "from_s": 3.5, "utilization": {"sm": 50}},
        {"pid": 51, "utilization": {"sm": 10}},
    ]
    run = nvml_run(_one_gpu(procs, energy))
    outputs: list[Any] = []
    assert check_identity(run, 6, outputs) == 5
    series: dict[int, list[int]] = {}
    for p in (p for out in outputs for p in out.find(PROCESS, pid=50)):
        series.setdefault(p.start, []).append(_mj(p.value))
    first, second = sorted(series)
    assert series[first] == [50000, 100000]  # intervals (0,1], (1,2]; gone at 3 s
    assert series[second][0] == 50000 and second > first  # back at 4 s: a new series
