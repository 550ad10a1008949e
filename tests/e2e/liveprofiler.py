"""The live OpenTelemetry eBPF profiler for the end-to-end stage (tests/e2e/test_live_profiler.py):
where it can run, how it is built and started, the busy child it profiles in a container-like
cgroup, and the profiles file read back as resources.

The profiler is the module's own agent (``go.opentelemetry.io/ebpf-profiler`` at
:data:`PROFILER_VERSION`, main package), built by ``scripts/ebpf-profiler/build.sh`` with
``memlock-eperm.patch`` (cached by hash). It loads eBPF programs, so it needs root and tracefs.
Where tracefs is not mounted it is mounted for the profiler alone, in a private mount namespace
(``unshare --mount``), so the host's mounts are left as they are. Every precondition that does
not hold, and a profiler that exits because the kernel refuses its programs, is a skip whose
reason says exactly what is missing.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gpumetrics.identity.utf8 import to_valid_utf8

from .harness import BUILD_TIMEOUT_S, REPO
from .profiles import Typed, resolve

PROFILER_VERSION = "v0.0.202633"
PROFILER_ENV = "EBPF_PROFILER"
"""A built profiler binary to use instead of building one."""
BUILD_SCRIPT = REPO / "scripts" / "ebpf-profiler" / "build.sh"
TRACEFS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))

# What the profiler logs when the kernel, its privileges or its mounts refuse the eBPF programs
# (internal/controller, tracer, rlimit): a skip, with the line as its reason. Anything else it
# dies of is a failure.
_LOAD_FAILURE = re.compile(
    r"failed to load eBPF|failed to adjust rlimit|neither debugfs nor tracefs|kernel version|"
    r"operation not permitted|permission denied|failed to attach|perf_event_open|BTF",
    re.IGNORECASE,
)


def tracefs_mounted() -> bool:
    """Whether tracefs is reachable where the profiler looks for it (cilium/ebpf's tracefs)."""
    return any((path / "events").is_dir() for path in TRACEFS)


def unavailable_reason() -> str | None:
    """Why the live profiler cannot run on this machine, or None when it may."""
    if sys.platform != "linux":
        return f"the eBPF profiler runs on Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return (
            f"not root (euid {os.geteuid()}): the eBPF profiler loads eBPF programs "
            "(CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN)"
        )
    if not tracefs_mounted() and shutil.which("unshare") is None:
        return (
            "tracefs is not mounted (/sys/kernel/tracing) and unshare(1) is missing to mount it "
            "for the profiler alone"
        )
    if shutil.which("go") is None and not os.environ.get(PROFILER_ENV):
        return f"no Go toolchain to build the eBPF profiler (or set ${PROFILER_ENV})"
    return None


