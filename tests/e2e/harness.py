"""Processes, deadlines and the Collector binary for the end-to-end tests.

Every wait here has a deadline; polling a file, socket or port with a short interval inside that
deadline is the only use of time (never a bare sleep as synchronisation). Every process started
here is stopped by the test that started it, and `Proc.kill_if_running` is the teardown net.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "collector-config"
BUILD_SCRIPT = REPO / "collector" / "scripts" / "build-otelcol.sh"

# Path of a built otelcol-gpumetrics; scripts/test.sh sets it after building. Not GPUMETRICS_*:
# the sidecar warns about unknown variables with its own prefix, and it inherits the environment.
OTELCOL_ENV = "OTELCOL_GPUMETRICS"

# Longest a cold Builder build may take (about 3 min on 2 cores; the module download varies).
BUILD_TIMEOUT_S = 1500.0
POLL_INTERVAL_S = 0.1

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | None],
    timeout_s: float,
    what: str,
    diagnostics: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Raises AssertionError naming ``what`` (plus ``diagnostics()``, e.g. a log tail) when
    ``timeout_s`` seconds pass first.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            extra = f"\n{diagnostics()}" if diagnostics is not None else ""
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}{extra}")
        time.sleep(POLL_INTERVAL_S)  # polling interval inside the deadline


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_environ(extra: Mapping[str, str] = {}) -> dict[str, str]:
    """This process's environment without GPUMETRICS_* settings (a developer's own must not leak
    into the sidecar), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMETRICS_")}
    env.pop(OTELCOL_ENV, None)
    env.pop(PROMETHEUS_ENV, None)
    env.update(extra)
    return env


def gpumetrics_command() -> Path:
    """The `gpumetrics` console script of the Python running the tests (the project's venv)."""
    script = Path(sys.executable).parent / "gpumetrics"
    if not script.exists():
        found = shutil.which("gpumetrics")
        if found is None:
            pytest.fail("the gpumetrics console script is not installed: pip install -e .")
        script = Path(found)
    return script


def profiler_address(address: str) -> str:
    """The profiler socket the tests give the sidecar whose pull socket is ``address``
    (``unix:/d/gm.sock`` -> ``unix:/d/gm-profiler.sock``): its own unix socket, as by default,
    never the machine's default path."""
    assert address.startswith("unix:") and address.endswith(".sock"), address
    return address.removesuffix(".sock") + "-profiler.sock"


def sidecar_argv(
    scenario: Path, address: str, node_name: str, include_env_vars: Sequence[str] = ()
) -> list[str]:
    """`gpumetrics serve` on the simulated ``scenario``, listening (pull) on ``address`` and
    (profiler service) on :func:`profiler_address`, one batch a second, the host resource named
    ``node_name``, capturing the environment variables ``include_env_vars`` as the profiler's
    ``-env-vars`` would."""
    return [
        str(gpumetrics_command()),
        "serve",
        "--simulate",
        str(scenario),
        "--listen",
        address,
        "--profiler-listen",
        profiler_address(address),
        "--batch-interval",
        "1",
        "--node-name",
        node_name,
        *(["--include-env-vars", ",".join(include_env_vars)] if include_env_vars else []),
    ]


