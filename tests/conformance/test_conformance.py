"""The gpumetrics.v1 conformance cases (``tests/testdata/conformance/``) against the real server.

Each case runs against a fresh :class:`~.inprocess.InProcessSidecar` (the sidecar's own
``SidecarServer``, ``BatchStore``s and ``DeclaredStore``) over real gRPC on a unix socket. The Go
runners run the same files against the Go fake sidecar and the real ``gpumetrics serve
--simulate`` process (``collector/internal/conformance``).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .cases import DATA, CaseError, all_cases, load, logs_batch, metrics_batch
from .inprocess import InProcessSidecar
from .interpreter import Runner

CASES = tuple(all_cases())


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A short private directory (a unix socket path is at most 107 bytes)."""
    d = tempfile.mkdtemp(prefix="gm-conf-", dir="/tmp")
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(case: object, tmp: Path) -> None:
    from .cases import Case

    assert isinstance(case, Case)
    sidecar = InProcessSidecar(case.config, tmp)
    try:
        Runner(case, sidecar).run()
    finally:
        sidecar.close()


def test_every_service_has_cases_for_each_runner() -> None:
    """The real sidecar's runner gets cases of every service, and every file has controlled ones
    where the service has a store (so neither Go runner can run an empty suite)."""
    for service in ("pull", "logs", "profiler"):
        mine = [c for c in CASES if c.service == service]
        assert [c for c in mine if not c.controlled], f"{service}: no case the real sidecar runs"
        if service != "profiler":
            assert [c for c in mine if c.controlled], f"{service}: no controlled case"
    # the real sidecar's metric store always holds its first collection
    for c in CASES:
        if c.service == "pull" and not c.controlled:
            assert c.given == "first_collection", c.id


def test_canonical_batches_are_pinned() -> None:
    """The builders write the bytes batches.yaml pins (the Go runners check the same file)."""
    pinned = yaml.safe_load((DATA / "batches.yaml").read_text())["batches"]
    assert len(pinned) == 2
    for b in pinned:
        build = metrics_batch if b["signal"] == "metrics" else logs_batch
        assert build(b["sequence"], b["items"]).hex() == b["hex"].replace(" ", "")


def test_a_broken_case_file_names_the_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from . import cases

    (tmp_path / "bad.yaml").write_text(
        "format: 1\nservice: pull\ncases:\n  - name: x\n    steps:\n      - append: {points: -1}\n"
    )
    monkeypatch.setattr(cases, "DATA", tmp_path)
    with pytest.raises(
        CaseError,
        match=r"bad.yaml: cases\[0\] \(x\).steps\[0\].append: points: Input should be greater",
    ):
        load("bad.yaml")
