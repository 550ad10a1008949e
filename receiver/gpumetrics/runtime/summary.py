"""The start-up summary: one INFO line saying what this sidecar runs with, logged when ready.

Logged once, when the first collection is stored (health turns SERVING), because only then are
the NVML facts known (the driver version and the GPUs it sees: NVML init runs in the background).
Example::

    ready: config none; listen 127.0.0.1:4319 [pull: no token, declare: no token];
    TLS off; relabel rules 0; NVML simulated (h100-8x-training), driver 550.54.15, 8 GPUs

With ``store.path`` set it ends with the durable store's state, e.g.
``; store /var/lib/gpumetrics (metrics ok, logs ok)`` (``failed``: serving from memory only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpumetrics.service import BoundAddresses, ServerSettings

__all__ = ["NvmlFacts", "StartupSummary", "listener_lines"]


@dataclass(frozen=True)
class NvmlFacts:
    """What NVML told the sidecar by its first complete collection.

    Attributes:
        simulated: the ``runtime.simulate`` profile or scenario file, or None for the real driver.
        driver_version: ``nvmlSystemGetDriverVersion``; None when unknown.
        gpus: physical GPUs NVML reports (``nvmlDeviceGetCount_v2``); None when unknown.

    """

    simulated: str | None
    driver_version: str | None
    gpus: int | None

    def text(self) -> str:
        """Return ``simulated (PROFILE), driver V, N GPUs`` or ``real, driver V, N GPUs``."""
        kind = f"simulated ({self.simulated})" if self.simulated is not None else "real"
        driver = f"driver {self.driver_version}" if self.driver_version else "driver unknown"
        if self.gpus is None:
            gpus = "GPUs unknown"
        else:
            gpus = f"{self.gpus} GPU" + ("" if self.gpus == 1 else "s")
        return f"{kind}, {driver}, {gpus}"


def _tokens(settings: ServerSettings, services: Sequence[str], address: str = "") -> str:
    needs = {"pull": settings.pull_token_file, "declare": settings.declare_token_file}
    out = []
    for s in services:
        text = f"{s}: {'token' if needs.get(s) is not None else 'no token'}"
        if s == "declare" and address.startswith("unix:"):
            # who may declare what: the peer's SO_PEERCRED (gpumetrics.service.declarers)
            text = "declare: token, peer credentials" if needs[s] else "declare: peer credentials"
        out.append(text)
    return ", ".join(out)


def listener_lines(settings: ServerSettings, addresses: BoundAddresses) -> list[str]:
    """One ``ADDRESS [service: token|no token|peer credentials, ...]`` entry per bound listener.

    ``listen`` serves pull (and declare when ``profiler_listen`` is empty); ``profiler_listen``
    serves declare; ``health_listen`` serves health only, never with a token. Declare on a unix
    socket checks the peer's credentials (``peer credentials``).
    """
    main = ["pull", "declare"] if settings.serves_profiler_on_listen else ["pull"]
    out = [f"listen {a} [{_tokens(settings, main, a)}]" for a in addresses.listen]
    out += [
        f"profiler_listen {a} [{_tokens(settings, ['declare'], a)}]"
        for a in addresses.profiler_listen
    ]
    out += [f"health_listen {a} [health: no token]" for a in addresses.health_listen]
    return out


@dataclass(frozen=True)
class StartupSummary:
    """Everything the start-up line states (see the module docstring).

    Attributes:
        config_file: the YAML file loaded, or None.
        listeners: from :func:`listener_lines`.
        tls: ``off``, ``on`` or ``on (mTLS)`` for the TCP listeners (health excepted).
        relabel_rules: relabel rules loaded from ``identity.relabel_config``.
        nvml: the NVML facts.
        store: ``PATH (metrics STATE, logs STATE)`` of the durable store; None in memory only.

    """

    config_file: str | None
    listeners: Sequence[str]
    tls: str
    relabel_rules: int
    nvml: NvmlFacts
    store: str | None = None

    @classmethod
    def build(
        cls,
        settings: ServerSettings,
        addresses: BoundAddresses,
        config_file: str | None,
        relabel_rules: int,
        nvml: NvmlFacts,
        store: str | None = None,
    ) -> StartupSummary:
        """Assemble the summary from the server settings and what was bound and read."""
        tls = "off"
        if settings.tls:
            tls = "on (mTLS)" if settings.tls_client_ca_file is not None else "on"
        listeners = listener_lines(settings, addresses)
        return cls(config_file, listeners, tls, relabel_rules, nvml, store)

    def message(self) -> str:
        """Return the line's text."""
        store = f"; store {self.store}" if self.store is not None else ""
        return (
            f"ready: config {self.config_file or 'none'}; {'; '.join(self.listeners)}; "
            f"TLS {self.tls}; relabel rules {self.relabel_rules}; NVML {self.nvml.text()}{store}"
        )
