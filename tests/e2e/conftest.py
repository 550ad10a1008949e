"""Fixtures of the end-to-end tests: the Collector and Prometheus binaries, stand-in GPU
processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .checks import CAPTURED_VARIABLE, declared_env
from .harness import GpuProcess, otelcol_binary, prometheus_binary


@pytest.fixture(scope="session")
def otelcol() -> Path:
    """The otelcol-gpumetrics binary (built once per session, cached across sessions)."""
    return otelcol_binary()


@pytest.fixture(scope="session")
def prometheus() -> Path:
    """The Prometheus binary docker-compose.yaml's version (built once, cached across sessions)."""
    return prometheus_binary()


@pytest.fixture
def gpu_processes() -> Iterator[tuple[GpuProcess, GpuProcess]]:
    """Two real local processes for the simulated GPUs: (declared, undeclared), each with
    ``CAPTURED_VARIABLE`` in its environment (the declared one also ``DECLARED_ENV``)."""
    declared = GpuProcess(declared_env("declared"))
    other = GpuProcess({CAPTURED_VARIABLE: "undeclared"})
    try:
        yield declared, other
    finally:
        declared.close()
        other.close()
