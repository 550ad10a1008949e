"""The examples in the README load and run (so the docs cannot rot)."""

from __future__ import annotations

import re
from pathlib import Path

import pynvml
import pytest

import nvmlsim as sim

DOC = Path(__file__).resolve().parents[1] / "README.md"


def _example(title: str, tmp_path: Path) -> Path:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"### {re.escape(title)}\n+```yaml\n(.*?)```", text, re.S)
    assert match, f"no yaml block under '### {title}'"
    path = tmp_path / "example.yaml"
    path.write_text(match.group(1), encoding="utf-8")
    return path


def test_small_example(simulate, tmp_path: Path):
    simulate(_example("A small example", tmp_path))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA L4"
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)] == [4242]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(h)


def test_rich_example(simulate, tmp_path: Path):
    drv = simulate(_example("A rich example", tmp_path), latency="off")
    a, b = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    assert pynvml.nvmlSystemGetDriverVersion() == "550.127.05"
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetConfComputeMemSizeInfo(a)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperature(b, 0)
    utilisation = []
    for _ in range(5):
        utilisation.append(pynvml.nvmlDeviceGetUtilizationRates(a).gpu)
        drv.next_cycle()
    assert utilisation == [98, 97, 99, 41, 808334905]
    assert [p.pid for p in pynvml.nvmlDeviceGetGraphicsRunningProcesses(a)] == []  # cycle 6
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(b, 0)
    assert pynvml.nvmlDeviceGetGpuInstanceId(mig) == 1
    drv.next_cycle(4)  # cycle 10: GPU a is lost
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetPowerUsage(a)
    drv.next_cycle(4)  # cycle 14: back at index 1
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(1)).startswith("GPU-aaaa")
    assert drv.violations == []
    assert sim.installed() is drv


def test_readme_links_stay_inside_the_distribution():
    # nvmlsim is published on its own: its README may link to its own files and to URLs only.
    root = DOC.parent.resolve()
    checked = 0
    for target in re.findall(r"\]\(([^)\s]+)\)", DOC.read_text(encoding="utf-8")):
        path = target.partition("#")[0]
        if re.match(r"^[a-z]+:", target) or not path:
            continue
        resolved = (root / path).resolve()
        assert root in resolved.parents and resolved.exists(), target
        checked += 1
    assert checked >= 2
