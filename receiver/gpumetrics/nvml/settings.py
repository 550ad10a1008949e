"""Collection settings: cadences, deadlines, back-off and which metrics to collect.

:class:`CollectionSettings` is a frozen pydantic model; every default is documented on its field
and in ``docs/collection.md``. Validation errors name the field (pydantic's ``loc``), e.g.
``pcie_interval_s: Input should be greater than or equal to interval_s``.
"""

from __future__ import annotations

from functools import cached_property

from pydantic import Field, field_validator, model_validator

from gpumetrics.metrics.spec import catalogue
from gpumetrics.settingsbase import SettingsModel


class CollectionSettings(SettingsModel):
    """How and how often the collector reads NVML.

    Cadences (seconds, measured on the collector's monotonic clock):

    - ``interval_s`` (1.0): the fast cadence. Utilisation (sample buffers, with the snapshot
      fallback), memory, power, energy, temperature, clocks, clock-event reasons and the
      per-process lists and utilisation samples are read once per tick.
    - ``pcie_interval_s`` (10.0): PCIe throughput. Each ``nvmlDeviceGetPcieThroughput`` call
      blocks about 20 ms by design (NVML API reference), 40 ms per GPU per read, so it is
      read on a slow cadence; 0 disables it.
    - ``errors_interval_s`` (10.0): error and health counters: volatile ECC counts and NVLink
      link errors (``hw.errors``), NVLink link state (``hw.network.up``), violation time,
      remapped rows and retired pages; 0 disables them. All are cumulative (or slow to change),
      so the slow cadence loses nothing.
    - ``accounting_interval_s`` (10.0): NVML accounting records (``nvidia.gpu.process.time``,
      ``nvidia.gpu.process.memory.max``, where accounting mode is on): the driver keeps them
      in its circular buffer (``nvmlDeviceGetAccountingBufferSize`` processes) after the
      processes end, so the slow cadence loses nothing unless more processes than that start
      in one interval; 0 disables them.
    - ``mig_interval_s`` (30.0): re-enumeration of MIG instances (also done at once after a MIG
      handle goes stale).

    Deadlines:

    - ``call_timeout_s`` (2.0): one NVML call running longer than this is abandoned: the
      device's readings for that tick are dropped, ``gpumetrics.collection.timeouts{nvml.function}``
      rises, and the device gets no new work until the call returns (F21).
    - ``cycle_timeout_s`` (None → ``interval_s``): the longest a tick waits for all devices.
      A device not done by then loses that tick's readings; unless one of its calls is past
      ``call_timeout_s`` this is an overrun (``gpumetrics.collection.overruns``) and its health
      is unchanged.

    Back-off (seconds, doubling from ``*_initial_s`` up to ``*_max_s``):

    - ``device_backoff_initial_s`` (2.0) / ``device_backoff_max_s`` (60.0): probes of a failed
      device (GPU lost, handle unavailable, F10/F11); nothing else is called on it meanwhile.
      The event listener retries a GPU whose registration answered UNKNOWN on the same
      back-off (real time, per GPU).
    - ``init_backoff_initial_s`` (1.0) / ``init_backoff_max_s`` (30.0): NVML init retries (F14).
    - ``max_version_mismatch_inits`` (5): after this many consecutive inits answering
      LIB_RM_VERSION_MISMATCH the collector requests a non-zero exit (F12), since nvidia-ml-py
      never reloads ``libnvidia-ml`` in-process.

    Other:

    - ``insufficient_size_attempts`` (3): attempts of a list call that answers INSUFFICIENT_SIZE
      because the list grew between the sizing and the data call (F20).
    - ``process_metrics`` (True): read per-process lists and utilisation at all.
    - ``disabled_metrics`` (empty): catalogue metric names not to collect; NVML calls that feed
      only disabled metrics are not made.
    - ``enabled_metrics`` (empty): catalogue metrics that are off by default (``enabled:
      false``, e.g. ``nvidia.gpu.prof.engine.activity``) to collect too.
    - ``pid_max`` (None → ``<proc_root>/sys/kernel/pid_max``, 4194304 if unreadable): pids above
      it are impossible and dropped.
    - ``proc_root`` (``/proc``): where ``pid_max`` is read.
    """

    interval_s: float = Field(default=1.0, gt=0, le=3600)
    pcie_interval_s: float = Field(default=10.0, ge=0, le=86400)
    errors_interval_s: float = Field(default=10.0, ge=0, le=86400)
    accounting_interval_s: float = Field(default=10.0, ge=0, le=86400)
    mig_interval_s: float = Field(default=30.0, gt=0, le=86400)
    call_timeout_s: float = Field(default=2.0, gt=0, le=600)
    cycle_timeout_s: float | None = Field(default=None, gt=0, le=3600)
    device_backoff_initial_s: float = Field(default=2.0, gt=0)
    device_backoff_max_s: float = Field(default=60.0, gt=0)
    init_backoff_initial_s: float = Field(default=1.0, gt=0)
    init_backoff_max_s: float = Field(default=30.0, gt=0)
    max_version_mismatch_inits: int = Field(default=5, ge=1)
    insufficient_size_attempts: int = Field(default=3, ge=1, le=10)
    process_metrics: bool = True
    disabled_metrics: frozenset[str] = frozenset()
    enabled_metrics: frozenset[str] = frozenset()
    pid_max: int | None = Field(default=None, ge=1)
    proc_root: str = "/proc"

    @field_validator("disabled_metrics", "enabled_metrics")
    @classmethod
    def _known_metrics(cls, value: frozenset[str]) -> frozenset[str]:
        unknown = sorted(set(value) - set(catalogue().metrics))
        if unknown:
            raise ValueError(f"unknown metric(s) {unknown}; see docs/metrics.md")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> CollectionSettings:
        if self.pcie_interval_s and self.pcie_interval_s < self.interval_s:
            raise ValueError("pcie_interval_s: must be 0 (off) or >= interval_s")
        if self.errors_interval_s and self.errors_interval_s < self.interval_s:
            raise ValueError("errors_interval_s: must be 0 (off) or >= interval_s")
        if self.accounting_interval_s and self.accounting_interval_s < self.interval_s:
            raise ValueError("accounting_interval_s: must be 0 (off) or >= interval_s")
        if self.device_backoff_max_s < self.device_backoff_initial_s:
            raise ValueError("device_backoff_max_s: must be >= device_backoff_initial_s")
        if self.init_backoff_max_s < self.init_backoff_initial_s:
            raise ValueError("init_backoff_max_s: must be >= init_backoff_initial_s")
        both = sorted(self.enabled_metrics & self.disabled_metrics)
        if both:
            raise ValueError(f"enabled_metrics: {both} are also in disabled_metrics")
        return self

    @property
    def cycle_deadline_s(self) -> float:
        """The effective per-tick wait for all devices: ``cycle_timeout_s`` or ``interval_s``."""
        return self.cycle_timeout_s if self.cycle_timeout_s is not None else self.interval_s

    @cached_property
    def off_metrics(self) -> frozenset[str]:
        """Catalogue metrics not collected.

        ``disabled_metrics``, and the default-off metrics not in ``enabled_metrics``. Computed
        once (a plain attribute afterwards: :meth:`wants` is asked hundreds of times a tick).
        """
        default_off = {n for n, spec in catalogue().metrics.items() if not spec.enabled}
        return frozenset(self.disabled_metrics | (default_off - self.enabled_metrics))

    def wants(self, *metrics: str) -> bool:
        """Return True when one of ``metrics`` is collected (not in :attr:`off_metrics`)."""
        off = self.off_metrics
        if not off:  # asked a few hundred times per cycle
            return True
        for m in metrics:
            if m not in off:
                return True
        return False
