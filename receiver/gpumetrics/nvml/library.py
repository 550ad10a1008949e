"""The NVML session: init with back-off, symbol probing, release/resume, and one shutdown.

Refcount discipline (NVML API reference, ``nvmlInit_v2`` and ``nvmlShutdown``,
https://docs.nvidia.com/deploy/nvml-api/): NVML counts ``nvmlInit`` calls and
only closes its device nodes when as many ``nvmlShutdown`` calls have been made. A
:class:`Session` makes at most one successful ``nvmlInit`` at a time and exactly one
``nvmlShutdown`` per successful init, whatever happens in between (library failure, release,
stop), so the collector never holds the driver open by accident (F13) and never calls
``nvmlShutdown`` twice (F22).

nvidia-ml-py loads ``libnvidia-ml.so.1`` once per process and never reloads it, so a
library/kernel version mismatch after a driver upgrade (LIB_RM_VERSION_MISMATCH, F12) cannot be
fixed in-process: after ``max_version_mismatch_inits`` consecutive mismatches the session asks
for a non-zero exit so the supervisor restarts the sidecar.

Symbols are probed once per successful init (:data:`PROBED_SYMBOLS`), with the result logged at
DEBUG; readers choose versioned calls (``_v3``/``_v2``/v1, ``TemperatureV``...) from presence,
never from the driver version number (F05).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pynvml

from gpumetrics.nvml.query import QueryError, classify, query
from gpumetrics.nvml.settings import CollectionSettings
from gpumetrics.nvml.state import Backoff

PROBED_SYMBOLS: tuple[str, ...] = (
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetRunningProcessDetailList",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetVbiosVersion",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetNumFans",
    "nvmlDeviceGetFanSpeed_v2",
    "nvmlDeviceGetBAR1MemoryInfo",
    "nvmlDeviceGetEncoderStats",
    "nvmlDeviceGetViolationStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
    "nvmlGpmMetricsGet",
)
"""C symbols whose presence decides which calls are made (probed once per successful init)."""

RELEASED = "released"
"""``gpumetrics.nvml.up`` reason while NVML is released on request (F13)."""
NOT_STARTED = "not_started"
"""``gpumetrics.nvml.up`` reason before the first init attempt."""
_INIT_HINTS = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        " (no libnvidia-ml.so.1 on the library path: run with the NVIDIA container runtime or "
        "driver installed, or use --simulate for the simulated driver)"
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: " (the NVIDIA kernel module is not loaded)",
    pynvml.NVML_ERROR_NO_PERMISSION: " (no permission to open /dev/nvidia*)",
    pynvml.NVML_ERROR_UNKNOWN: (
        " (a container that lost access to /dev/nvidia*, e.g. after a host `systemctl "
        "daemon-reload`, answers this until it is restarted; health turns NOT_SERVING after "
        "runtime.unhealthy_after_nvml_down_s)"
    ),
}
"""What to do about the init failures a user can fix, appended to the retry warning."""

EXIT_VERSION_MISMATCH = 3
"""Exit code requested after repeated LIB_RM_VERSION_MISMATCH (a supervisor restarts us)."""


def probe_symbols(names: tuple[str, ...] = PROBED_SYMBOLS) -> frozenset[str]:
    """Return which of ``names`` the loaded library exports.

    Uses nvidia-ml-py's own symbol lookup (``_nvmlGetFunctionPointer``, what nvitop does), so the
    answer is exactly what a later call would see: a missing symbol raises FUNCTION_NOT_FOUND.
    Only meaningful after a successful ``nvmlInit``.
    """
    present = set()
    for name in names:
        try:
            pynvml._nvmlGetFunctionPointer(name)
        except pynvml.NVMLError:
            continue
        present.add(name)
    return frozenset(present)


class Session:
    """One NVML session at a time, with init back-off, release/resume and a single shutdown.

    Args:
        settings: back-off (``init_backoff_*``) and ``max_version_mismatch_inits``.
        monotonic_ns: the clock back-off is measured on (ns, monotonic).
        log: where lifecycle transitions are logged (WARNING on failure, INFO on success).

    Not thread-safe by itself: the collector's scheduler is its only user.

    """

    def __init__(
        self,
        settings: CollectionSettings,
        monotonic_ns: Callable[[], int],
        log: logging.Logger,
    ) -> None:
        self._log = log
        self._now = monotonic_ns
        self._backoff = Backoff(settings.init_backoff_initial_s, settings.init_backoff_max_s)
        self._max_mismatch = settings.max_version_mismatch_inits
        self._mismatches = 0
        self.initialised = False
        self.broken = False
        self.released = False
        self.reason = NOT_STARTED
        self.symbols: frozenset[str] = frozenset()
        self.driver_version: str | None = None
        self.init_errors: list[QueryError] = []
        self.exit_code: int | None = None

    @property
    def up(self) -> bool:
        """Return True while an init has succeeded and nothing has taken the session down."""
        return self.initialised and not self.broken and not self.released

    def has(self, symbol: str) -> bool:
        """Return True when the library exports the C ``symbol`` (probed at the last init)."""
        return symbol in self.symbols

    def ensure(self, safe: bool = True) -> bool:
        """Initialise NVML if it is down, not released and its back-off has passed.

        Args:
            safe: no NVML call is in flight, so a pending ``nvmlShutdown`` (of a session lost
                while calls were still running) may be made first.

        Returns True when the session is up. Failures are kept in ``init_errors`` (the caller
        counts them) and set ``reason`` to the return code's lower-case name
        (``library_not_found``, ``driver_not_loaded``, ``lib_rm_version_mismatch``...).

        """
        if self.up:
            return True
        if self.released or self.exit_code is not None:
            return False
        now = self._now()
        if not self._backoff.due(now):
            return False
        if self.initialised:  # lost with calls in flight: shut down first, once they are gone
            if not safe:
                return False
            self.shutdown()
        try:
            query("nvmlInit", pynvml.nvmlInit)
        except QueryError as err:
            self._init_failed(err, now)
            return False
        self.initialised = True
        self.broken = False
        self._backoff.reset()
        self._mismatches = 0
        self.reason = "ok"
        self.symbols = probe_symbols()
        self.driver_version = self._driver_version()
        missing = sorted(set(PROBED_SYMBOLS) - self.symbols)
        self._log.info("NVML initialised (driver %s)", self.driver_version or "unknown")
        self._log.debug("NVML symbols missing from this driver: %s", ", ".join(missing) or "none")
        return True

    def _init_failed(self, err: QueryError, now: int) -> None:
        self.init_errors.append(err)
        self.reason = err.code_name.lower()
        delay = self._backoff.failed(now)
        if err.code == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
            self._mismatches += 1
            if self._mismatches >= self._max_mismatch:
                self.exit_code = EXIT_VERSION_MISMATCH
                self._log.error(
                    "NVML init failed %d times with LIB_RM_VERSION_MISMATCH: the driver was "
                    "upgraded under this process and nvidia-ml-py cannot reload libnvidia-ml; "
                    "requesting exit %d so the supervisor restarts the sidecar",
                    self._mismatches,
                    EXIT_VERSION_MISMATCH,
                )
                return
        else:
            self._mismatches = 0
        hint = _INIT_HINTS.get(err.code, "")
        self._log.warning(
            "NVML init failed: %s%s; retrying in %.1f s", err.code_name, hint, delay / 1e9
        )

    def _driver_version(self) -> str | None:
        if not self.has("nvmlSystemGetDriverVersion"):
            return None
        try:
            return str(query("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion))
        except QueryError as err:
            self.init_errors.append(err)
            return None

    def lost(self, err: QueryError, safe: bool = True) -> None:
        """Take the session down after a lifecycle error from a call (UNINITIALIZED, ...).

        Calls ``nvmlShutdown`` once to balance the init (its failure is expected and ignored),
        unless ``safe`` is False (a call is still in flight: the shutdown waits for the next
        :meth:`ensure` that is safe), and schedules a re-init on back-off. ``reason`` becomes
        the code's lower-case name.
        """
        self._log.warning("NVML session lost (%s); re-initialising on back-off", err.code_name)
        self.broken = True
        if safe:
            self.shutdown()
        self.reason = err.code_name.lower()
        self._backoff.failed(self._now())

    def release(self) -> None:
        """Shut NVML down on request and stay down until :meth:`resume` (F13).

        The caller must have stopped every in-flight call first.
        """
        self.released = True
        self.shutdown()
        self.reason = RELEASED
        self._log.info("NVML released on request; no NVML calls until resumed")

    def resume(self) -> None:
        """Allow init again after :meth:`release`; the next :meth:`ensure` initialises at once."""
        if self.released:
            self.released = False
            self._backoff.reset()
            self.reason = NOT_STARTED

    def shutdown(self) -> bool:
        """Call ``nvmlShutdown`` once if an init succeeded since the last shutdown.

        Returns True when ``nvmlShutdown`` was called (whatever it answered).
        """
        if not self.initialised:
            return False
        self.initialised = False
        try:
            pynvml.nvmlShutdown()
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as exc:
            self._log.debug("nvmlShutdown: %s", classify("nvmlShutdown", exc).code_name)
        return True
