"""Fixtures for the NVML collector tests: a collector on the simulated driver, cycle by cycle.

``nvml_run(scenario, settings=..., **install_kwargs)`` installs the simulated driver (manual
clock), builds a Producer, a Telemetry and a Collector on the driver's clock, and returns a
:class:`Run`. ``run.cycle()`` collects once at the current simulated time and then steps the
clock to the next cycle; ``run.output()`` drains the producer into an :class:`Output` with
lookup helpers. Teardown stops the collector and uninstalls the driver.

``--update-golden`` rewrites the exact OTLP goldens under ``tests/testdata/golden/`` (and fails
the tests that wrote, so it cannot stay on by accident).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format
from gpumetrics.metrics.producer import Producer
from gpumetrics.nvml.collector import Collector, CycleReport
from gpumetrics.nvml.settings import CollectionSettings
from gpumetrics.selftelemetry import Telemetry
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

import nvmlsim as sim

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "testdata" / "golden"
PID_MAX = 4_194_304
"""Tests never depend on this machine's pid_max (often 32768 in containers)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/testdata/golden/*.json from the current output (the tests then fail)",
    )


def _value(v: dict[str, Any]) -> Any:
    for key in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if key in v:
            return int(v[key]) if key == "intValue" else v[key]
    return v


def attrs(kvs: list[dict[str, Any]] | None) -> dict[str, Any]:
    """proto3-JSON KeyValue list → dict."""
    return {kv["key"]: _value(kv["value"]) for kv in kvs or ()}


@dataclass
class P:
    """One decoded data point."""

    metric: str
    value: float | int
    attrs: dict[str, Any]
    time: int
    start: int
    resource: dict[str, Any]
    scope: str


@dataclass
class Output:
    """One ``Producer.collect()`` request, decoded."""

    request: Any
    points: list[P] = field(default_factory=list)

    @classmethod
    def of(cls, request: Any) -> Output:
        out = cls(request)
        doc = json_format.MessageToDict(request)
        for rm in doc.get("resourceMetrics", []):
            res = attrs(rm.get("resource", {}).get("attributes"))
            for sm in rm.get("scopeMetrics", []):
                scope = sm.get("scope", {}).get("name", "")
                for m in sm.get("metrics", []):
                    data = m.get("gauge") or m.get("sum") or {}
                    for dp in data.get("dataPoints", []):
                        value = dp["asDouble"] if "asDouble" in dp else int(dp.get("asInt", 0))
                        out.points.append(
                            P(
                                m["name"],
                                value,
                                attrs(dp.get("attributes")),
                                int(dp.get("timeUnixNano", 0)),
                                int(dp.get("startTimeUnixNano", 0)),
                                res,
                                scope,
                            )
                        )
        return out

    def find(self, metric: str, **match: Any) -> list[P]:
        """Points of ``metric`` whose attributes (or ``pid=`` resource pid) match."""
        pid = match.pop("pid", None)
        out = []
        for p in self.points:
            if p.metric != metric:
                continue
            if pid is not None and p.resource.get("process.pid") != pid:
                continue
            if all(p.attrs.get(k.replace("__", ".")) == v for k, v in match.items()):
                out.append(p)
        return out

    def values(self, metric: str, **match: Any) -> list[float | int]:
        return [p.value for p in self.find(metric, **match)]

    def one(self, metric: str, **match: Any) -> P:
        found = self.find(metric, **match)
        assert len(found) == 1, f"{metric} {match}: {len(found)} points: {found}"
        return found[0]

    def names(self, scope: str | None = None) -> set[str]:
        return {p.metric for p in self.points if scope is None or p.scope == scope}

    def pids(self) -> set[int]:
        return {p.resource["process.pid"] for p in self.points if "process.pid" in p.resource}


class Run:
    """A collector on an installed simulated driver."""

    def __init__(self, drv: sim.SimDriver, settings: CollectionSettings) -> None:
        self.drv = drv
        clock = drv.clock
        scn = drv.scenario
        self.boot_ns = round((scn.clock.start_unix - scn.clock.uptime_s) * 1e9)
        self.tel = Telemetry(clock_ns=lambda: clock.now_us() * 1000)
        self.prod = Producer(self_telemetry=self.tel)
        self.col = Collector(
            self.prod,
            settings,
            self.tel,
            clock_ns=lambda: clock.now_us() * 1000,
            monotonic_ns=lambda: clock.now_us() * 1000,
            boot_time_ns=lambda: self.boot_ns,
        )

    def collect(self) -> CycleReport:
        """Collect once at the current simulated time."""
        return self.col.collect_once()

    def cycle(self, n: int = 1) -> CycleReport:
        """Collect once, then step to the next cycle; ``n`` times; return the last report."""
        report = None
        for _ in range(n):
            report = self.col.collect_once()
            self.drv.next_cycle()
        assert report is not None
        return report

    def output(self) -> Output:
        return Output.of(self.prod.collect())

    def calls(self, function: str, device: Any = sim.ANY_DEVICE) -> int:
        return self.drv.call_count(function, device)

    def self_output(self) -> Output:
        """The self-telemetry as rendered now (does not drain the producer)."""
        req = metrics_service_pb2.ExportMetricsServiceRequest()
        sm = req.resource_metrics.add().scope_metrics.add()
        sm.scope.name = "gpumetrics.self"
        self.tel.render(sm.metrics)
        return Output.of(req)

    def errors(self, function: str | None = None, code: str | None = None) -> int:
        """``gpumetrics.nvml.errors`` summed over series matching ``function`` / ``code``."""
        total = 0
        for p in self.self_output().find("gpumetrics.nvml.errors"):
            if function is not None and p.attrs.get("nvml.function") != function:
                continue
            if code is not None and p.attrs.get("nvml.return_code") != code:
                continue
            total += int(p.value)
        return total

    def failures(self) -> int:
        """NVML errors other than capability answers (NOT_SUPPORTED, each counted once)."""
        return self.errors() - self.errors(code="NOT_SUPPORTED")

    def dropped(self, reason: str) -> int:
        return int(self.tel.value("gpumetrics.values.dropped", {"reason": reason}) or 0)


