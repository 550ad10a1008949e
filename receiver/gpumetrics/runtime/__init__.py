"""The sidecar runtime: :class:`Sidecar` wires collector → producer → batcher → store → server.

:mod:`.batcher` moves collections into the store on an interval; :mod:`.sidecar` builds and
starts/stops the components; :mod:`.run` runs them standalone or as a go-plugin plugin;
:mod:`.simulation` installs the simulated driver for ``--simulate`` (the only importer of
``nvmlsim``).
"""

from gpumetrics.runtime.batcher import Batcher
from gpumetrics.runtime.sidecar import (
    CollectorLike,
    Sidecar,
    SidecarParts,
    default_collector_factory,
)
from gpumetrics.runtime.simulation import install_simulation

__all__ = [
    "Batcher",
    "CollectorLike",
    "Sidecar",
    "SidecarParts",
    "default_collector_factory",
    "install_simulation",
]
