"""nvmlsim.binding: the private nvidia-ml-py state the simulator relies on, checked before use."""

from __future__ import annotations

import ctypes
import importlib.metadata

import pynvml
import pytest

import nvmlsim as sim
from nvmlsim import binding

from .sim_helpers import one_gpu


def test_the_installed_binding_keeps_its_state_where_the_simulator_expects():
    binding.check_binding()  # raises on any drift
    assert binding.loader() is ctypes.CDLL  # nothing installed: the binding's own loader


def test_the_installed_binding_is_inside_the_declared_range():
    version = importlib.metadata.version("nvidia-ml-py")
    low, high = (part.lstrip("><=") for part in sim.SUPPORTED_NVIDIA_ML_PY.split(","))
    as_tuple = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert as_tuple(low) <= as_tuple(version) < as_tuple(high), version


@pytest.mark.parametrize(
    ("attribute", "replacement", "message"),
    [
        ("_nvmlLib_refcount", None, r"pynvml\._nvmlLib_refcount is missing"),
        ("_nvmlGetFunctionPointer_cache", [], r"pynvml\._nvmlGetFunctionPointer_cache is a list"),
        ("libLoadLock", None, r"pynvml\.libLoadLock is missing"),
        ("_LoadNvmlLibrary", lambda: None, r"no longer loads through pynvml\.CDLL"),
    ],
)
def test_a_binding_that_moved_its_state_is_refused_before_anything_changes(
    monkeypatch: pytest.MonkeyPatch, attribute: str, replacement: object, message: str
):
    if replacement is None:
        monkeypatch.delattr(pynvml, attribute)
    else:
        monkeypatch.setattr(pynvml, attribute, replacement)
    with pytest.raises(sim.UnsupportedBindingError, match=message) as err:
        sim.install(sim.scenario_from_data(one_gpu()))
    assert importlib.metadata.version("nvidia-ml-py") in str(err.value)
    assert sim.SUPPORTED_NVIDIA_ML_PY in str(err.value)
    assert sim.installed() is None
    assert pynvml.CDLL is ctypes.CDLL
