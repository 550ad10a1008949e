"""Store fixtures, every one for both signals: each store test runs once with metrics and once
with logs (``signal``), so the metric store and the log store of GPU events are held to the same
protocol, limits, splitting and accounting."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from gpumetrics.store import (
    FILE_NAMES,
    LOGS,
    METRICS,
    BatchStore,
    Signal,
    SqliteJournal,
    StoreStats,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2

SIGNALS = {"metrics": METRICS, "logs": LOGS}


def build_request(points: int, tag: str = "r", signal: Signal = METRICS) -> Any:
    """One resource (service.name=tag) holding ``points`` units of ``signal``.

    Metrics: one gauge with ``points`` data points; logs: ``points`` log records.
    """
    req = signal.request()
    entry = getattr(req, signal.resources).add()
    kv = entry.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", tag
    scope = getattr(entry, signal.scopes).add()
    if signal is METRICS:
        m = scope.metrics.add()
        m.name = "test.gauge"
        for i in range(points):
            dp = m.gauge.data_points.add()
            dp.time_unix_nano = 1_700_000_000_000_000_000 + i
            dp.as_int = i
    else:
        for i in range(points):
            rec = scope.log_records.add()
            rec.time_unix_nano = 1_700_000_000_000_000_000 + i
            rec.body.int_value = i
    return req


def tags(signal: Signal, request: Any) -> list[str]:
    """The ``service.name`` of each resource entry of ``request``, in order."""
    return [e.resource.attributes[0].value.string_value for e in getattr(request, signal.resources)]


class Clock:
    """An explicit monotonic clock for the store."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(params=sorted(SIGNALS))
def signal(request: pytest.FixtureRequest) -> Signal:
    """The signal of the store under test: ``metrics`` and ``logs``."""
    return SIGNALS[request.param]


@pytest.fixture
def make_store(signal: Signal) -> Callable[..., BatchStore]:
    """``BatchStore(...)`` of the signal under test."""
    return partial(BatchStore, signal=signal)


@pytest.fixture
def make_request(signal: Signal) -> Callable[..., Any]:
    """:func:`build_request` of the signal under test: ``make_request(points, tag="r")``."""
    return partial(build_request, signal=signal)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def parse_request(signal: Signal) -> Callable[[bytes], Any]:
    """Parse a batch or an answer as the signal's export request."""
    return signal.parse


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """An empty read-only filesystem (a tmpfs mounted ``ro``): needs root and mount permission.

    Skipped, saying why, where mounting is not allowed (an unprivileged CI container).
    """
    target = tmp_path / "read-only"
    target.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(target)]
    try:
        done = subprocess.run(mount, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a read-only tmpfs here: {exc}")
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a read-only tmpfs here: {done.stderr.strip() or done.returncode}"
        )
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True, timeout=30)


@pytest.fixture
def unwritable_dir(tmp_path: Path) -> Iterator[Path]:
    """An empty directory this process cannot create files in.

    Mode 0555 for an ordinary user; root ignores modes, so for root the directory is made
    immutable (``chattr +i``, ext4/xfs/btrfs), which root cannot write either. Skipped, saying
    why, where neither works.
    """
    target = tmp_path / "unwritable"
    target.mkdir()
    if os.geteuid() != 0:
        target.chmod(0o555)
        try:
            yield target
        finally:
            target.chmod(0o755)
        return
    try:
        done = subprocess.run(["chattr", "+i", str(target)], capture_output=True, text=True)
    except OSError as exc:
        pytest.skip(f"root ignores file modes, and chattr +i fails here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"root ignores file modes, and chattr +i fails here: {done.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["chattr", "-i", str(target)], check=True)


def journal(
    directory: Path,
    signal: Signal = METRICS,
    node: str = "node-a",
    clock: Clock | None = None,
    **kwargs: Any,
) -> SqliteJournal:
    """The journal of ``signal``'s store in ``directory`` (wall time from ``clock`` if given)."""
    if clock is not None:
        kwargs["clock_ns"] = lambda: round(clock.now * 1e9)
    return SqliteJournal(
        str(directory / FILE_NAMES[signal.name]),
        signal=signal.name,
        node=node,
        written_by="test",
        **kwargs,
    )


def crash_copy(directory: Path, to: Path) -> Path:
    """What a ``kill -9`` of the store's process would leave now: its files as they are on disk.

    The live store keeps its file open (and locked); what it committed is in the database file
    and its WAL, which are copied together, so the copy opens as the restarted sidecar would
    open the original.
    """
    to.mkdir(parents=True)
    for f in directory.iterdir():
        shutil.copy2(f, to / f.name)
    return to


def same_state(a: StoreStats, b: StoreStats) -> bool:
    """Equal stores, but for the consumers' idle times (monotonic readings of one process)."""
    strip = [dataclasses.replace(c, idle_s=0.0) for c in (*a.consumers, *b.consumers)]
    n = len(a.consumers)
    return dataclasses.replace(a, consumers=tuple(strip[:n])) == dataclasses.replace(
        b, consumers=tuple(strip[n:])
    )


__all__ = [
    "SIGNALS",
    "Clock",
    "build_request",
    "crash_copy",
    "journal",
    "metrics_pb2",
    "same_state",
    "tags",
]
