"""Fault injection, latency and hangs, events, MIG changes and the clocks."""

from __future__ import annotations

import threading

import pynvml
import pytest

import nvmlsim as sim

from .sim_helpers import MIG_DEVICE, MIG_UUID, UUID0, full_scenario, h0, one_gpu


def _power_faults(*faults: dict) -> dict:
    data = one_gpu(power={"usage_mw": 1000}, clocks_mhz={"graphics": 1, "mem": 2})
    data["faults"] = list(faults)
    return data


def _outcomes(call, n: int, drv: sim.SimDriver | None = None) -> list[object]:
    out: list[object] = []
    for _ in range(n):
        try:
            out.append(call())
        except pynvml.NVMLError as exc:
            out.append(type(exc).__name__.removeprefix("NVMLError_"))
        if drv is not None:
            drv.next_cycle()
    return out


def test_fault_window_by_cycle(simulate):
    drv = simulate(
        _power_faults(
            {
                "function": "nvmlDeviceGetPowerUsage",
                "code": "NOT_SUPPORTED",
                "from_cycle": 2,
                "until_cycle": 4,
            }
        )
    )
    h = h0()
    got = _outcomes(lambda: pynvml.nvmlDeviceGetPowerUsage(h), 5, drv)
    assert got == [1000, "NotSupported", "NotSupported", 1000, 1000]


def test_fault_window_by_seconds(simulate):
    drv = simulate(
        _power_faults(
            {
                "function": "nvmlDeviceGetPowerUsage",
                "code": "TIMEOUT",
                "from_s": 0.5,
                "until_s": 0.7,
            }
        )
    )
    h = h0()
    got = []
    for _ in range(4):
        got += _outcomes(lambda: pynvml.nvmlDeviceGetPowerUsage(h), 1)
        drv.advance(0.25)
    assert got == [1000, 1000, "Timeout", 1000]


def test_fault_after_calls_and_calls(simulate):
    simulate(
        _power_faults(
            {"function": "nvmlDeviceGetPowerUsage", "code": "UNKNOWN", "after_calls": 1, "calls": 2}
        )
    )
    h = h0()
    assert _outcomes(lambda: pynvml.nvmlDeviceGetPowerUsage(h), 5) == [
        1000,
        "Unknown",
        "Unknown",
        1000,
        1000,
    ]


def test_fault_argument_and_device_match(simulate):
    data = full_scenario(
        faults=[
            {"function": "nvmlDeviceGetClockInfo", "arg": 2, "code": "NOT_SUPPORTED"},
            {
                "function": "nvmlDeviceGetPowerUsage",
                "device": MIG_DEVICE["uuid"],
                "code": "UNKNOWN",
            },
        ]
    )
    simulate(data)
    h, other = h0(), pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1222
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 123456
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetPowerUsage(other)


def test_star_fault_on_a_device_spares_system_calls(simulate):
    data = full_scenario(
        faults=[{"function": "*", "device": 1, "code": "GPU_IS_LOST", "from_cycle": 2}]
    )
    drv = simulate(data)
    other = pynvml.nvmlDeviceGetHandleByIndex(1)
    drv.next_cycle()
    assert pynvml.nvmlDeviceGetCount() == 2
    assert pynvml.nvmlDeviceGetPowerUsage(h0()) == 123456
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetName(other)


def test_fault_on_the_data_call_only(simulate):
    data = one_gpu(processes=[{"pid": 1}])
    data["faults"] = [
        {
            "function": "nvmlDeviceGetComputeRunningProcesses_v3",
            "call": "data",
            "code": "NO_PERMISSION",
        }
    ]
    drv = simulate(data)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetComputeRunningProcesses(h0())
    assert drv.call_count("nvmlDeviceGetComputeRunningProcesses_v3", 0) == 2


@pytest.mark.parametrize(("policy", "expected_us"), [("clock", 2_500_000), ("off", 0)])
def test_latency_policies(simulate, policy, expected_us):
    drv = simulate(
        _power_faults({"function": "nvmlDeviceGetPowerUsage", "latency_s": 2.5}), latency=policy
    )
    before = drv.now_us
    assert pynvml.nvmlDeviceGetPowerUsage(h0()) == 1000
    assert drv.now_us - before == expected_us


def test_pcie_window_can_be_turned_off(simulate):
    drv = simulate(one_gpu(pcie_kbps={"tx_kbps": 1}, driver={"pcie_window_ms": 0}))
    before = drv.now_us
    pynvml.nvmlDeviceGetPcieThroughput(h0(), 0)
    assert drv.now_us == before


def test_unreleased_hang_times_out_with_a_violation(simulate):
    drv = simulate(
        _power_faults({"function": "nvmlDeviceGetPowerUsage", "hang": True}), max_hang_s=0.05
    )
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlDeviceGetPowerUsage(h0())
    assert [v.kind for v in drv.violations] == ["hang_not_released"]


