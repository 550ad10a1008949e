"""Issue 10 item 2: a process's GPU resource equals its profile resource, before and after the
profiler declares it.

Each case of tests/testdata/identity/profile_resource_cases.yaml is a process (fake procfs) and
the resource the OpenTelemetry eBPF profiler exports for it, in OTLP/JSON. The sidecar is
configured with the profiler's ``-env-vars`` value as ``GPUMETRICS_INCLUDE_ENV_VARS`` (parsed
by the real configuration loader), renders the process's points through the real Producer, and
the per-process resource is compared with the profile's attribute by attribute as OTLP
``AnyValue`` messages (so ``intValue`` 4242 is not ``stringValue`` "4242"). Then the process is
declared the way the profiles exporter does it (``profiler_resource`` = the profile resource's
bytes, ``environment`` = its ``process.environment_variable.*``), and compared again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from gpumetrics.config import load_config
from gpumetrics.identity.declared import DeclaredStore
from gpumetrics.identity.modes import ENV_VAR_PREFIX
from gpumetrics.identity.procfs import ProcfsReader
from gpumetrics.identity.resourcer import new_process_resourcer
from gpumetrics.metrics import names
from gpumetrics.metrics.buffer import Point
from gpumetrics.metrics.producer import Producer
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from .conftest import load_cases
from .fakeproc import PID, make_proc

CASES = load_cases("profile_resource_cases.yaml")
# The schema_url the profiler puts on every ResourceProfiles (v0.0.202633,
# reporter/internal/pdata/generate.go: rp.SetSchemaUrl(semconv.SchemaURL), semconv v1.37.0).
PROFILE_SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"


def profile_resource(case: dict[str, Any]) -> resource_pb2.Resource:
    return json_format.ParseDict(case["profile_resource"], resource_pb2.Resource())


def attributes(resource: resource_pb2.Resource) -> dict[str, common_pb2.AnyValue]:
    out = {kv.key: kv.value for kv in resource.attributes}
    assert len(out) == len(resource.attributes), "duplicate keys"
    return out


class Sidecar:
    """The identity half of a sidecar over a fake procfs: declared store, resourcer, producer."""

    def __init__(self, case: dict[str, Any], root: Path, mode: str) -> None:
        make_proc(root, case["procfs"])
        env = {"GPUMETRICS_IDENTITY_MODE": mode}
        if case["env_vars"]:
            env["GPUMETRICS_INCLUDE_ENV_VARS"] = case["env_vars"]
        ident = load_config(None, env).identity
        procfs = ProcfsReader(str(root), include_env_vars=ident.include_env_vars)
        self.store = DeclaredStore(start_time_reader=procfs.start_time_ticks)
        resourcer = new_process_resourcer(
            None, self.store, "gpu-node-1", False, procfs=procfs, mode=ident.mode
        )
        self.producer = Producer(host_attributes={"host.name": "gpu-node-1"})
        self.producer.set_process_resourcer(resourcer)

    def gpu_resource(self) -> resource_pb2.Resource:
        """Record one per-process point for pid 4242 and return its resource as produced."""
        return self.gpu_resource_metrics().resource

    def gpu_resource_metrics(self) -> Any:
        """Record one per-process point for pid 4242 and return its ResourceMetrics."""
        self.producer.record_process(
            PID,
            lambda buf: buf.points(names.MetricProcessMemoryUsage).append(
                Point(
                    1 << 30,
                    1_700_000_000_000_000_000,
                    (("hw.id", "GPU-0"),),
                    1_600_000_000_000_000_000,
                )
            ),
        )
        request = self.producer.collect()
        found = [
            rm
            for rm in request.resource_metrics
            if any(
                m.name == names.MetricProcessMemoryUsage
                for sm in rm.scope_metrics
                for m in sm.metrics
            )
        ]
        assert len(found) == 1, request
        return found[0]

    def declare_as_the_profiles_exporter(self, profile: resource_pb2.Resource, start: int) -> None:
        env = [
            (k[len(ENV_VAR_PREFIX) :], v.string_value.encode())
            for k, v in attributes(profile).items()
            if k.startswith(ENV_VAR_PREFIX)
        ]
        self.store.declare(
            PID,
            start,
            b"",
            env,
            profile.SerializeToString(),
            declarer="exporter",
            schema_url=PROFILE_SCHEMA_URL,
        )


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_undeclared_resource_equals_the_later_declared_one(
    case: dict[str, Any], tmp_path: Path
) -> None:
    profile = attributes(profile_resource(case))
    only_declared = set(case.get("declared_only", ()))
    sidecar = Sidecar(case, tmp_path, "profiler")

    before = attributes(sidecar.gpu_resource())
    assert before == {k: v for k, v in profile.items() if k not in only_declared}

    sidecar.declare_as_the_profiles_exporter(profile_resource(case), case["procfs"]["start"])
    after = attributes(sidecar.gpu_resource())
    assert after == profile
    assert {k: v for k, v in after.items() if k not in only_declared} == before


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_enriched_mode_agrees_on_every_profile_key(case: dict[str, Any], tmp_path: Path) -> None:
    """Enriched resources do not join exactly (they carry more keys), but on the profile's own
    keys they hold the profile's values, declared or not."""
    profile = attributes(profile_resource(case))
    only_declared = set(case.get("declared_only", ()))
    sidecar = Sidecar(case, tmp_path, "enriched")

    before = attributes(sidecar.gpu_resource())
    shared = set(profile) - only_declared
    assert {k: before.get(k) for k in shared} == {k: profile[k] for k in shared}
    assert set(before) > shared  # and more: host.name, service.name, creation time, ...

    sidecar.declare_as_the_profiles_exporter(profile_resource(case), case["procfs"]["start"])
    after = attributes(sidecar.gpu_resource())
    assert {k: after.get(k) for k in profile} == profile


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_schema_url_equals_the_profiles_before_and_after_the_declaration(
    case: dict[str, Any], tmp_path: Path
) -> None:
    """Issue 27 item 5: the per-process ResourceMetrics carries the declared resource's
    schema_url; before the declaration, the one the profiler gives every profile resource."""
    sidecar = Sidecar(case, tmp_path, "profiler")
    assert sidecar.gpu_resource_metrics().schema_url == PROFILE_SCHEMA_URL
    sidecar.declare_as_the_profiles_exporter(profile_resource(case), case["procfs"]["start"])
    assert sidecar.gpu_resource_metrics().schema_url == PROFILE_SCHEMA_URL
    # a declarer that sends another one (or none: older declarers) is taken verbatim
    sidecar.store.declare(
        PID,
        case["procfs"]["start"],
        b"",
        [],
        profile_resource(case).SerializeToString(),
        schema_url="https://example.com/schemas/9",
    )
    assert sidecar.gpu_resource_metrics().schema_url == "https://example.com/schemas/9"
    sidecar.store.declare(
        PID, case["procfs"]["start"], b"", [], profile_resource(case).SerializeToString()
    )
    assert sidecar.gpu_resource_metrics().schema_url == ""


@pytest.mark.parametrize("case", CASES[:1], ids=[c["id"] for c in CASES[:1]])
def test_enriched_resources_carry_no_schema_url(case: dict[str, Any], tmp_path: Path) -> None:
    sidecar = Sidecar(case, tmp_path, "enriched")
    assert sidecar.gpu_resource_metrics().schema_url == ""
    sidecar.declare_as_the_profiles_exporter(profile_resource(case), case["procfs"]["start"])
    assert sidecar.gpu_resource_metrics().schema_url == ""
