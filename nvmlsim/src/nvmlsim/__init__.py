"""Simulated NVML driver beneath the real, unmodified nvidia-ml-py.

Programs and their tests run the real ``pynvml`` functions; this package answers their
C-level calls (ctypes structs, return codes, missing symbols) from a scenario. The scenario
format, the built-in profiles and the field cases are documented in the distribution's
``README.md``.

Typical test use::

    import nvmlsim
    import pynvml

    with nvmlsim.install(nvmlsim.load_scenario("h100-sxm")) as drv:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlDeviceGetPowerUsage(handle)      # milliwatts from the scenario
        drv.next_cycle()                             # step simulated time
        assert drv.call_count("nvmlDeviceGetPowerUsage", 0) == 1
"""

from nvmlsim.binding import SUPPORTED_NVIDIA_ML_PY, UnsupportedBindingError
from nvmlsim.clock import Clock, ManualClock, WallClock
from nvmlsim.driver import ANY_DEVICE, SimDriver, Violation
from nvmlsim.driver_profiles import DRIVER_PROFILES, DriverProfile
from nvmlsim.install import AlreadyInstalledError, install, installed, uninstall
from nvmlsim.loader import (
    DEFAULT_PROFILE,
    ScenarioError,
    field_case_path,
    list_field_cases,
    list_profiles,
    load_scenario,
    profile_path,
    scenario_from_data,
    scenario_json_schema,
)
from nvmlsim.model.scenario import Scenario

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
    "SUPPORTED_NVIDIA_ML_PY",
    "SimDriver",
    "UnsupportedBindingError",
    "Violation",
    "WallClock",
    "install",
    "field_case_path",
    "installed",
    "list_field_cases",
    "list_profiles",
    "load_scenario",
    "profile_path",
    "scenario_from_data",
    "scenario_json_schema",
    "uninstall",
]
