"""The sidecar as a process, on a simulated node, attributing GPUs from the fake kubelet.

The "kubelet" is the upstream generated pod-resources server (``fakekubelet/``); the sidecar is
``gpumetrics serve`` on ``testdata/k8s-node.yaml`` (three L4 GPUs, an A100 with two MIG
instances), pulled over its unix socket like the Collector's receiver does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import yaml
from gpumetrics.v1 import pull_pb2, pull_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from .fake import device, pod, poll, terminate

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "testdata" / "k8s-node.yaml"
GPUMETRICS = Path(sys.executable).with_name("gpumetrics")

GPU0 = "GPU-00000000-0000-4000-8000-000000000000"
GPU1 = "GPU-11111111-1111-4111-8111-111111111111"
GPU2 = "GPU-22222222-2222-4222-8222-222222222222"
GPU3 = "GPU-33333333-3333-4333-8333-333333333333"
MIG_A = "MIG-aaaaaaaa-aaaa-5aaa-8aaa-aaaaaaaaaaaa"
MIG_B = "MIG-bbbbbbbb-bbbb-5bbb-8bbb-bbbbbbbbbbbb"
K8S = ("k8s.namespace.name", "k8s.pod.name", "k8s.container.name", "nvidia.gpu.k8s.shared")

PODS = [
    # the NVIDIA device plugin's ids: the GPU UUID
    pod("ml", "train-0", {"trainer": [device("nvidia.com/gpu", GPU0)]}),
    # time slicing (renamed resource): replicas ::0 for one pod, ::1 and ::2 for another
    pod("ml", "infer-a", {"main": [device("nvidia.com/gpu.shared", GPU1 + "::0")]}),
    pod("ml", "infer-b", {"main": [device("nvidia.com/gpu.shared", GPU1 + "::1", GPU1 + "::2")]}),
    # GKE's device plugin's ids: the device node's name
    pod("research", "notebook-7", {"jupyter": [device("nvidia.com/gpu", "nvidia2")]}),
    # a MIG device by its MIG UUID (mixed strategy resource name)
    pod("ml", "mig-job", {"worker": [device("nvidia.com/mig-3g.20gb", MIG_A)]}),
    pod("kube-system", "dns", {"coredns": []}),
]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("GPUMETRICS_", "PLUGIN_"))}


class Sidecar:
    """``gpumetrics serve`` with pod attribution on, pulled as consumer ``k8s-test``."""

    def __init__(self, directory: Path, kubelet_socket: Path, **kubernetes: object) -> None:
        config = directory / "gpumetrics.yaml"
        settings = {
            "pod_attribution": True,
            "pod_resources_socket": str(kubelet_socket),
            "refresh_interval_s": 0.2,
            "timeout_s": 2.0,
            **kubernetes,
        }
        config.write_text(yaml.safe_dump({"kubernetes": settings}))
        self.socket = directory / "gm.sock"
        self.profiler_socket = directory / "profiler.sock"  # its own socket, as by default
        self.log = directory / "sidecar.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [GPUMETRICS, "serve", "--config", config, "--simulate", SCENARIO,
                 "--listen", f"unix:{self.socket}", "--batch-interval", "0.5",
                 "--profiler-listen", f"unix:{self.profiler_socket}",
                 "--log-format", "json"],
                env=clean_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.channel = grpc.insecure_channel(f"unix:{self.socket}")
        self.stub = pull_pb2_grpc.MetricsPullServiceStub(self.channel)
        self.ack = (0, "")

    def pull(self) -> list[metrics_service_pb2.ExportMetricsServiceRequest]:
        """Every batch since the last pull (acknowledged), or [] while none is stored yet."""
        seq, epoch = self.ack
        try:
            resp = self.stub.Pull(
                pull_pb2.PullRequest(consumer="k8s-test", ack_sequence=seq, ack_epoch=epoch,
                                     read_after_sequence=seq),
                timeout=10,
            )  # fmt: skip
        except grpc.RpcError as err:
            if err.code() is grpc.StatusCode.UNAVAILABLE:
                return []
            raise
        if resp.last_sequence:
            self.ack = (resp.last_sequence, resp.epoch)
        if not resp.last_sequence:
            return []
        request = metrics_service_pb2.ExportMetricsServiceRequest()
        request.ParseFromString(resp.export_metrics_service_request)
        return [request]

    def batch_where(self, predicate: Callable[[dict], bool], what: str, timeout_s: float = 60):
        """Pull until a batch whose device points (:func:`device_points`) satisfy ``predicate``;
        return those points and the batch."""

        def attempt():
            for request in self.pull():
                points = device_points(request)
                if points and predicate(points):
                    return points, request
            return None

        try:
            return poll(attempt, timeout_s, what)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.log.read_text()[-4000:]}") from None

    def stop(self) -> None:
        self.channel.close()
        terminate(self.proc, 30)


def value(v) -> object:
    return getattr(v, v.WhichOneof("value"))


def device_points(request) -> dict:
    """``{(metric, hw.id): [attributes of each point]}`` of the host resource's GPU metrics,
    plus ``("process", pid)`` → the attributes of its resource and points."""
    out: dict = {}
    for rm in request.resource_metrics:
        resource = {kv.key: value(kv.value) for kv in rm.resource.attributes}
        for sm in rm.scope_metrics:
            if sm.scope.name != "parca.nvidia_gpu_metrics":
                continue
            for m in sm.metrics:
                data = getattr(m, m.WhichOneof("data"))
                for dp in data.data_points:
                    attrs = {kv.key: value(kv.value) for kv in dp.attributes}
                    if "process.pid" in resource:
                        out.setdefault(("process", resource["process.pid"]), []).append(
                            {**resource, **attrs}
                        )
                    else:
                        out.setdefault((m.name, attrs["hw.id"]), []).append(attrs)
    return out


def k8s(attrs: dict) -> dict:
    return {k: attrs[k] for k in K8S if k in attrs}


@pytest.fixture
def sidecars(short_dir):
    started: list[Sidecar] = []

    def start(kubelet, **kubernetes):
        started.append(Sidecar(short_dir, kubelet.socket, **kubernetes))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def held(points) -> bool:
    return ("nvidia.gpu.k8s.allocation", MIG_A) in points


def test_device_metrics_carry_the_pod_allocated_each_gpu(fake_kubelet, sidecars):
    kubelet = fake_kubelet(pods=PODS, allocatable=[device("nvidia.com/gpu", GPU0, GPU1, GPU2)])
    sidecar = sidecars(kubelet)
    points, _ = sidecar.batch_where(held, "a batch with the kubelet's allocations")

    train = {"k8s.namespace.name": "ml", "k8s.pod.name": "train-0", "k8s.container.name": "trainer"}
    for metric in ("hw.gpu.utilization", "hw.gpu.memory.usage", "hw.power", "hw.temperature",
                   "hw.status", "nvidia.gpu.power.limit"):  # fmt: skip
        assert [k8s(a) for a in points[(metric, GPU0)]] == [train] * len(points[(metric, GPU0)])
    assert {a["hw.state"] for a in points[("hw.status", GPU0)]} == {
        "ok",
        "degraded",
        "failed",
        "predicted_failure",
    }

    # GKE's id "nvidia2" names the GPU whose minor number is 2
    assert k8s(points[("hw.power", GPU2)][0]) == {
        "k8s.namespace.name": "research", "k8s.pod.name": "notebook-7",
        "k8s.container.name": "jupyter",
    }  # fmt: skip

    # a MIG device: its own points carry its pod; the other instance is nobody's
    assert k8s(points[("hw.gpu.memory.usage", MIG_A)][0]) == {
        "k8s.namespace.name": "ml", "k8s.pod.name": "mig-job", "k8s.container.name": "worker",
    }  # fmt: skip
    assert k8s(points[("hw.gpu.memory.usage", MIG_B)][0]) == {}
    # the board values of the MIG GPU follow the holders of its instances (one: mig-job)
    assert k8s(points[("hw.power", GPU3)][0])["k8s.pod.name"] == "mig-job"

    # a shared GPU says so, keeps only what all holders share, and lists every holder
    assert k8s(points[("hw.gpu.utilization", GPU1)][0]) == {
        "k8s.namespace.name": "ml", "nvidia.gpu.k8s.shared": True,
    }  # fmt: skip
    shares = sorted(  # a batch may hold several cycles: one point per holder in each
        {
            (a["k8s.pod.name"], a["nvidia.gpu.k8s.resource_name"])
            for a in points[("nvidia.gpu.k8s.allocation", GPU1)]
        }
    )
    assert shares == [("infer-a", "nvidia.com/gpu.shared"), ("infer-b", "nvidia.com/gpu.shared")]

    # per-process resources keep their own identity: nothing from the kubelet on them
    process = points[("process", 4242)]
    assert process and all(not k8s(a) for a in process)
    assert all(a["hw.id"] == GPU0 for a in process)


def test_a_declared_process_keeps_the_pod_its_profiler_says(fake_kubelet, sidecars):
    """The kubelet says GPU-0 is train-0's; the profiler says the process on it is in another
    pod (e.g. a privileged pod using a GPU it was not allocated): each claim stays where it
    belongs, the device's on the device points, the process's on its resource."""
    kubelet = fake_kubelet(pods=PODS)
    sidecar = sidecars(kubelet)
    sidecar.batch_where(held, "a batch with the kubelet's allocations")
    declared = subprocess.run(
        [GPUMETRICS, "declare", f"unix:{sidecar.profiler_socket}", "--pid", "4242",
         "--start-time-ticks", "0", "--attr", "k8s.namespace.name=debug",
         "--attr", "k8s.pod.name=gpu-debugger", "--attr", "k8s.container.name=shell"],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert declared.returncode == 0, declared.stderr

    def declared_seen(points):
        process = points.get(("process", 4242), [])
        return process and all(a.get("k8s.pod.name") == "gpu-debugger" for a in process)

    points, _ = sidecar.batch_where(declared_seen, "the process's declared pod on its resource")
    debugger = {
        "k8s.namespace.name": "debug",
        "k8s.pod.name": "gpu-debugger",
        "k8s.container.name": "shell",
    }
    assert all(k8s(a) == debugger for a in points[("process", 4242)])
    assert all(a["k8s.pod.name"] == "train-0" for a in points[("hw.power", GPU0)])


def test_allocation_values_count_the_device_ids_each_container_holds(fake_kubelet, sidecars):
    kubelet = fake_kubelet(pods=PODS)
    sidecar = sidecars(kubelet)
    _, request = sidecar.batch_where(held, "a batch with the kubelet's allocations")
    values = {}
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == "nvidia.gpu.k8s.allocation":
                    for dp in m.gauge.data_points:
                        a = {kv.key: value(kv.value) for kv in dp.attributes}
                        values[(a["hw.id"], a["k8s.pod.name"])] = dp.as_int
    assert values[(GPU0, "train-0")] == 1
    assert values[(GPU1, "infer-a")] == 1
    assert values[(GPU1, "infer-b")] == 2  # two time-slicing replicas
    assert values[(MIG_A, "mig-job")] == 1
    assert (GPU3, "mig-job") not in values  # the instance was allocated, not the board


def test_pods_coming_and_going_and_a_hanging_kubelet(fake_kubelet, sidecars):
    kubelet = fake_kubelet(pods=PODS)
    sidecar = sidecars(kubelet, stale_after_s=3.0, timeout_s=1.0)
    pod_of = lambda points: points.get(("hw.power", GPU0), [{}])[0].get("k8s.pod.name")  # noqa: E731
    sidecar.batch_where(lambda p: pod_of(p) == "train-0", "GPU-0 held by train-0")

    # train-0 ends, train-1 gets GPU-0
    kubelet.set(pods=[pod("ml", "train-1", {"trainer": [device("nvidia.com/gpu", GPU0)]})])
    sidecar.batch_where(lambda p: pod_of(p) == "train-1", "GPU-0 handed to train-1")
    # nobody holds it
    kubelet.set(pods=[])
    sidecar.batch_where(
        lambda p: ("hw.power", GPU0) in p and pod_of(p) is None
        and ("nvidia.gpu.k8s.allocation", GPU0) not in p,
        "GPU-0 released",
    )  # fmt: skip

    # the kubelet hangs: collection goes on, and the last answer is dropped once stale
    kubelet.set(pods=PODS)
    sidecar.batch_where(lambda p: pod_of(p) == "train-0", "GPU-0 held by train-0 again")
    before = len(sidecar.log.read_text().splitlines())
    kubelet.set(hang=True)
    sidecar.batch_where(lambda p: pod_of(p) is None, "the stale answer dropped while it hangs")
    for n in range(3):
        sidecar.batch_where(lambda p: ("hw.power", GPU0) in p, f"batch {n} while it hangs")
    during = [
        json.loads(line)
        for line in sidecar.log.read_text().splitlines()[before:]
        if line.startswith("{")
    ]
    kubelet.set(hang=False)
    sidecar.batch_where(lambda p: pod_of(p) == "train-0", "attribution back once it answers")

    # one episode: one stale warning; the deadline logged at WARNING once, then at DEBUG
    assert sum("older than 3 s" in r["@message"] for r in during) == 1
    deadline = [r["@level"] for r in during if "no answer within 1 s" in r["@message"]]
    kinds = [
        (r["@level"], r["@message"][:80]) for r in during if "gpumetrics.kubernetes" in r["@module"]
    ]
    assert deadline[:1] == ["warn"] and set(deadline[1:]) <= {"debug"}, kinds
