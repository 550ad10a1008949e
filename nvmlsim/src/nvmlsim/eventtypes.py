"""NVML event types by name: the ``nvmlEventType*`` bits a scenario refers to.

The bits are those of ``nvml.h`` (NVML API reference, "Event Types",
https://docs.nvidia.com/deploy/nvml-api/group__nvmlEventType.html) as nvidia-ml-py exports them
(``pynvml.nvmlEventTypeXidCriticalError`` = 0x8, ...). Scenario files name them in snake case
(``xid``, ``double_bit_ecc``); the table maps each name to its bit.
"""

from __future__ import annotations

__all__ = ["EVENT_TYPE_BITS", "event_type_bit", "event_type_names"]

#: Scenario name -> NVML event type bit (``nvmlEventType*``; ``nvmlEventMigConfigChange``).
EVENT_TYPE_BITS: dict[str, int] = {
    "single_bit_ecc": 0x0001,  # nvmlEventTypeSingleBitEccError
    "double_bit_ecc": 0x0002,  # nvmlEventTypeDoubleBitEccError
    "pstate": 0x0004,  # nvmlEventTypePState
    "xid": 0x0008,  # nvmlEventTypeXidCriticalError
    "clock": 0x0010,  # nvmlEventTypeClock
    "power_source_change": 0x0080,  # nvmlEventTypePowerSourceChange
    "mig_config_change": 0x0100,  # nvmlEventMigConfigChange
    "single_bit_ecc_storm": 0x0200,  # nvmlEventTypeSingleBitEccErrorStorm
    "dram_retirement": 0x0400,  # nvmlEventTypeDramRetirementEvent
    "dram_retirement_failure": 0x0800,  # nvmlEventTypeDramRetirementFailure
    "non_fatal_poison": 0x1000,  # nvmlEventTypeNonFatalPoisonError
    "fatal_poison": 0x2000,  # nvmlEventTypeFatalPoisonError
    "gpu_unavailable": 0x4000,  # nvmlEventTypeGpuUnavailableError
    "gpu_recovery_action": 0x8000,  # nvmlEventTypeGpuRecoveryAction
}


def event_type_bit(name: str) -> int:
    """Return the NVML bit of event type ``name``.

    Raises:
        ValueError: naming the known types when ``name`` is not one of them.

    """
    bit = EVENT_TYPE_BITS.get(name)
    if bit is None:
        raise ValueError(
            f"unknown NVML event type {name!r}; known: " + ", ".join(sorted(EVENT_TYPE_BITS))
        )
    return bit


def event_type_names(mask: int) -> list[str]:
    """Return the names of the bits set in ``mask`` (unknown bits are left out), in bit order."""
    return [n for n, b in sorted(EVENT_TYPE_BITS.items(), key=lambda kv: kv[1]) if mask & b]
