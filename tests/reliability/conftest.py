"""The reliability suite's options: the short (CI) and the long form, the seed, and the figures.

* ``--long`` (recognised when ``tests/reliability`` is on the pytest command line) or the
  environment variable ``GPUMETRICS_LONG=1`` (recognised everywhere) selects the long form: more
  soak cycles, more hypothesis examples, a random seed. The short form is the default and what
  CI runs.
* ``GPUMETRICS_SEED=N`` fixes the seed of the soak's random plan (short form default: a fixed
  seed, so CI is deterministic; long form default: a fresh one). The seed is printed.
* ``GPUMETRICS_RELIABILITY_REPORT=PATH`` writes the figures counted by the run (faults injected
  and survived, inputs tried per target, points lost by reason, run times) as JSON, for
  ``docs/reliability.md``. They are also printed in pytest's terminal summary.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

LONG_ENV = "GPUMETRICS_LONG"
SEED_ENV = "GPUMETRICS_SEED"
REPORT_ENV = "GPUMETRICS_RELIABILITY_REPORT"
SHORT_SEED = 20260101


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="run the reliability suite's long form (also: GPUMETRICS_LONG=1)",
    )


def _long(config: pytest.Config) -> bool:
    try:
        flag = bool(config.getoption("--long"))
    except ValueError:
        flag = False
    return flag or os.environ.get(LONG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Form:
    """The sizes of one form of the suite (short: CI; long: ``--long``)."""

    long: bool
    seed: int
    soak_cycles: int
    soak_gpus: int
    examples: int
    """Hypothesis examples per property."""
    crash_rounds: int
    """kill -9 / restart rounds of the crash test."""

    @property
    def name(self) -> str:
        return "long" if self.long else "short"


class Figures:
    """Thread-safe counters the tests add to; summed per ``(section, name)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.started = time.monotonic()

    def add(self, section: str, name: str, value: float = 1) -> None:
        with self._lock:
            self.counts[section][name] += value

    def set(self, section: str, name: str, value: float) -> None:
        with self._lock:
            self.counts[section][name] = value

    def as_dict(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {s: dict(sorted(v.items())) for s, v in sorted(self.counts.items())}


_FIGURES_KEY = pytest.StashKey[Figures]()
_FORM_KEY = pytest.StashKey[Form]()


def pytest_configure(config: pytest.Config) -> None:
    long = _long(config)
    env_seed = os.environ.get(SEED_ENV, "").strip()
    seed = (
        int(env_seed)
        if env_seed
        else (random.SystemRandom().randrange(2**32) if long else SHORT_SEED)
    )
    config.stash[_FORM_KEY] = Form(
        long=long,
        seed=seed,
        soak_cycles=1500 if long else 120,
        soak_gpus=4 if long else 2,
        examples=1000 if long else 60,
        crash_rounds=5 if long else 1,
    )
    config.stash[_FIGURES_KEY] = Figures()


@pytest.fixture(scope="session")
def form(pytestconfig: pytest.Config) -> Form:
    """The form of this run (sizes and seed)."""
    return pytestconfig.stash[_FORM_KEY]


@pytest.fixture(scope="session")
def figures(pytestconfig: pytest.Config) -> Figures:
    """Where tests count what they exercised (printed at the end, optionally written as JSON)."""
    return pytestconfig.stash[_FIGURES_KEY]


@pytest.fixture
def timed(figures: Figures, request: pytest.FixtureRequest) -> Iterator[None]:
    """Record the test's wall time under ``run_time_s``."""
    began = time.monotonic()
    yield
    figures.set("run_time_s", request.node.name, round(time.monotonic() - began, 2))


def pytest_report_header(config: pytest.Config) -> str | None:
    form = config.stash.get(_FORM_KEY, None)
    if form is None:
        return None
    rerun = f"{SEED_ENV}={form.seed}"
    return f"gpumetrics reliability: {form.name} form, seed {form.seed} (rerun: {rerun})"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    figures = config.stash.get(_FIGURES_KEY, None)
    form = config.stash.get(_FORM_KEY, None)
    if figures is None or form is None or not figures.counts:
        return
    doc: dict[str, Any] = {
        "form": form.name,
        "seed": form.seed,
        "total_s": round(time.monotonic() - figures.started, 1),
        "figures": figures.as_dict(),
    }
    terminalreporter.section("gpumetrics reliability figures")
    if form.name == "long" or os.environ.get(REPORT_ENV) or config.option.verbose > 0:
        terminalreporter.write_line(json.dumps(doc, indent=1))
    else:  # the short form in CI: one line; -v, --long or the report variable give them all
        soak = doc["figures"].get("soak", {})
        keys = (
            "faults_survived.total",
            "points_produced",
            "points_dropped.max_data_points",
            "points_held_at_end",
            "pids_reused",
        )
        shown = ", ".join(f"{k} {soak[k]:g}" for k in keys if k in soak)
        terminalreporter.write_line(
            f"{form.name} form, seed {form.seed}, {doc['total_s']} s: {shown} "
            f"(all figures: -v or {REPORT_ENV}=FILE)"
        )
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


@pytest.fixture
def short_tmp() -> Iterator[Any]:
    """A private temporary directory with a short path (unix socket paths: 107 bytes at most)."""
    d = tempfile.mkdtemp(prefix="gm-rel-", dir="/tmp")
    os.chmod(d, 0o700)
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def make_rig(short_tmp: Path) -> Iterator[Callable[..., Any]]:
    """Factory of :class:`~.rig.Rig` sidecars (stopped at teardown)."""
    from .rig import Rig

    made: list[Rig] = []

    def make(config: Mapping[str, Any] | None = None, **kw: Any) -> Rig:
        sub = short_tmp / f"r{len(made)}"
        sub.mkdir()
        rig = Rig(sub, config, **kw)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.close()


def hypothesis_settings(form: Form, scale: float = 1.0) -> Any:
    """Hypothesis settings for one property: examples scaled from the form, no deadline,
    derandomized in the short form (CI is deterministic), random in the long form."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=max(10, int(form.examples * scale)),
        deadline=None,
        derandomize=not form.long,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
