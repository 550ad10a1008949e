from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .fake import FakeKubelet


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A temporary directory with a short path (unix socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="gm-k8s-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake_kubelet(short_dir: Path) -> Iterator[Callable[..., FakeKubelet]]:
    """Start fake kubelets (``FakeKubelet`` arguments after the directory); all stopped after."""
    started: list[FakeKubelet] = []

    def start(**kwargs) -> FakeKubelet:
        directory = short_dir / f"k{len(started)}"
        directory.mkdir()
        started.append(FakeKubelet(directory, **kwargs))
        return started[-1]

    yield start
    for kubelet in started:
        kubelet.close()
