"""The fake kubelet (``fakekubelet/``, upstream's generated pod-resources server) as a process.

:func:`fakekubelet_binary` builds it once per source hash into the user cache (skips the test
when no Go toolchain is installed); :class:`FakeKubelet` runs it on a unix socket in a test's
temporary directory, with a state file that it reads again on every call (:meth:`set`).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

HERE = Path(__file__).resolve().parent
SOURCES = ("go.mod", "go.sum", "fakekubelet/main.go", "fakekubelet/apiserver.go")
TESTDATA = HERE / "testdata"
BUILD_TIMEOUT_S = 900.0
POLL_INTERVAL_S = 0.1

T = TypeVar("T")


def poll(predicate: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Call ``predicate`` until it returns something truthy and return it; fail naming
    ``what`` after ``timeout_s`` (the short interval between calls is polling, inside the
    deadline, never synchronisation by sleeping)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(POLL_INTERVAL_S)


def fakekubelet_binary() -> Path:
    """Build (or take from the cache) the fake kubelet; skip without a Go toolchain."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("no Go toolchain to build the fake kubelet (tests/kubernetes/fakekubelet)")
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + (HERE / name).read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpumetrics"
    binary = cache / f"fakekubelet-{digest.hexdigest()[:16]}"
    if binary.exists():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(f".{os.getpid()}.tmp")
    try:
        done = subprocess.run(
            [go, "build", "-o", str(partial), "./fakekubelet"],
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"building the fake kubelet took more than {BUILD_TIMEOUT_S:g} s")
    if done.returncode != 0:
        pytest.fail(f"go build ./fakekubelet failed ({done.returncode}):\n{done.stderr[-4000:]}")
    partial.replace(binary)
    return binary


def device(resource: str, *ids: str) -> dict[str, Any]:
    """A ``ContainerDevices`` in upstream protobuf JSON."""
    return {"resource_name": resource, "device_ids": list(ids)}


def pod(
    namespace: str,
    name: str,
    containers: Mapping[str, Sequence[dict[str, Any]]],
    claims: Mapping[str, Sequence[dict[str, Any]]] | None = None,
) -> dict:
    """A ``PodResources`` in upstream protobuf JSON: container name → its devices, and
    (``claims``) container name → its ``dynamic_resources`` (:func:`claim`)."""
    claims = claims or {}
    return {
        "name": name,
        "namespace": namespace,
        "containers": [
            {"name": c, "devices": list(devs), "dynamic_resources": list(claims.get(c, ()))}
            for c, devs in containers.items()
        ],
    }


def claim(namespace: str, name: str, *devices: tuple[str, str, str]) -> dict[str, Any]:
    """A ``DynamicResource`` in upstream protobuf JSON: a claim and its (driver, pool, device)
    triples, each with the CDI device NVIDIA's DRA driver names for it."""
    return {
        "claim_name": name,
        "claim_namespace": namespace,
        "claim_resources": [
            {
                "driver_name": driver,
                "pool_name": pool,
                "device_name": dev,
                "cdi_devices": [{"name": f"k8s.{driver}/claim={name}-{dev}"}],
            }
            for driver, pool, dev in devices
        ],
    }


class FakeKubelet:
    """The fake kubelet serving on ``<dir>/kubelet.sock``.

    Args:
        directory: where the socket, the state file and the log go.
        pods: the initial ``List`` answer's pods.
        allocatable: the initial ``GetAllocatableResources`` devices.
        socket_mode: the socket file's mode (octal text), e.g. ``"0600"``.
        api_server: also serve ResourceSlices over HTTPS (``fakekubelet/apiserver.go``): the
            URL is :attr:`api_url`, the CA :attr:`ca_file`, the bearer token :attr:`token`.

    """

    def __init__(
        self,
        directory: Path,
        pods: Iterable[dict[str, Any]] = (),
        allocatable: Iterable[dict[str, Any]] = (),
        socket_mode: str = "0600",
        api_server: bool = False,
    ) -> None:
        self.directory = directory
        self.socket = directory / "kubelet.sock"
        self.state_path = directory / "kubelet-state.json"
        self.token = "fake-service-account-token"
        self.ca_file = directory / "ca.crt"
        self.api_url = ""
        self._state: dict[str, Any] = {"socket_mode": socket_mode, "token": self.token}
        self.set(pods=pods, allocatable=allocatable)
        argv = [
            str(fakekubelet_binary()),
            "-socket",
            str(self.socket),
            "-state",
            str(self.state_path),
        ]
        if api_server:
            argv += ["-apiserver-dir", str(directory)]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        self._pump_thread = threading.Thread(
            target=self._pump, args=(lines,), name="fakekubelet-output", daemon=True
        )
        self._pump_thread.start()
        self.output: list[str] = []
        while True:
            line = lines.get(timeout=60)
            self.output.append(line)
            if line.startswith("apiserver "):
                self.api_url = line.split(None, 1)[1].strip()
                continue
            assert line.startswith("listening "), f"the fake kubelet did not start: {line}"
            break

    def _pump(self, lines: queue.Queue[str]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            lines.put(line)
        lines.put("(exited)")

    def set(
        self,
        pods: Iterable[dict[str, Any]] | None = None,
        allocatable: Iterable[dict[str, Any]] | None = None,
        **flags: Any,
    ) -> None:
        """Replace what the kubelet answers from now on (written atomically).

        ``flags`` are the state file's other keys: ``hang``, ``error_code``,
        ``allocatable_unimplemented`` (see ``fakekubelet/main.go``).
        """
        if pods is not None:
            self._state["list"] = {"pod_resources": list(pods)}
        if allocatable is not None:
            self._state["allocatable"] = {"devices": list(allocatable)}
        self._state.update(flags)
        partial = self.state_path.with_suffix(".tmp")
        partial.write_text(json.dumps(self._state))
        partial.replace(self.state_path)

    def close(self) -> None:
        """Stop the process, reap it (:func:`terminate`) and join the thread reading its output."""
        terminate(self.proc, 10)
        self._pump_thread.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def terminate(proc: subprocess.Popen[Any], timeout_s: float) -> None:
    """SIGTERM ``proc`` if it runs, SIGKILL it after ``timeout_s``; reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
