"""The chart's DaemonSet (and gateway Deployment), as rendered in deploy/manifests/, run as plain
processes (tests/e2e/kube.py maps containers, volumes and ports onto this host): the commands,
arguments, environment, mounts and configuration files the chart gives each container start
the real sidecar and the real Collector; every readiness and liveness probe passes as the
kubelet would run it; every port a process listens on is a declared container port and every
declared port is listened on; and the Collector's Prometheus exporter, reached through the
Service, serves GPU metrics labelled with the pod the (fake) kubelet allocated each GPU to.

The one addition: the container that reads NVML gets ``GPUMETRICS_SIMULATE`` (the simulated
node of tests/kubernetes/testdata/k8s-node.yaml), since there is no GPU here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import psutil
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .harness import REPO, Proc, clean_environ, gpumetrics_command, procs, wait_for
from .kube import (
    ContainerRun,
    PodMapping,
    executable,
    find,
    load,
    pod_runs,
    service_address,
    service_host,
)

pytestmark = pytest.mark.e2e

TIMEOUT_S = 90.0
SCENARIO = REPO / "tests" / "kubernetes" / "testdata" / "k8s-node.yaml"
GPU0 = "GPU-00000000-0000-4000-8000-000000000000"
FIELDS = {"spec.nodeName": "gpu-node-1", "status.podIP": "127.0.0.1"}


def fake_kubelet_module() -> ModuleType:
    """tests/kubernetes/fake.py (self-contained), loaded by path: test folders are not packages
    of one another."""
    name = "gpumetrics_tests_fakekubelet"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, REPO / "tests" / "kubernetes" / "fake.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def root() -> Iterator[Path]:
    """A short directory for volumes and sockets (unix socket paths must stay < 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="gm-helm-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(root: Path) -> Iterator[Any]:
    """The fake kubelet: GPU-0 allocated to ml/train-0, container trainer."""
    fake = fake_kubelet_module()
    directory = root / "pod-resources"
    directory.mkdir()
    k = fake.FakeKubelet(
        directory,
        pods=[fake.pod("ml", "train-0", {"trainer": [fake.device("nvidia.com/gpu", GPU0)]})],
    )
    try:
        yield k
    finally:
        k.close()


def start(run: ContainerRun, otelcol: Path, root: Path, started: list[Proc]) -> Proc:
    """Start ``run`` as a process (the simulated driver for the container that reads NVML)."""
    argv = [executable(run.argv[0], gpumetrics_command(), otelcol), *run.argv[1:]]
    env = dict(run.env)
    if "NVIDIA_VISIBLE_DEVICES" in env:  # this container reads NVML
        env["GPUMETRICS_SIMULATE"] = str(SCENARIO)
    env["PATH"] = f"{gpumetrics_command().parent}{os.pathsep}{os.environ['PATH']}"
    proc = Proc(run.name, argv, clean_environ(env), root / f"{run.name}.log")
    started.append(proc)
    return proc


def probe_passes(probe: dict[str, Any]) -> bool:
    """Run a probe as the kubelet does (gRPC health Check / HTTP GET); True on success."""
    port = probe["local_port"]
    if "grpc" in probe:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                answer = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", "")),
                    timeout=5,
                )
            except grpc.RpcError:
                return False
            return answer.status == health_pb2.HealthCheckResponse.SERVING
    url = f"http://127.0.0.1:{port}{probe['httpGet'].get('path', '/')}"
    return http_get(url) is not None


def http_get(url: str) -> str | None:
    """The body of a 200 answer, else None."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (loopback)
            return str(response.read().decode()) if response.status == 200 else None
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def listening(proc: Proc) -> set[int]:
    """TCP ports the process and its children listen on."""
    ports = set()
    parent = psutil.Process(proc.pid)
    for p in [parent, *parent.children(recursive=True)]:
        for conn in p.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN:
                ports.add(conn.laddr.port)
    return ports


def run_pod(
    objects, workload, root: Path, otelcol: Path, started: list[Proc], remote=None
) -> tuple[list[ContainerRun], list[Proc]]:
    """Start every container of ``workload``'s pod; wait until each readiness probe passes."""
    name = workload["metadata"]["name"]
    mapping = PodMapping(root / f"pod-{name}", remote=dict(remote or {}))
    host_paths = {
        "/var/lib/kubelet/pod-resources": root / "pod-resources",
        "/proc": Path("/proc"),
        "/var/lib/gpumetrics/gpumetrics-gpumetrics": root / f"store-{name}",
    }
    runs = pod_runs(objects, workload, mapping, host_paths, FIELDS)
    pod_procs = [start(run, otelcol, root, started) for run in runs]

    def diagnostics() -> str:
        return "\n".join(p.log_tail() for p in pod_procs)

    for run, proc in zip(runs, pod_procs, strict=True):

        def ready(run: ContainerRun = run) -> bool:
            return probe_passes(run.probes["readinessProbe"])

        wait_for(
            ready,
            TIMEOUT_S,
            f"{name}/{run.name}'s readiness probe",
            diagnostics,
        )
        assert proc.running(), proc.log_tail()
    return runs, pod_procs


def assert_ports_match(runs: list[ContainerRun], pod_procs: list[Proc]) -> None:
    """What each container listens on is exactly what it declares (the pod shares one network
    namespace, so the pod's processes together must cover the pod's declared ports)."""
    declared = {port for run in runs for port in run.ports.values()}
    for run, proc in zip(runs, pod_procs, strict=True):
        extra = listening(proc) - declared
        assert not extra, f"{run.name} listens on undeclared ports {extra}"
    bound = set().union(*(listening(p) for p in pod_procs))
    assert declared <= bound, f"declared but not listened on: {declared - bound}"


