"""The simulated NVML C symbols, grouped by concern (one module each).

``all_symbols()`` returns every :class:`~nvmlsim.symbols.base.Symbol`; a driver
profile decides which of them the simulated library exports.
"""

from __future__ import annotations

from nvmlsim.symbols import (
    accounting,
    board,
    events,
    fieldvalues,
    gpm,
    identity,
    memory,
    mig,
    power,
    processes,
    procutil,
    sensors,
    system,
    utilization,
)
from nvmlsim.symbols.base import Symbol

__all__ = ["all_symbols", "Symbol"]

_MODULES = (
    system,
    identity,
    memory,
    power,
    sensors,
    utilization,
    processes,
    procutil,
    accounting,
    mig,
    fieldvalues,
    events,
    gpm,
    board,
)


def all_symbols() -> list[Symbol]:
    """Every implemented symbol, in module order."""
    return [sym for module in _MODULES for sym in module.SYMBOLS]
