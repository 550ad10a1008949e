"""Putting the simulated driver beneath the real, unmodified nvidia-ml-py.

``install`` resets nvidia-ml-py's library state and replaces the ``CDLL`` name its loader uses
(both through :mod:`nvmlsim.binding`, the only module that touches the binding's private
attributes), so the next ``nvmlInit()`` runs the binding's own ``_LoadNvmlLibrary`` and
receives the simulated library object instead of ``libnvidia-ml.so.1`` (or an ``OSError`` for
the first ``driver.load_failures`` attempts, or for every attempt with
``driver.library_present: false``, which the binding turns into
``NVMLError_LibraryNotFound``). The library object's attributes are ``CFUNCTYPE`` function
pointers; a symbol missing from the driver profile is a missing attribute. No
``pynvml.nvmlDevice*``/``nvmlSystem*`` function is ever replaced.

The only state lives in nvidia-ml-py's own module: the installed loader is found again as the
binding's ``CDLL``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from nvmlsim import binding
from nvmlsim.clock import Clock, ManualClock
from nvmlsim.dispatch import make_callback
from nvmlsim.driver import LatencyPolicy, SimDriver
from nvmlsim.loader import load_scenario
from nvmlsim.model.scenario import Scenario
from nvmlsim.symbols import all_symbols

__all__ = ["install", "uninstall", "installed", "SimLibrary", "AlreadyInstalledError"]

_LIBRARY_NAMES = ("libnvidia-ml.so.1", "nvml.dll")


class AlreadyInstalledError(RuntimeError):
    """``install`` was called while another simulated driver is installed."""


class SimLibrary:
    """What ``pynvml.nvmlLib`` holds while simulated: one attribute per exported symbol."""

    def __init__(self, functions: dict[str, Any]) -> None:
        self._name = "libnvidia-ml.so.1 (simulated)"
        for name, fn in functions.items():
            setattr(self, name, fn)

    def __repr__(self) -> str:
        return f"<SimLibrary {self._name}>"


class _Loader:
    """Stands in for the binding's ``CDLL``: hands out the simulated library, or fails N times."""

    def __init__(self, driver: SimDriver, library: SimLibrary, original: Callable[..., Any]):
        self.driver = driver
        self.library = library
        self.original = original

    def __call__(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if os.path.basename(str(name)) not in _LIBRARY_NAMES:
            return self.original(name, *args, **kwargs)
        drv = self.driver
        with drv.lock:
            drv.load_attempts += 1
            attempt = drv.load_attempts
            failures = drv.scenario.driver.load_failures
            present = drv.scenario.driver.library_present
            closed = drv.closed
        if closed or not present or attempt <= failures:
            why = (
                "simulated: no NVIDIA driver on this machine"
                if not present
                else f"simulated load failure {attempt} of {failures}"
            )
            raise OSError(
                f"{name}: cannot open shared object file: No such file or directory ({why})"
            )
        return self.library


def installed() -> SimDriver | None:
    """Return the currently installed simulated driver, or None."""
    loader = binding.loader()
    return loader.driver if isinstance(loader, _Loader) else None


def install(
    scenario: Scenario | str | os.PathLike[str],
    *,
    clock: Clock | None = None,
    latency: LatencyPolicy = "clock",
    strict: bool | None = None,
    max_hang_s: float = 30.0,
) -> SimDriver:
    """Install a simulated driver for ``scenario`` beneath nvidia-ml-py and return it.

    Args:
        scenario: a :class:`Scenario`, a scenario file path or a built-in profile name.
        clock: defaults to a :class:`ManualClock` at ``scenario.clock.start_unix``; pass a
            ``WallClock`` for demos.
        latency: how injected latency passes: ``clock`` (default; a manual clock advances by
            it, the wall clock sleeps), ``block`` (manual clock: the call waits until a test
            advances time past its end) or ``off``.
        strict: record lifecycle misuse as violations (default: ``driver.strict``).
        max_hang_s: real seconds before a hung call gives up (recorded as a violation).

    The returned driver is a context manager that uninstalls itself on exit. The caller
    still calls ``pynvml.nvmlInit()`` as with real hardware.

    Raises:
        ScenarioError: the scenario is invalid. AlreadyInstalledError: one is installed.
        UnsupportedBindingError: the installed nvidia-ml-py keeps its library state elsewhere
            (:mod:`nvmlsim.binding`); nothing was changed.

    """
    binding.check_binding()
    scn = load_scenario(scenario)
    if installed() is not None:
        raise AlreadyInstalledError(
            "a simulated NVML driver is already installed; call uninstall() first"
        )
    drv = SimDriver(
        scn,
        clock or ManualClock(scn.clock.start_unix),
        latency=latency,
        strict=strict,
        max_hang_s=max_hang_s,
    )
    functions = {s.name: make_callback(drv, s) for s in all_symbols() if s.name in drv.symbols}
    library = SimLibrary(functions)
    binding.reset_module_state()
    binding.set_loader(_Loader(drv, library, binding.loader()))
    drv.uninstaller = _uninstall_driver
    return drv


def _uninstall_driver(drv: SimDriver) -> None:
    if installed() is drv:
        uninstall()
    else:
        drv.close()


def uninstall() -> SimDriver | None:
    """Remove the installed simulated driver and reset nvidia-ml-py's module state.

    Hung calls are released and every later call through a stale function pointer answers
    UNINITIALIZED. Returns the removed driver (its counters stay readable), or None if no
    simulated driver was installed (then nothing is touched).
    """
    loader = binding.loader()
    if not isinstance(loader, _Loader):
        return None
    loader.driver.close()
    binding.set_loader(loader.original)
    binding.reset_module_state()
    return loader.driver