def otelcol_binary() -> Path:
    """The otelcol-gpumetrics binary: $OTELCOL_GPUMETRICS, else built (or taken from the cache)
    by collector/scripts/build-otelcol.sh. Skips when neither is possible (no Go toolchain);
    fails when the build fails."""
    given = os.environ.get(OTELCOL_ENV)
    if given:
        path = Path(given)
        if not (path.is_file() and os.access(path, os.X_OK)):
            pytest.fail(f"${OTELCOL_ENV}={given} is not an executable file")
        return path
    if shutil.which("go") is None:
        pytest.skip(f"no Go toolchain to build otelcol-gpumetrics (or set ${OTELCOL_ENV})")
    try:
        done = subprocess.run(
            [str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{BUILD_SCRIPT} did not finish within {BUILD_TIMEOUT_S:g} s")
    if done.returncode != 0:
        pytest.fail(f"{BUILD_SCRIPT} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


PROMETHEUS_ENV = "PROMETHEUS"
PROMETHEUS_SCRIPT = REPO / "scripts" / "prometheus.sh"


def prometheus_binary() -> Path:
    """The Prometheus binary the compose test evaluates the dashboard's PromQL in: $PROMETHEUS,
    else built (or taken from the cache) by scripts/prometheus.sh at the version
    docker-compose.yaml runs. Skips, saying why, when neither is possible (no Go toolchain);
    fails when the build fails."""
    given = os.environ.get(PROMETHEUS_ENV)
    if given:
        path = Path(given)
        if not (path.is_file() and os.access(path, os.X_OK)):
            pytest.fail(f"${PROMETHEUS_ENV}={given} is not an executable file")
        return path
    if shutil.which("go") is None:
        pytest.skip(
            "SKIPPED: the Grafana dashboard's PromQL is not evaluated: no Go toolchain to build "
            f"Prometheus with {PROMETHEUS_SCRIPT.name} (or set ${PROMETHEUS_ENV})"
        )
    try:
        done = subprocess.run(
            [str(PROMETHEUS_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{PROMETHEUS_SCRIPT} did not finish within {BUILD_TIMEOUT_S:g} s")
    if done.returncode != 0:
        pytest.fail(f"{PROMETHEUS_SCRIPT} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


class Proc:
    """A child process whose stdout and stderr go to ``log_path``."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str | os.PathLike[str]],
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.pid = self.popen.pid

    def log_tail(self, chars: int = 6000) -> str:
        """The end of the log, for failure messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"[{self.name} log unreadable: {e}]"
        return f"--- {self.name} log ({self.log_path}) ---\n{text[-chars:]}"

    def running(self) -> bool:
        """True while the process has not exited."""
        return self.popen.poll() is None

    def stop(self, timeout_s: float, sig: int = signal.SIGTERM) -> int:
        """Send ``sig`` and return the exit status; fail (after SIGKILL) if it takes longer
        than ``timeout_s``."""
        if self.running():
            self.popen.send_signal(sig)
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)
            raise AssertionError(
                f"{self.name} did not exit within {timeout_s:g} s of signal {sig}\n"
                + self.log_tail()
            ) from None

    def kill_if_running(self) -> None:
        """Teardown: SIGKILL the process if a failed test left it running."""
        if self.running():
            self.popen.kill()
            self.popen.wait(timeout=10)


@contextmanager
def procs() -> Iterator[list[Proc]]:
    """A list to register processes in; every one still running at exit is killed."""
    started: list[Proc] = []
    try:
        yield started
    finally:
        for p in reversed(started):
            p.kill_if_running()


class GpuProcess:
    """A real local process to stand in for a GPU process of the simulated driver, so procfs
    lookups (start time, executable, cgroup, environment) resolve. ``env`` is added to its
    environment. It ends by itself when its stdin is closed."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"],
            stdin=subprocess.PIPE,
            env={**os.environ, **(env or {})},
        )
        self.pid = self.popen.pid

    def close(self) -> None:
        """Close stdin (the process exits) and reap it."""
        if self.popen.stdin is not None:
            self.popen.stdin.close()
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)


def pid_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting for its reaper)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def log_records(path: Path) -> list[dict[str, object]]:
    """The Collector's JSON log records (``service.telemetry.logs.encoding: json``); lines that
    are not JSON objects (e.g. a Go panic) are skipped."""
    records = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def declare(
    address: str,
    pid: int,
    env: Mapping[str, str],
    attrs: Mapping[str, str],
    timeout_s: float = 30.0,
) -> str:
    """Declare ``pid`` with `gpumetrics declare` (the CLI a profiler integration can script),
    retrying until the sidecar accepts it or ``timeout_s`` passes. Returns the CLI's output."""
    argv = [str(gpumetrics_command()), "declare", address, "--pid", str(pid), "--timeout", "5"]
    for k, v in env.items():
        argv += ["--env", f"{k}={v}"]
    for k, v in attrs.items():
        argv += ["--attr", f"{k}={v}"]
    last: list[str] = []

    def attempt() -> str | None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=clean_environ())
        last[:] = [f"rc={done.returncode}", done.stdout, done.stderr]
        return done.stdout if done.returncode == 0 else None

    return wait_for(
        attempt, timeout_s, f"`gpumetrics declare {address} --pid {pid}`", lambda: "\n".join(last)
    )
