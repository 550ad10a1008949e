"""The one place that touches nvidia-ml-py's private module state.

nvidia-ml-py (module ``pynvml``) has no hook for handing it a different library, so the
simulator works through five module attributes that are not part of its public API. Every
release in the supported range (:data:`SUPPORTED_NVIDIA_ML_PY`, the oldest and the newest are
tested in CI) uses them the same way:

``CDLL``
    ``from ctypes import *`` puts ``ctypes.CDLL`` in the module, and ``_LoadNvmlLibrary``
    (run by ``nvmlInitWithFlags``) looks the name up there when it calls
    ``CDLL("libnvidia-ml.so.1")``. The simulator replaces it with its own loader, which hands
    out the simulated library (and passes every other name to the original ``CDLL``).
``nvmlLib``
    the loaded library; ``_LoadNvmlLibrary`` loads only while it is ``None``.
``_nvmlGetFunctionPointer_cache``
    ``{symbol: function pointer}`` filled by ``_nvmlGetFunctionPointer``; cleared so no pointer
    of a previous (real or simulated) library survives.
``_nvmlLib_refcount``
    the ``nvmlInit``/``nvmlShutdown`` count kept by the binding; set back to 0.
``libLoadLock``
    the binding's lock around loading; held while the three above are reset.

:func:`check_binding` verifies all of that before anything is changed, so a future
nvidia-ml-py that renames one of them fails with :class:`UnsupportedBindingError` naming the
attribute, instead of a simulation that silently talks to the wrong library. Nothing else in
``pynvml`` is replaced: no ``nvmlDevice*``/``nvmlSystem*`` function is ever touched.
"""

from __future__ import annotations

import threading
from importlib import metadata
from typing import Any

import pynvml

__all__ = [
    "SUPPORTED_NVIDIA_ML_PY",
    "UnsupportedBindingError",
    "binding_version",
    "check_binding",
    "loader",
    "reset_module_state",
    "set_loader",
]

#: The nvidia-ml-py releases the simulator is tested with (as in ``pyproject.toml``).
SUPPORTED_NVIDIA_ML_PY = ">=12.570.86,<13.616"

_LOCK_TYPE = type(threading.Lock())


class UnsupportedBindingError(RuntimeError):
    """The installed nvidia-ml-py does not keep its library state where the simulator expects.

    The message names the attribute and the installed version.
    """


def binding_version() -> str:
    """Return the installed nvidia-ml-py version, or ``"unknown"`` without package metadata."""
    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return "unknown"


def _problems() -> list[str]:
    problems = []
    expected: dict[str, tuple[type, ...]] = {
        "libLoadLock": (_LOCK_TYPE,),
        "_nvmlGetFunctionPointer_cache": (dict,),
        "_nvmlLib_refcount": (int,),
    }
    for name, types in expected.items():
        value = getattr(pynvml, name, _MISSING)
        if value is _MISSING:
            problems.append(f"pynvml.{name} is missing")
        elif not isinstance(value, types):
            problems.append(f"pynvml.{name} is a {type(value).__name__}")
    for name in ("nvmlLib", "CDLL"):
        if not hasattr(pynvml, name):
            problems.append(f"pynvml.{name} is missing")
    load = getattr(pynvml, "_LoadNvmlLibrary", None)
    code = getattr(load, "__code__", None)
    if code is None:
        problems.append("pynvml._LoadNvmlLibrary is missing")
    elif "CDLL" not in code.co_names or "nvmlLib" not in code.co_names:
        problems.append("pynvml._LoadNvmlLibrary no longer loads through pynvml.CDLL")
    return problems


_MISSING: Any = object()


def check_binding() -> None:
    """Verify that ``pynvml`` keeps its library state as described in this module.

    Raises:
        UnsupportedBindingError: an attribute is missing or has another type; the message
            names each one, the installed version and :data:`SUPPORTED_NVIDIA_ML_PY`.

    """
    problems = _problems()
    if problems:
        raise UnsupportedBindingError(
            f"nvidia-ml-py {binding_version()} is not supported by nvmlsim "
            f"(tested: nvidia-ml-py{SUPPORTED_NVIDIA_ML_PY}): " + "; ".join(problems)
        )


def loader() -> Any:
    """Return what ``pynvml`` calls to open a library now (``ctypes.CDLL`` unless replaced)."""
    return pynvml.CDLL


def set_loader(value: Any) -> None:
    """Make ``pynvml`` open libraries through ``value`` (a ``CDLL``-like callable)."""
    pynvml.CDLL = value


def reset_module_state() -> None:
    """Forget the loaded library: the next ``nvmlInit()`` loads it again through the loader.

    Clears ``nvmlLib``, the function-pointer cache and the init count under ``libLoadLock``.
    """
    with pynvml.libLoadLock:
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