LOADED_MACHINE_DEADLINES = {"call_timeout_s": 60.0, "cycle_timeout_s": 60.0}
"""Deadlines a loaded test machine never reaches: the per-call (2 s) and cycle (1 s) defaults
are real time, and a busy 2-core machine can pass them inside the simulator, which would drop a
tick's readings or degrade a GPU. Tests of the deadlines themselves set their own."""


def settings(**overrides: Any) -> CollectionSettings:
    """Collection settings for tests: this machine's pid_max and load never matter."""
    return CollectionSettings(**({"pid_max": PID_MAX} | LOADED_MACHINE_DEADLINES | overrides))


def scenario(name_or_data: Any) -> sim.Scenario:
    """A built-in profile or field case of nvmlsim (by name), a scenario file, or scenario data."""
    if isinstance(name_or_data, sim.Scenario):
        return name_or_data
    if isinstance(name_or_data, dict):
        return sim.scenario_from_data(name_or_data)
    return sim.load_scenario(name_or_data)


def variant(name: str, **driver: Any) -> sim.Scenario:
    """Field case ``name`` of nvmlsim with ``driver`` keys overridden."""
    data = yaml.safe_load(sim.field_case_path(name).read_text())
    data["driver"] = {**data.get("driver", {}), **driver}
    return sim.scenario_from_data(data)


OLD_PROCESS_UTILIZATION = {"missing_symbols": ["nvmlDeviceGetProcessesUtilizationInfo"]}
"""Driver override that makes the collector use ``nvmlDeviceGetProcessUtilization``.

Scenarios whose faults, overrides or visibility triggers name that older call (F20, F21, F24)
need it on drivers that also have ``nvmlDeviceGetProcessesUtilizationInfo``, which the
collector prefers.
"""


@pytest.fixture
def nvml_run() -> Iterator[Any]:
    runs: list[Run] = []

    def make(scn: Any, settings_: CollectionSettings | None = None, **install: Any) -> Run:
        drv = sim.install(scenario(scn), **({"latency": "off"} | install))
        run = Run(drv, settings_ or settings())
        runs.append(run)
        return run

    try:
        yield make
    finally:
        for run in runs:
            if not run.col.stop(1.0):
                sim.uninstall()  # releases hung calls; later calls answer UNINITIALIZED
                run.col.stop(5.0)
        sim.uninstall()


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    try:
        return bool(request.config.getoption("--update-golden"))
    except ValueError:
        return False


def golden_json(request_message: Any) -> str:
    """Normalised proto3-JSON of a request: sorted, with the one wall-clock value pinned.

    Resources are sorted by their attributes, scopes by name, metrics by name and data points
    by (attributes, time). Point times come from the simulator's manual clock, so they are
    pinned by construction; the self-telemetry cycle duration (real CPU time) is set to 0.
    """
    doc = json_format.MessageToDict(request_message)
    for rm in doc.get("resourceMetrics", []):
        for sm in rm.get("scopeMetrics", []):
            for m in sm.get("metrics", []):
                data = m.get("gauge") or m.get("sum") or {}
                if m["name"] == "gpumetrics.collection.duration":
                    for dp in data.get("dataPoints", []):
                        dp["asDouble"] = 0.0
                data.get("dataPoints", []).sort(
                    key=lambda dp: (
                        json.dumps(dp.get("attributes", []), sort_keys=True),
                        int(dp.get("timeUnixNano", 0)),
                    )
                )
            sm.get("metrics", []).sort(key=lambda m: m["name"])
        rm.get("scopeMetrics", []).sort(key=lambda sm: sm.get("scope", {}).get("name", ""))
    doc.get("resourceMetrics", []).sort(
        key=lambda rm: json.dumps(rm.get("resource", {}).get("attributes", []), sort_keys=True)
    )
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


@pytest.fixture
def helpers() -> Any:
    """The helper functions and classes of this conftest, for test modules."""

    class H:
        Output = Output
        settings = staticmethod(settings)
        scenario = staticmethod(scenario)
        golden_json = staticmethod(golden_json)
        variant = staticmethod(variant)
        OLD_PROCESS_UTILIZATION = OLD_PROCESS_UTILIZATION
        GOLDEN_DIR = GOLDEN_DIR
        PID_MAX = PID_MAX

    return H
