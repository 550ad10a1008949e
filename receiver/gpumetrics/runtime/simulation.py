"""``serve --simulate``: the only place the product imports the simulated driver.

The simulated NVML driver is its own distribution, ``nvmlsim`` (``nvmlsim/`` in this
repository), installed with the ``sim`` extra. It is imported here, lazily, and nowhere else in
the product (an import-linter contract in ``pyproject.toml`` holds that), so a sidecar
installed without the extra never loads it.
"""

from __future__ import annotations

import logging
from typing import Any

from gpumetrics.config import ConfigError

__all__ = ["INSTALL_HINT", "default_profile", "install_simulation", "uninstall_simulation"]

log = logging.getLogger(__name__)

#: How to get ``--simulate``; part of the error when the simulator is missing.
INSTALL_HINT = (
    "the simulated NVML driver (the nvmlsim package) is not installed: install it from a "
    "checkout of the repository with pip install ./nvmlsim '.[sim]' (neither package is on "
    "PyPI)"
)


def _nvmlsim() -> Any:
    try:
        import nvmlsim
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "nvmlsim":
            raise  # something nvmlsim itself needs is missing: a broken install, say so as is
        raise ConfigError.setting("runtime.simulate", INSTALL_HINT) from None
    return nvmlsim


def install_simulation(spec: str) -> bool:
    """Install the simulated NVML driver beneath nvidia-ml-py.

    ``spec`` is a built-in profile name, a field-case name, ``default`` (the simulator's
    default profile), or the path of a scenario file.

    Returns:
        True when this call installed it (the caller calls :func:`uninstall_simulation` at
        shutdown), False when a simulated driver was already installed and is used as it is.

    Raises:
        ConfigError: naming ``runtime.simulate`` when the simulator is not installed, when the
            installed nvidia-ml-py is one it cannot sit beneath, or when the profile or file
            cannot be loaded.

    """
    sim = _nvmlsim()
    try:
        scenario = sim.load_scenario(sim.DEFAULT_PROFILE if spec == "default" else spec)
        sim.install(scenario, clock=sim.WallClock())
    except sim.ScenarioError as exc:
        problems = [f"{exc.source}: {p + ': ' if p else ''}{m}" for p, m in exc.problems]
        raise ConfigError.setting("runtime.simulate", *problems) from None
    except sim.UnsupportedBindingError as exc:
        raise ConfigError.setting("runtime.simulate", str(exc)) from None
    except sim.AlreadyInstalledError:
        log.info("a simulated driver is already installed; using it")
        return False
    log.warning(
        "SIMULATED GPUs: readings come from the simulated NVML driver (%s), not from hardware",
        spec,
    )
    return True


def default_profile() -> str:
    """Return the name of the simulator's default profile (``--simulate`` without a value)."""
    return str(_nvmlsim().DEFAULT_PROFILE)


def uninstall_simulation() -> None:
    """Remove the simulated driver :func:`install_simulation` installed (after nvmlShutdown)."""
    import nvmlsim

    nvmlsim.uninstall()
