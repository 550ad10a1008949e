"""Install/uninstall, nvidia-ml-py module state, init refcount, handles and counters.

The lifecycle field cases (F12, F13, F14, F22) are in test_sim_field_cases.py."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

import nvmlsim as sim
from nvmlsim.install import SimLibrary

from .sim_helpers import full_scenario, h0, one_gpu


def _pynvml_state():
    return (pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache), pynvml._nvmlLib_refcount)


def test_install_and_uninstall_reset_pynvml_module_state(simulate):
    pynvml._nvmlGetFunctionPointer_cache["stale"] = object()
    drv = simulate(one_gpu(power={"usage_mw": 5}), init=False)
    assert _pynvml_state() == (None, {}, 0)
    assert pynvml.CDLL is not ctypes.CDLL
    pynvml.nvmlInit()
    assert isinstance(pynvml.nvmlLib, SimLibrary)
    assert pynvml._nvmlLib_refcount == 1
    assert pynvml.nvmlDeviceGetPowerUsage(h0()) == 5
    assert sim.installed() is drv
    assert sim.uninstall() is drv
    assert _pynvml_state() == (None, {}, 0)
    assert pynvml.CDLL is ctypes.CDLL
    assert sim.installed() is None
    assert sim.uninstall() is None
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_second_install_is_refused(simulate):
    simulate(one_gpu())
    with pytest.raises(sim.AlreadyInstalledError):
        sim.install(sim.scenario_from_data(one_gpu()))


def test_context_manager_uninstalls():
    with sim.install(sim.scenario_from_data(one_gpu(temperature_c=44))) as drv:
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetTemperature(h0(), 0) == 44
        assert sim.installed() is drv
    assert sim.installed() is None
    assert pynvml.nvmlLib is None


def test_many_installs_in_one_process_see_their_own_scenario():
    for temp in (30, 31, 32, 33):
        with sim.install(sim.scenario_from_data(one_gpu(temperature_c=temp))) as drv:
            pynvml.nvmlInit()
            assert pynvml.nvmlDeviceGetTemperature(h0(), 0) == temp
            assert drv.call_count("nvmlDeviceGetTemperature", 0) == 1


def test_other_libraries_still_load_while_installed(simulate):
    simulate(one_gpu(), init=False)
    libc = pynvml.CDLL("libc.so.6")
    assert isinstance(libc, ctypes.CDLL)


def test_stale_function_pointer_after_uninstall_answers_uninitialized():
    drv = sim.install(sim.scenario_from_data(one_gpu(temperature_c=40)))
    pynvml.nvmlInit()
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetCount_v2")
    sim.uninstall()
    count = ctypes.c_uint(99)
    assert fn(ctypes.byref(count)) == pynvml.NVML_ERROR_UNINITIALIZED
    assert count.value == 99
    assert drv.violations == []


def test_init_refcount_and_calls_after_shutdown(simulate):
    drv = simulate(one_gpu(temperature_c=40))
    pynvml.nvmlInitWithFlags(pynvml.NVML_INIT_FLAG_NO_GPUS)
    assert drv.init_count == 2
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetTemperature(h0(), 0) == 40
    pynvml.nvmlShutdown()
    assert drv.init_count == 0
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()
    # the cached function pointers still reach the library, which answers UNINITIALIZED
    assert "nvmlDeviceGetCount_v2" in pynvml._nvmlGetFunctionPointer_cache
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 1
    assert drv.violations == []  # not strict


def test_access_revoked_and_restored(simulate):
    drv = simulate(one_gpu(temperature_c=40))
    h = h0()
    drv.trigger("revoke_access")
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetTemperature(h, 0)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    drv.trigger("restore_access")
    assert pynvml.nvmlDeviceGetTemperature(h, 0) == 40


def test_clean_shutdown_has_no_violation_in_strict_mode(simulate):
    drv = simulate(one_gpu(temperature_c=40), strict=True)
    pynvml.nvmlDeviceGetTemperature(h0(), 0)
    pynvml.nvmlShutdown()
    assert drv.violations == []


def test_null_and_unknown_handles_are_rejected_and_recorded(simulate):
    drv = simulate(full_scenario())
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetPowerUsage(pynvml.c_nvmlDevice_t())
    bogus = ctypes.cast(ctypes.c_void_p(0xDEAD0000), pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(bogus)
    assert [v.kind for v in drv.violations] == ["invalid_handle", "invalid_handle"]
    assert drv.call_count("nvmlDeviceGetPowerUsage", None) == 1


def test_handle_from_a_previous_install_is_unknown(simulate):
    with sim.install(sim.scenario_from_data(one_gpu())):
        pynvml.nvmlInit()
        old = h0()
    drv = simulate(one_gpu())
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetUUID(old)
    assert [v.kind for v in drv.violations] == ["invalid_handle"]


def test_internal_error_is_unknown_never_success(simulate, monkeypatch):
    drv = simulate(full_scenario())
    h = h0()

    def broken(*args, **kwargs):
        raise RuntimeError("simulator bug")

    monkeypatch.setattr(drv.world, "processes", broken)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetComputeRunningProcesses_v3(h)
    assert [v.kind for v in drv.violations] == ["internal_error"]
    assert "simulator bug" in drv.violations[0].detail


def test_call_counters_and_time_in_driver(simulate):
    drv = simulate(full_scenario())
    h = h0()
    for _ in range(3):
        pynvml.nvmlDeviceGetPowerUsage(h)
    pynvml.nvmlDeviceGetPowerUsage(pynvml.nvmlDeviceGetHandleByIndex(1))
    assert drv.call_count("nvmlDeviceGetPowerUsage", 0) == 3
    assert drv.call_count("nvmlDeviceGetPowerUsage", 1) == 1
    assert drv.call_count("nvmlDeviceGetPowerUsage") == 4
    assert drv.calls[("nvmlInitWithFlags", None)] == 1
    assert drv.time_in_driver_s > 0
    assert drv.cpu_in_driver_s > 0
    assert drv.stats()["calls"] == sum(drv.calls.values())
    assert drv.stats()["cpu_in_driver_s"] == drv.cpu_in_driver_s
    drv.reset_calls()
    assert drv.calls == {}