def profiler_binary() -> Path:
    """The profiler: $EBPF_PROFILER, else built (or taken from the cache) by the build script;
    fails when the build fails."""
    given = os.environ.get(PROFILER_ENV)
    if given:
        path = Path(given)
        if not (path.is_file() and os.access(path, os.X_OK)):
            pytest.fail(f"${PROFILER_ENV}={given} is not an executable file")
        return path
    try:
        done = subprocess.run(
            [str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{BUILD_SCRIPT} did not finish within {BUILD_TIMEOUT_S:g} s")
    if done.returncode != 0:
        pytest.fail(f"{BUILD_SCRIPT} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def profiler_argv(binary: Path, collector: str, env_vars: Sequence[str]) -> list[str]:
    """Run the agent against the OTLP/gRPC receiver at ``collector`` (host:port, plaintext),
    reporting every second, capturing ``env_vars`` (its ``-env-vars``); inside a private mount
    namespace with tracefs mounted when the host has none."""
    argv = [
        str(binary),
        "-collection-agent",
        collector,
        "-disable-tls",
        "-reporter-interval",
        "1s",
        "-reporter-jitter",
        "0",
    ]
    if env_vars:
        argv += ["-env-vars", ",".join(env_vars)]
    if tracefs_mounted():
        return argv
    mount = 'mount -t tracefs nodev /sys/kernel/tracing && exec "$0" "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount, *argv]


_MSG = re.compile(r'msg="((?:[^"\\]|\\.)*)"')


def load_failure(log: str) -> str | None:
    """What a profiler log says refused its eBPF programs (a skip), or None: the message of its
    ERROR record (slog's ``msg="..."``), or the ``unshare``/``mount`` error of the private
    tracefs mount (no CAP_SYS_ADMIN)."""
    for line in log.splitlines():
        if line.startswith(("mount:", "unshare:")):
            return line.strip()
        if "level=ERROR" in line and _LOAD_FAILURE.search(line):
            m = _MSG.search(line)
            return m.group(1).replace('\\"', '"') if m else line.strip()
    return None


class ContainerCgroup:
    """A cgroup whose last path element is a 64-hex container id, in the hierarchy that comes
    first in ``/proc/self/cgroup`` (the eBPF profiler's ``parseContainerID`` and the sidecar's
    ``container_id`` take the first line that matches, so no inherited id can win): a child put
    in it looks, to both, like a process of container :attr:`id`. The test removes it."""

    def __init__(self) -> None:
        self.id = secrets.token_hex(32)
        mount = _first_hierarchy_mount()
        self._parent = mount / f"gpumetrics-e2e-{os.getpid()}-{secrets.token_hex(4)}"
        self.path = self._parent / self.id
        try:
            self.path.mkdir(parents=True)
        except OSError as e:
            pytest.skip(f"cannot create the container cgroup {self.path}: {e}")

    def add(self, pid: int) -> None:
        """Move ``pid`` into the cgroup."""
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def remove(self) -> None:
        """Remove the cgroup (its processes must have exited)."""
        for path in (self.path, self._parent):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass


def _first_hierarchy_mount() -> Path:
    first = Path("/proc/self/cgroup").read_text().splitlines()[0]
    _, controllers, _ = first.split(":", 2)
    wanted = set(controllers.split(",")) - {""}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        fstype, super_options = fields[sep + 1], set(fields[sep + 3].split(","))
        if (not wanted and fstype == "cgroup2") or (
            wanted and fstype == "cgroup" and wanted <= super_options
        ):
            return Path(fields[4])
    pytest.skip(f"no mount of the cgroup hierarchy {first!r} (the first in /proc/self/cgroup)")


# A busy Python process (about half a CPU) that reads commands on stdin: "exec" replaces it
# with a busy /bin/sh (same pid, same environment, another executable); end of input ends it.
_BUSY = r"""
import os, select, sys, time
while True:
    end = time.monotonic() + 0.02
    while time.monotonic() < end:
        pass
    if select.select([0], [], [], 0.02)[0]:
        line = os.read(0, 64)
        if not line:
            sys.exit(0)
        if line.startswith(b"exec"):
            os.execv("/bin/sh", ["sh", "-c", "while :; do :; done"])
"""


class BusyChild:
    """The profiled GPU process: busy on the CPU (so the profiler samples it), with ``env``
    (bytes values allowed: a value that is not UTF-8) added to its environment, in ``cgroup``
    from before anything reads its procfs."""

    def __init__(self, env: Mapping[str, str | bytes], cgroup: ContainerCgroup) -> None:
        environ: dict[bytes, bytes] = dict(os.environb)
        for k, v in env.items():
            environ[k.encode()] = v if isinstance(v, bytes) else v.encode()
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            [sys.executable, "-c", _BUSY], stdin=subprocess.PIPE, env=environ
        )
        self.pid = self.popen.pid
        cgroup.add(self.pid)

    def exec(self) -> None:
        """Replace the process image (pid and start time stay)."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(b"exec\n")
        self.popen.stdin.flush()

    def close(self) -> None:
        """Kill and reap it (after ``exec`` it no longer reads stdin)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)
        if self.popen.stdin is not None:
            self.popen.stdin.close()


@dataclass(frozen=True)
class SeenResource:
    """A resource as the Collector exported it, and when the test first read it."""

    resource: dict[str, Typed]
    schema_url: str
    seen_at: float  # time.monotonic()


class JsonLines:
    """Reads a file exporter's output incrementally: each call returns the lines completed since
    the last one (raw bytes: the profiles file holds what the profiler sent, which need not be
    UTF-8)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def new_lines(self) -> list[bytes]:
        """Complete lines written since the previous call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self._offset += end
        return [line for line in data[:end].split(b"\n") if line.strip()]


def _valid(value: Typed) -> Typed:
    """The sidecar's and the exporter's rule for text that is not UTF-8, applied to a value read
    from the profiles file (raw bytes there arrive as surrogate escapes)."""
    kind, v = value
    if kind == "string":
        return ("string", to_valid_utf8(v.encode("utf-8", "surrogateescape"))[0])
    if kind == "array":
        return ("array", tuple(_valid(x) for x in v))
    if kind == "kvlist":
        return ("kvlist", tuple((_key(k), _valid(x)) for k, x in v))
    return value


def _key(key: str) -> str:
    return to_valid_utf8(key.encode("utf-8", "surrogateescape"))[0]


def profile_resources(lines: Sequence[bytes], pid: int, now: float) -> list[SeenResource]:
    """The resources of ``pid``'s profiles in OTLP/JSON profiles lines, references resolved,
    with invalid UTF-8 replaced as the declaration does (what the wire can carry)."""
    found = []
    for line in lines:
        report: dict[str, Any] = json.loads(line.decode("utf-8", "surrogateescape"))
        strings = report.get("dictionary", {}).get("stringTable", [])
        for rp in report.get("resourceProfiles", []):
            resource = resolve(rp.get("resource", {}), strings)
            if resource.get("process.pid") == ("int", pid):
                valid = {_key(k): _valid(v) for k, v in resource.items()}
                found.append(SeenResource(valid, rp.get("schemaUrl", ""), now))
    return found


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` (with ``labels``) in Prometheus text exposition."""
    total = 0.0
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{(.*)\}})?\s+(\S+)$")
    for line in text.splitlines():
        m = pattern.match(line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total
