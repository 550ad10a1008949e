"""``python -m nvmlsim``: exec a program on the simulation, list, validate, schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

import nvmlsim as sim
from nvmlsim.launcher import main

PROGRAM = """
import sys, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
with open(sys.argv[1], "w") as out:
    out.write(f"{pynvml.nvmlDeviceGetCount()} {pynvml.nvmlDeviceGetName(h)} {sys.argv[2:]}")
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture(autouse=True)
def _always_uninstalled():
    yield
    sim.uninstall()


def test_exec_runs_a_file_on_the_simulation(tmp_path: Path):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    result, stats = tmp_path / "out.txt", tmp_path / "stats.json"
    rc = main(
        [
            "exec",
            "--simulate",
            "a100-mig",
            "--clock",
            "manual",
            "--stats-json",
            str(stats),
            "--",
            str(script),
            str(result),
            "3",
            "--flag",
        ]
    )
    assert rc == 3
    assert result.read_text() == "1 NVIDIA A100-SXM4-40GB ['3', '--flag']"
    data = json.loads(stats.read_text())
    assert data["by_function"]["nvmlDeviceGetName"] == 1
    assert data["violations"] == []
    assert sim.installed() is None  # uninstalled after the program
    assert pynvml.nvmlLib is None


def test_exec_runs_a_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "simprog_mod.py").write_text(PROGRAM)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = tmp_path / "out.txt"
    assert main(["exec", "--simulate", "h100-sxm", "--", "simprog_mod", str(result), "0"]) == 0
    assert result.read_text().startswith("1 NVIDIA H100 80GB HBM3")


def test_exec_as_a_subprocess_with_the_default_profile(tmp_path: Path):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    result = tmp_path / "out.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "nvmlsim", "exec", "--", str(script), str(result), "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert result.read_text().startswith("8 NVIDIA H100 80GB HBM3")


def test_list_validate_and_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in listed] == sim.list_profiles()
    assert main(["list", "--field-cases"]) == 0
    assert capsys.readouterr().out.splitlines() == sim.list_field_cases()
    assert main(["validate", "F16_pid_reuse"]) == 0
    assert "F16_pid_reuse: ok" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices: [{uuid: GPU-11111111-2222-4333-8444-555555555555, fan: 3}]\n")
    assert main(["validate", "h100-sxm", str(bad)]) == 1
    captured = capsys.readouterr()
    assert "h100-sxm: ok" in captured.out
    assert "devices[0].fan: Extra inputs are not permitted" in captured.err
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "nvmlsim scenario (simulated NVML driver)"


def test_exec_with_a_broken_scenario_fails_before_running(tmp_path: Path, capsys):
    assert main(["exec", "--simulate", "no-such-profile", "--", "nothing"]) == 2
    assert "built-in profiles" in capsys.readouterr().err


def test_validate_names_bytes_that_are_not_utf8_and_yaml_errors_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    bad = tmp_path / "t4b.yaml"
    bad.write_bytes(b"format: 1\ndevices: []\n\xff\xfe")  # byte 0xff at offset 22, line 3
    broken = tmp_path / "t3.yaml"
    broken.write_text("devices: [\n")
    assert main(["validate", str(bad), str(broken)]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"invalid scenario {bad}:\n  not valid UTF-8 (byte 0xff at offset 22, line 3)\n"
        f"invalid scenario {broken}:\n  not valid YAML: line 2, column 1: expected the node "
        "content, but found '<stream end>'\n"
    )


def test_list_into_a_closed_pipe_exits_quietly():
    """``python -m nvmlsim list | head`` with the reader gone: status 141, no traceback."""
    import os

    read, write = os.pipe()
    os.close(read)  # every write now fails with EPIPE (Python ignores SIGPIPE)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "nvmlsim", "list", "--field-cases"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


def test_help_has_no_rest_markup(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "``" not in capsys.readouterr().out
