"""The bulk encoder against the protobuf API, on every simulated profile and field case.

``Producer.collect`` writes OTLP by hand from columns (``gpumetrics.metrics.bulk``). Here the
same committed points also go to a reference producer that encodes them the way the sidecar
did before, one ``NumberDataPoint`` at a time through the protobuf API
(``gpumetrics.metrics.encode.encode_metric``), and the two requests must be equal as messages
(every resource, scope, metric and point, in order). The goldens (``test_otlp_output.py``) pin
what that content is; this pins that the hand-written bytes decode to it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from gpumetrics.identity.resourcer import new_process_resourcer
from gpumetrics.metrics import bulk, names
from gpumetrics.metrics.encode import count_points, encode_attributes, encode_metric
from gpumetrics.metrics.producer import Producer
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

import nvmlsim as sim

STEADY = {"pcie_interval_s": 1.0, "errors_interval_s": 1.0, "accounting_interval_s": 1.0}
SCENARIOS = sorted(sim.list_profiles()) + sorted(sim.list_field_cases())
SKIP = {"F12_driver_upgraded", "F21_slow_and_hung_calls", "F21_slow_init", "F22_shutdown_race"}
"""Scenarios whose collector waits on real time (hung calls, exit after N): covered elsewhere."""


class Reference(Producer):
    """Encodes its batch through the protobuf API, one data point at a time (the old encoder)."""

    def collect(self) -> Any:
        batch, resourcer = self._drain()
        self._fold_buffers(batch)
        req = metrics_service_pb2.ExportMetricsServiceRequest()
        host_rm = req.resource_metrics.add()
        encode_attributes(host_rm.resource.attributes, self._host_attributes.items())
        sm = self._scope_metrics(host_rm, self._scope)
        for name, mc in batch.host.items():
            if len(mc) and name not in self._disabled:
                encode_metric(sm.metrics.add(), mc.spec, list(mc.points()))
        by_pid: dict[int, dict[str, Any]] = {}  # pid → metric → its points, metrics in batch order
        for name, pc in batch.processes.items():
            for pid, mc in pc.by_pid().items():
                by_pid.setdefault(pid, {})[name] = mc
        for pid in sorted(by_pid):
            attrs: dict[str, Any] = {names.AttrProcessPID: pid}
            if resourcer is not None and not resourcer.put_resource(pid, attrs):
                continue
            attrs[names.AttrProcessPID] = pid
            rm = req.resource_metrics.add()
            encode_attributes(rm.resource.attributes, attrs.items())
            schema_url = getattr(resourcer, "schema_url", None)
            if schema_url is not None:  # as the protobuf-API producer set it (issue 27)
                rm.schema_url = schema_url(pid)
            psm = self._scope_metrics(rm, self._scope)
            for name, mc in by_pid[pid].items():
                if len(mc) and name not in self._disabled:
                    encode_metric(psm.metrics.add(), mc.spec, list(mc.points()))
            if not psm.metrics:
                del req.resource_metrics[-1]
        if not sm.metrics:
            del host_rm.scope_metrics[-1]
        if self._self_telemetry is not None:
            self_sm = self._scope_metrics(host_rm, self._self_scope)
            if not self._self_telemetry.render(self_sm.metrics):
                del host_rm.scope_metrics[-1]
        if not host_rm.scope_metrics:
            del req.resource_metrics[0]
        return req

    @staticmethod
    def _scope_metrics(rm: Any, scope: Any) -> Any:
        sm = rm.scope_metrics.add()
        sm.scope.name = scope.name
        if scope.schema_url:
            sm.schema_url = scope.schema_url
        return sm


def _tee(run: Any, reference: Producer) -> None:
    """Commit a copy of everything the collector commits to ``reference`` as well."""
    real = run.prod.commit

    def commit(*tables: Any) -> Any:
        reference.commit(*copy.deepcopy(tables))
        return real(*tables)

    run.prod.commit = commit


def _scenario(name: str) -> Any:
    if name in sim.list_field_cases():
        return sim.load_scenario(sim.field_case_path(name))
    return name


@pytest.fixture(params=["compiled", "python"])
def kernels(request):
    """Each test runs with the compiled kernels (``_wire.c``) and with the pure-Python ones."""
    if request.param == "compiled" and bulk._compiled is None:
        pytest.skip(
            "gpumetrics.metrics._wire not built (no C compiler): tests/unit/test_kernels.py"
        )
    before = bulk.kernels_in_use()
    bulk.use_kernels(request.param)
    yield request.param
    bulk.use_kernels(before)


@pytest.mark.parametrize("name", [s for s in SCENARIOS if s not in SKIP])
def test_bulk_output_equals_the_protobuf_api(nvml_run, helpers, name, kernels):
    run = nvml_run(_scenario(name), helpers.settings(**STEADY))
    reference = Reference(self_telemetry=run.tel)  # as the run's producer
    _tee(run, reference)
    points = 0
    for _ in range(3):
        run.cycle(2)
        got, want = run.prod.collect(), reference.collect()
        assert got == want, name
        points += count_points(got)
    assert points > 0, "nothing was compared"


def test_bulk_output_with_process_resources_and_self_telemetry(nvml_run, helpers, kernels):
    """Declared-like resources from a resourcer, several processes per GPU, the self scope."""
    run = nvml_run("h100-8x-training", helpers.settings(**STEADY))
    resourcer = new_process_resourcer(None, None, "node-1", False, read_process_context=False)
    kwargs = {"host_attributes": {"host.name": "node-1"}, "self_telemetry": run.tel}
    run.prod = Producer(**kwargs)
    run.col._producer = run.prod
    reference = Reference(**kwargs)
    for p in (run.prod, reference):
        p.set_process_resourcer(resourcer)
    _tee(run, reference)
    run.cycle(3)
    got = run.prod.collect()
    # the self-telemetry is rendered at collect time: render the reference at the same instant
    want = reference.collect()
    pids = {
        kv.value.int_value
        for rm in got.resource_metrics
        for kv in rm.resource.attributes
        if kv.key == "process.pid"
    }
    assert len(pids) > 1
    assert got.resource_metrics[0].scope_metrics[-1].scope.name == "gpumetrics.self"
    got_self = got.resource_metrics[0].scope_metrics.pop()
    want_self = want.resource_metrics[0].scope_metrics.pop()
    assert [m.name for m in got_self.metrics] == [m.name for m in want_self.metrics]
    assert got == want
