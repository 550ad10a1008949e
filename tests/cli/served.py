"""``gpumetrics serve --simulate`` as a child process, pulled with ``gpumetrics pull``.

Every wait has a deadline: the start-up and health waits block on the child's log and on a
health ``Watch`` stream; pulling until a condition holds re-runs ``gpumetrics pull`` (each run
acknowledges what it printed) with a short pause after an empty answer, inside the deadline.
The child is stopped with SIGTERM by :meth:`Served.stop` (which expects exit status 0) or killed
by :meth:`Served.close` in teardown.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

GPUMETRICS = Path(sys.executable).with_name("gpumetrics")
START_TIMEOUT_S = 60.0
PAUSE_S = 0.2  # after an empty pull, inside the deadline


def clean_env() -> dict[str, str]:
    """This environment without the developer's own GPUMETRICS_* / go-plugin variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("GPUMETRICS_", "PLUGIN_"))}


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Point:
    """One data point of a pulled request."""

    scope: str
    metric: str
    value: float | int
    attrs: dict[str, Any]
    resource: dict[str, Any]
    time: int


def points(request: metrics_service_pb2.ExportMetricsServiceRequest) -> list[Point]:
    """Every data point of ``request``, with its scope, resource and attributes."""
    out = []
    for rm in request.resource_metrics:
        res = {kv.key: _value(kv.value) for kv in rm.resource.attributes}
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                data = m.gauge.data_points if m.HasField("gauge") else m.sum.data_points
                for dp in data:
                    value = dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int
                    attrs = {kv.key: _value(kv.value) for kv in dp.attributes}
                    out.append(Point(sm.scope.name, m.name, value, attrs, res, dp.time_unix_nano))
    return out


class Served:
    """A running ``gpumetrics serve --simulate SCENARIO`` on a unix socket in ``tmp_path``.

    Args:
        tmp_path: where the socket (and an optional config file) live.
        simulate: a profile or field-case name, or a scenario file path.
        config: YAML text for ``--config`` (optional).
        args: more ``serve`` flags.

    """

    def __init__(
        self,
        tmp_path: Path,
        simulate: str | Path,
        config: str | None = None,
        args: Sequence[str] = (),
        listen: str | None = None,
    ) -> None:
        self.address = listen or f"unix:{tmp_path}/gpumetrics.sock"
        self.profiler_address = f"unix:{tmp_path}/profiler.sock"  # never the machine's default
        argv = [str(GPUMETRICS), "serve", "--simulate", str(simulate), "--listen", self.address]
        if "--profiler-listen" not in args and "profiler_listen" not in (config or ""):
            argv += ["--profiler-listen", self.profiler_address]
        argv += ["--log-format", "json", "--batch-interval", "1", *args]
        if config is not None:
            path = tmp_path / "gpumetrics.yaml"
            path.write_text(config, encoding="utf-8")
            argv += ["--config", str(path)]
        self.proc = subprocess.Popen(
            argv,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr: list[str] = []
        self.records: list[dict[str, Any]] = []
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._eof = threading.Event()
        self._pump_thread = threading.Thread(target=self._pump, name="served-stderr", daemon=True)
        self._pump_thread.start()
        self.started = self.wait_record(lambda r: r.get("@message") == "sidecar started")
        if listen is None or listen.endswith(":0"):
            self.address = self.started["listen"]

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            if line.startswith("{"):
                record = json.loads(line)
                self.records.append(record)
                self._queue.put(record)
        self._queue.put(None)
        self._eof.set()

    def wait_record(
        self, match: Callable[[dict[str, Any]], bool], timeout_s: float = START_TIMEOUT_S
    ) -> dict[str, Any]:
        """Block until the child logs a record ``match`` accepts; return it."""
        deadline = time.monotonic() + timeout_s
        for seen in list(self.records):
            if match(seen):
                return seen
        while True:
            try:
                record = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no matching log record in {timeout_s:g} s:\n{self.log()}"
                ) from None
            if record is None:
                raise AssertionError(f"the sidecar exited ({self.proc.poll()}):\n{self.log()}")
            if match(record):
                return record

    def log(self) -> str:
        """The child's stderr so far (for failure messages)."""
        return "".join(self.stderr[-200:])

    def watch_health(self, wanted: Sequence[int], service: str = "") -> list[int]:
        """Follow health ``service`` until the statuses in ``wanted`` were seen in that order."""
        seen: list[int] = []
        with grpc.insecure_channel(self.address) as channel:
            stream = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=service), timeout=START_TIMEOUT_S
            )
            left = list(wanted)
            for response in stream:
                seen.append(response.status)
                if left and response.status == left[0]:
                    left.pop(0)
                if not left:
                    stream.cancel()
                    return seen
        raise AssertionError(f"health {service!r}: saw {seen}, wanted {wanted}")

    def health(self, service: str = "") -> int:
        """One health ``Check`` of ``service``."""
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status

    def pull(self) -> metrics_service_pb2.ExportMetricsServiceRequest:
        """One `gpumetrics pull` (JSON), acknowledging what it printed; empty when nothing new."""
        done = subprocess.run(
            [str(GPUMETRICS), "pull", self.address, "--format", "json", "--wait", "30"],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr + self.log()
        request = json_format.Parse(done.stdout, metrics_service_pb2.ExportMetricsServiceRequest())
        if done.stdout.strip() == "{}":  # nothing new: an empty request, "no new batches" on stderr
            assert "no new batches" in done.stderr, done.stderr
        return request

    def pull_until(
        self, done: Callable[[list[Point]], bool], timeout_s: float = START_TIMEOUT_S
    ) -> list[Point]:
        """Pull (and acknowledge) until ``done(every point pulled so far)``; return them."""
        got: list[Point] = []
        deadline = time.monotonic() + timeout_s
        while True:
            new = points(self.pull())
            got.extend(new)
            if done(got):
                return got
            if time.monotonic() >= deadline:
                raise AssertionError(f"condition not met in {timeout_s:g} s:\n{self.log()}")
            if not new:
                time.sleep(PAUSE_S)  # polling interval inside the deadline

    def stop(self) -> None:
        """SIGTERM; the sidecar must exit 0 and print nothing on stdout.

        Returns once its whole log has been read, so :attr:`records` is complete.
        """
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=30) == 0, self.log()
        assert self.proc.stdout is not None and self.proc.stdout.read() == ""
        assert self._eof.wait(30), "the log pipe stayed open"
        self._pump_thread.join(30)

    def close(self) -> None:
        """Kill the child if it is still running (teardown net)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._pump_thread.join(30)  # ends at the end of the child's stderr
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
