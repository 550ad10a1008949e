"""Fixtures for the simulated-driver tests: install a scenario, always uninstall; and every
test must end the threads it started (:func:`no_leaked_threads`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

import nvmlsim as sim


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test after which a thread it started is still running (a thread left behind acts
    after its test: logs into closed streams, answers a later test's calls). Threads started
    outside Python (``threading._DummyThread``) cannot be joined and are not counted."""
    before = set(threading.enumerate())
    yield
    leaked = [
        f"{t.name!r} (daemon={t.daemon})"
        for t in threading.enumerate()
        if t not in before and t.is_alive() and not isinstance(t, threading._DummyThread)  # noqa: SLF001
    ]
    if leaked:
        pytest.fail(f"the test left thread(s) running: {', '.join(leaked)}", pytrace=False)


@pytest.fixture
def scenarios_dir() -> Path:
    """The folder of the field-case scenarios shipped with nvmlsim (``F01_...yaml``)."""
    return sim.field_case_path("F01_r535_32byte_process_records").parent


@pytest.fixture
def simulate() -> Iterator[Callable[..., sim.SimDriver]]:
    """simulate(scenario_or_data, init=True, **install_kwargs) -> SimDriver.

    ``scenario_or_data`` may be a dict (validated as a scenario), a path, a profile name or
    a Scenario. With ``init`` the fixture calls the real ``pynvml.nvmlInit()``. The driver is
    uninstalled after the test whatever happens.
    """

    def _simulate(scenario: Any, *, init: bool = True, **kwargs: Any) -> sim.SimDriver:
        if isinstance(scenario, dict):
            scenario = sim.scenario_from_data(scenario)
        drv = sim.install(scenario, **kwargs)
        if init:
            pynvml.nvmlInit()
        return drv

    yield _simulate
    sim.uninstall()
