"""The simulated node the end-to-end tests run the sidecar on: two GPUs, each running one real
local process (the test's children), so procfs lookups and start times resolve. Both GPUs report
Xid and ECC events as supported; :func:`write_scenario` raises none, ``events`` and
``nvml_events`` add them (tests/e2e/test_events.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

import nvmlsim as sim

GPU_UUIDS = (
    "GPU-e2e00000-0000-4000-8000-000000000000",
    "GPU-e2e00000-0000-4000-8000-000000000001",
)


def _device(index: int, pid: int) -> dict[str, Any]:
    return {
        "uuid": GPU_UUIDS[index],
        "name": "NVIDIA L4",
        "memory": {"total_bytes": 24152899584, "used_bytes": 2147483648},
        "power": {
            "usage_mw": {"pattern": "sine", "min": 30000, "max": 60000, "period_s": 10},
            "management_limit_mw": 72000,
            "enforced_limit_mw": 72000,
        },
        "temperature_c": 44,
        "utilization": {
            "gpu": {"pattern": "sine", "min": 20, "max": 80, "period_s": 10},
            "memory": 12,
        },
        "process_utilization": {},
        "supported_events": ["xid", "single_bit_ecc", "double_bit_ecc"],
        "processes": [
            {
                "pid": pid,
                "used_memory_bytes": 1073741824 * (index + 1),
                "utilization": {"sm": 35, "mem": 12},
            },
        ],
    }


def write_scenario(
    path: Path,
    declared_pid: int,
    other_pid: int,
    events: list[dict[str, Any]] | None = None,
    nvml_events: list[dict[str, Any]] | None = None,
) -> Path:
    """Write the scenario to ``path`` (validated first) and return ``path``.

    GPU 0 runs ``declared_pid`` (the process the test declares), GPU 1 runs ``other_pid``
    (never declared: its identity comes from procfs alone). ``events`` (a GPU lost...) and
    ``nvml_events`` (Xids...) are the scenario's lists of that name (nvmlsim's README).
    """
    data: dict[str, Any] = {
        "format": 1,
        "name": "e2e-two-gpus",
        "description": "Two L4s, each running one real local process (end-to-end tests).",
        "devices": [_device(0, declared_pid), _device(1, other_pid)],
        "events": events or [],
        "nvml_events": nvml_events or [],
    }
    sim.scenario_from_data(data)  # raises ScenarioError naming the field if the format moved
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