def test_uninstall_releases_hung_calls(simulate):
    drv = simulate(_power_faults({"function": "nvmlDeviceGetPowerUsage", "hang": True}))
    h = h0()
    out: list[object] = []

    def worker() -> None:
        try:
            out.append(pynvml.nvmlDeviceGetPowerUsage(h))
        except pynvml.NVMLError as exc:
            out.append(exc)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    assert drv.wait_until_held(1, timeout_s=10)
    sim.uninstall()
    thread.join(timeout=10)
    assert isinstance(out[0], pynvml.NVMLError_Uninitialized)


def test_overrides_apply_to_fields_for_n_calls(simulate):
    data = full_scenario(
        overrides=[
            {
                "function": "nvmlDeviceGetMemoryInfo",
                "field": "used",
                "value": 2**64 - 1,
                "calls": 1,
            },
            {"function": "nvmlDeviceGetPowerUsage", "field": "value", "value": 0, "from_cycle": 2},
        ]
    )
    drv = simulate(data)
    h = h0()
    assert pynvml.nvmlDeviceGetMemoryInfo(h).used == 2**64 - 1
    assert pynvml.nvmlDeviceGetMemoryInfo(h).used == 1024
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 123456
    drv.next_cycle()
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 0


def test_trigger_lose_and_restore_gpu_now(simulate):
    drv = simulate(full_scenario())
    h = h0()
    drv.trigger("lose_gpu", device=0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByUUID(UUID0)
    drv.trigger("restore_gpu", device=UUID0, new_index=1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(h)
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(1)) == UUID0
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(UUID0)) == 1


def test_stale_handle_code_is_configurable(simulate):
    data = full_scenario(driver={"stale_handle_code": "UNKNOWN"})
    drv = simulate(data)
    h = h0()
    drv.trigger("restore_gpu", device=0)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetName(h)


def test_mig_instance_destroyed_and_created(simulate):
    new_instance = {
        "slot": 2,
        "gpu_instance_id": 5,
        "compute_instance_id": 0,
        "uuid": "MIG-00000000-0000-5000-8000-000000000099",
        "name": "2g.10gb",
    }
    data = full_scenario(
        events=[
            {"at_cycle": 2, "action": "destroy_mig_instance", "device": 1, "slot": 0},
            {"at_cycle": 3, "action": "create_mig_instance", "device": 1, "instance": new_instance},
        ]
    )
    drv = simulate(data)
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)
    old = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    drv.next_cycle()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetUUID(old)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID(MIG_UUID)
    drv.next_cycle()
    fresh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2)
    assert pynvml.nvmlDeviceGetGpuInstanceId(fresh) == 5
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 7)  # beyond max_devices


def test_mig_handles_reject_board_calls_and_parent_needs_privilege(simulate):
    simulate(full_scenario())
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(mig)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetMemoryInfo(parent)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(parent)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(parent)


def test_privileged_mig_parent_aggregates(simulate):
    data = full_scenario()
    data["devices"][1]["mig"]["privileged"] = True
    simulate(data)
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetMemoryInfo(parent).total == 42949672960
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(parent)
    assert [(p.pid, p.gpuInstanceId) for p in procs] == [(201, 1)]


def test_reset_energy_event(simulate):
    data = one_gpu(energy_mj={"pattern": "ramp", "start": 1000, "per_s": 10})
    data["events"] = [{"at_s": 2.0, "action": "reset_energy", "device": 0}]
    drv = simulate(data)
    h = h0()
    drv.advance(1.5)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == 1015
    drv.advance(1.0)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == 5  # 0.5 s after the reset


def test_manual_clock_only_moves_forward():
    clock = sim.ManualClock(100.0)
    with pytest.raises(ValueError, match="seconds"):
        clock.advance(-1)
    clock.advance(0.25)
    assert clock.now_us() == 100_250_000


def test_next_cycle_lands_on_cycle_boundaries(simulate):
    drv = simulate(one_gpu() | {"clock": {"cycle_seconds": 0.5}})
    drv.advance(0.2)
    assert drv.cycle == 1
    assert drv.next_cycle() == 2
    assert drv.now_us - drv.timeline.start_us == 500_000
    assert drv.next_cycle(3) == 5


def test_wall_clock_driver_refuses_manual_steps(simulate):
    drv = simulate(one_gpu(temperature_c=40), clock=sim.WallClock())
    assert pynvml.nvmlDeviceGetTemperature(h0(), 0) == 40
    with pytest.raises(TypeError, match="ManualClock"):
        drv.advance(1)
    with pytest.raises(TypeError, match="ManualClock"):
        drv.next_cycle()