def stop_all(pod_procs: list[Proc]) -> None:
    for proc in reversed(pod_procs):
        assert proc.stop(timeout_s=30) == 0, proc.log_tail()


def no_deprecations(root: Path) -> None:
    for log in root.glob("otelcol*.log"):
        deprecated = [line for line in log.read_text().splitlines() if "deprecated" in line]
        assert not deprecated, f"{log.name}: {deprecated}"


@pytest.mark.parametrize("manifest", ["gpumetrics.yaml", "gpumetrics-subprocess.yaml"])
def test_daemonset_as_rendered_serves_pod_labelled_gpu_metrics(
    manifest: str, otelcol: Path, root: Path, kubelet: Any
) -> None:
    objects = load(manifest)
    daemonset = find(objects, "DaemonSet")
    with procs() as started:
        runs, pod_procs = run_pod(objects, daemonset, root, otelcol, started)
        address = service_address(find(objects, "Service"), "prometheus", runs)

        def labelled() -> str | None:
            body = http_get(f"http://{address}/metrics") or ""
            lines = [
                line
                for line in body.splitlines()
                if line.startswith("hw_gpu_utilization_ratio{") and f'hw_id="{GPU0}"' in line
            ]
            return body if lines and all('k8s_pod_name="train-0"' in x for x in lines) else None

        body = wait_for(
            labelled,
            TIMEOUT_S,
            "GPU-0's utilisation labelled with its pod at the Prometheus exporter",
            lambda: "\n".join(p.log_tail() for p in pod_procs),
        )
        gpu0 = [x for x in body.splitlines() if f'hw_id="{GPU0}"' in x and "hw_power" in x]
        assert gpu0 and all(
            'k8s_namespace_name="ml"' in x and 'k8s_container_name="trainer"' in x for x in gpu0
        ), gpu0
        assert re.search(r'^nvidia_gpu_k8s_allocation\{[^}]*k8s_pod_name="train-0"', body, re.M)
        assert 'k8s_node_name="gpu-node-1"' in body  # GPUMETRICS_NODE_NAME from spec.nodeName
        for run in runs:
            assert probe_passes(run.probes["livenessProbe"]), f"{run.name}'s liveness probe"
        assert_ports_match(runs, pod_procs)
        stop_all(pod_procs)
    no_deprecations(root)


def test_gateway_topology_pushes_otlp_to_the_gateway(otelcol: Path, root: Path, kubelet: Any):
    """The DaemonSet of gpumetrics-gateway.yaml pushes to the gateway Deployment's Service. The
    gateway runs this repository's Collector distribution, which has the gateway's receiver,
    processors and health_check but not k8sattributes (that one is validated by the processor
    itself, tests/kubernetes/manifests): the test removes it and adds a file exporter to see
    what arrives."""
    objects = load("gpumetrics-gateway.yaml")
    gateway = find(objects, "Deployment", "gpumetrics-gateway")
    config_map = find(objects, "ConfigMap", "gpumetrics-gateway")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert "k8sattributes" in config["service"]["pipelines"]["metrics"]["processors"]
    config["processors"].pop("k8sattributes")
    for pipeline in config["service"]["pipelines"].values():  # metrics and logs (GPU events)
        pipeline["processors"].remove("k8sattributes")
    received = root / "gateway.jsonl"
    config["exporters"]["file"] = {"path": str(received), "flush_interval": "100ms"}
    config["service"]["pipelines"]["metrics"]["exporters"].append("file")
    config["service"]["telemetry"] = {"metrics": {"level": "none"}}
    config_map["data"]["config.yaml"] = yaml.safe_dump(config)

    with procs() as started:
        gateway_runs, gateway_procs = run_pod(objects, gateway, root, otelcol, started)
        service = find(objects, "Service", "gpumetrics-gateway")
        remote = {
            service_host(service, "otlp-grpc"): service_address(service, "otlp-grpc", gateway_runs)
        }
        daemonset = find(objects, "DaemonSet")
        runs, pod_procs = run_pod(objects, daemonset, root, otelcol, started, remote)

        def pod_labelled_at_gateway() -> bool:
            if not received.exists():
                return False
            for line in received.read_text().splitlines():
                for rm in json.loads(line).get("resourceMetrics", []):
                    for sm in rm.get("scopeMetrics", []):
                        for m in sm.get("metrics", []):
                            if m["name"] != "hw.power":
                                continue
                            for dp in m["gauge"]["dataPoints"]:
                                attrs = {
                                    a["key"]: a["value"].get("stringValue")
                                    for a in dp["attributes"]
                                }
                                if (
                                    attrs.get("hw.id") == GPU0
                                    and attrs.get("k8s.pod.name") == "train-0"
                                ):
                                    return True
            return False

        wait_for(
            pod_labelled_at_gateway,
            TIMEOUT_S,
            "GPU-0's power with its pod, pushed to the gateway",
            lambda: "\n".join(p.log_tail() for p in [*gateway_procs, *pod_procs]),
        )
        for run in [*runs, *gateway_runs]:
            assert probe_passes(run.probes["livenessProbe"]), f"{run.name}'s liveness probe"
        assert_ports_match(runs, pod_procs)
        assert_ports_match(gateway_runs, gateway_procs)
        stop_all(pod_procs)
        stop_all(gateway_procs)
    no_deprecations(root)
