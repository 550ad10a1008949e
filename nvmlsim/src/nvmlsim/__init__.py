"""Simulated NVML driver beneath the real, unmodified nvidia-ml-py.

Tests and ``gpumetrics serve --simulate`` run the real ``pynvml`` functions; this package
answers their C-level calls (ctypes structs, return codes, missing symbols) from a scenario.
The format is documented in ``docs/simulated-driver.md``.

Typical test use::

    from gpumetrics.nvml import sim
    import pynvml

    with sim.install(sim.load_scenario("h100-sxm")) as drv:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlDeviceGetPowerUsage(handle)      # milliwatts from the scenario
        drv.next_cycle()                             # step simulated time
        assert drv.call_count("nvmlDeviceGetPowerUsage", 0) == 1
"""

from gpumetrics.nvml.sim.clock import Clock, ManualClock, WallClock
from gpumetrics.nvml.sim.driver import ANY_DEVICE, SimDriver, Violation
from gpumetrics.nvml.sim.driver_profiles import DRIVER_PROFILES, DriverProfile
from gpumetrics.nvml.sim.install import AlreadyInstalledError, install, installed, uninstall
from gpumetrics.nvml.sim.loader import (
    DEFAULT_PROFILE,
    ScenarioError,
    list_profiles,
    load_scenario,
    profile_path,
    scenario_from_data,
    scenario_json_schema,
)
from gpumetrics.nvml.sim.model.scenario import Scenario

__all__ = [
    "ANY_DEVICE",
    "AlreadyInstalledError",
    "Clock",
    "DEFAULT_PROFILE",
    "DRIVER_PROFILES",
    "DriverProfile",
    "ManualClock",
    "Scenario",
    "ScenarioError",
    "SimDriver",
    "Violation",
    "WallClock",
    "install",
    "installed",
    "list_profiles",
    "load_scenario",
    "profile_path",
    "scenario_from_data",
    "scenario_json_schema",
    "uninstall",
]
