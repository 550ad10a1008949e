"""grpcurl, a real reflection client, against the real sidecar (issue 17, item 6).

grpcurl (github.com/fullstorydev/grpcurl, pinned below, installed from the Go module proxy into
the project's tool cache) asks for ``grpc.reflection.v1`` first. Asserted: it lists our services
and both reflection versions, and a Pull printed through reflection has the same JSON field
names as one printed from ``proto/gpumetrics/v1/pull.proto`` (``-proto``): protobuf's
lowerCamelCase, because the served descriptors carry ``json_name``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .harness import REPO, Proc, clean_environ, gpumetrics_command, procs

pytestmark = pytest.mark.e2e

GRPCURL_VERSION = "v1.9.3"
GRPCURL_ENV = "GRPCURL"  # a grpcurl binary to use instead of installing one
START_TIMEOUT_S = 60.0
INSTALL_TIMEOUT_S = 900.0


@pytest.fixture(scope="session")
def grpcurl() -> Path:
    """$GRPCURL, else grpcurl installed once with ``go install`` into the tool cache."""
    given = os.environ.get(GRPCURL_ENV)
    if given:
        return Path(given)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    tools = cache / "gpumetrics" / "go-tools" / f"grpcurl-{GRPCURL_VERSION}"
    binary = tools / "grpcurl"
    if binary.exists():
        return binary
    if shutil.which("go") is None:
        pytest.skip(f"no Go toolchain to install grpcurl (or set ${GRPCURL_ENV})")
    done = subprocess.run(
        ["go", "install", f"github.com/fullstorydev/grpcurl/cmd/grpcurl@{GRPCURL_VERSION}"],
        env={**os.environ, "GOBIN": str(tools)},
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    if done.returncode != 0:
        pytest.fail(f"go install grpcurl failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return binary


def wait_serving(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(), wait_for_ready=True, timeout=START_TIMEOUT_S
        )
        for response in watch:
            if response.status == health_pb2.HealthCheckResponse.SERVING:
                return
    raise AssertionError("the sidecar never turned SERVING")


def run(grpcurl: Path, *args: str) -> str:
    done = subprocess.run(
        [str(grpcurl), "-plaintext", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_grpcurl_lists_and_pulls_with_the_same_json_names_with_and_without_proto(
    grpcurl: Path, tmp_path: Path
) -> None:
    sock = tmp_path / "gm.sock"
    with procs() as started:
        sidecar = Proc(
            "sidecar",
            [
                gpumetrics_command(),
                "serve",
                "--simulate",
                "h100-sxm",
                "--listen",
                f"unix:{sock}",
                "--profiler-listen",
                f"unix:{tmp_path / 'profiler.sock'}",
                "--batch-interval",
                "0.5",
            ],
            clean_environ(),
            tmp_path / "sidecar.log",
        )
        started.append(sidecar)
        target = f"unix://{sock}"  # grpc's target form, which grpcurl passes on
        wait_serving(target)

        listed = run(grpcurl, target, "list").split()
        assert {
            "gpumetrics.v1.MetricsPullService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        } <= set(listed), listed
        # the profiler service is on its own socket (relayed: reflection works through it)
        assert "gpumetrics.v1.ProfilerIntegrationService" not in listed
        profiler = run(grpcurl, f"unix://{tmp_path / 'profiler.sock'}", "list").split()
        assert "gpumetrics.v1.ProfilerIntegrationService" in profiler, profiler

        pull = ["-d", '{"consumer": "grpcurl", "maxDataPoints": 50}']
        method = "gpumetrics.v1.MetricsPullService/Pull"
        reflected = json.loads(run(grpcurl, *pull, target, method))
        from_proto = json.loads(
            run(
                grpcurl,
                "-import-path",
                str(REPO / "proto"),
                "-proto",
                "gpumetrics/v1/pull.proto",
                *pull,
                target,
                method,
            )
        )
        # proto3 JSON leaves out a false bool: `more` is there only when the answer was cut,
        # which depends on what the store held at each pull (a batch may land in between)
        assert set(reflected) - {"more"} == set(from_proto) - {"more"}, (
            reflected.keys(),
            from_proto.keys(),
        )
        assert {"exportMetricsServiceRequest", "lastSequence", "dataPoints"} <= set(reflected)
        assert not any("_" in key for key in reflected), reflected.keys()

        described = run(grpcurl, target, "describe", "gpumetrics.v1.PullRequest")
        assert "read_after_sequence" in described and "max_data_points" in described
        assert sidecar.stop(30) == 0, sidecar.log_tail()
