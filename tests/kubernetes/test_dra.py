"""GPUs allocated through DRA claims (issue 28 item 8b).

The kubelet's side is the fake kubelet (the upstream generated server, upstream types for the
``dynamic_resources`` it sends); the API server's side is the fake kubelet's HTTPS endpoint,
serving ResourceSlices decoded strictly into ``k8s.io/api/resource/v1``: a slice list recorded
on a real cluster with NVIDIA's DRA driver (``testdata/resourceslices/vks-v1.36-a100.yaml``)
and a MIG node written from the driver's device description (``mig-node.yaml``).
"""

from __future__ import annotations

import logging

import pytest
from gpumetrics.kubernetes import DRASettings, KubernetesSettings, PodAttribution
from gpumetrics.kubernetes.dra import ClaimDevice, index_resource_slices
from gpumetrics.metrics.gpu import GPU
from gpumetrics.selftelemetry import Telemetry
from pydantic import ValidationError

from .fake import TESTDATA, FakeKubelet, claim, pod

NODE = "conformance-test-np1-qcqc8-bpdtl-wv2gs"  # the recorded cluster's second GPU node
OTHER_NODE = "conformance-test-np1-qcqc8-bpdtl-rcj8j"
GPU_HERE = "GPU-44d2411e-1604-478f-aa96-5a3c00000000"  # its gpu-0, per the recorded slice
GPU_THERE = "GPU-0b580e61-4daa-462a-95e3-84dd00000000"  # gpu-0 of the other node
RECORDED = TESTDATA / "resourceslices" / "vks-v1.36-a100.yaml"
MIG_NODE = TESTDATA / "resourceslices" / "mig-node.yaml"
MIG_PARENT = "GPU-7a1c3e5f-0b2d-4f6a-8c9e-1d3b5f7a9c0e"
MIG_3G = "MIG-5c4a9e0b-2f6d-5b8e-9a1c-3d7e6f0a4b21"

# The recorded cluster's workload: one container, one claim of one gpu.nvidia.com device.
WORKLOAD = pod(
    "gpu-test1",
    "dra-gpu-example-798fccd4d-sfl2p",
    {"ctr": []},
    {
        "ctr": [
            claim(
                "gpu-test1",
                "dra-gpu-example-798fccd4d-sfl2p-single-gpu-d2jzk",
                ("gpu.nvidia.com", NODE, "gpu-0"),
            )
        ]
    },
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def warnings(caplog, needle: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if needle in r.getMessage() and r.levelno == logging.WARNING
    ]


def attribution(
    kubelet: FakeKubelet, node: str = NODE, clock: Clock | None = None, **dra
) -> tuple[PodAttribution, Telemetry]:
    token = kubelet.directory / "token"
    token.write_text(kubelet.token + "\n")
    if dra.get("resource_slices"):
        dra.setdefault("api_server", kubelet.api_url)
        dra.setdefault("ca_file", str(kubelet.ca_file))
        dra.setdefault("token_file", str(token))
    settings = KubernetesSettings(
        pod_attribution=True,
        pod_resources_socket=str(kubelet.socket),
        dra=DRASettings(**dra),
    )
    telemetry = Telemetry()
    return PodAttribution(settings, telemetry, clock=clock or Clock(), node_name=node), telemetry


def test_the_client_decodes_dynamic_resources_from_the_upstream_server(fake_kubelet):
    from gpumetrics.kubernetes import PodResourcesClient

    kubelet = fake_kubelet(pods=[WORKLOAD])
    client = PodResourcesClient(str(kubelet.socket), 5.0, 1 << 20)
    try:
        (container,) = client.list().pod_resources[0].containers
    finally:
        client.close()
    (dynamic,) = container.dynamic_resources
    assert (dynamic.claim_namespace, dynamic.claim_name) == (
        "gpu-test1",
        "dra-gpu-example-798fccd4d-sfl2p-single-gpu-d2jzk",
    )
    (resource,) = dynamic.claim_resources
    assert (resource.driver_name, resource.pool_name, resource.device_name) == (
        "gpu.nvidia.com",
        NODE,
        "gpu-0",
    )
    assert [c.name for c in resource.cdi_devices] == [
        "k8s.gpu.nvidia.com/claim=dra-gpu-example-798fccd4d-sfl2p-single-gpu-d2jzk-gpu-0"
    ]
    assert not resource.HasField("share_id")


def test_without_resource_slices_a_dra_gpu_is_counted_and_logged_once(fake_kubelet, caplog):
    kubelet = fake_kubelet(pods=[WORKLOAD])
    attr, telemetry = attribution(kubelet)
    caplog.set_level(logging.INFO, "gpumetrics.kubernetes")
    try:
        for _ in range(3):
            assert attr.refresh()
            assert attr.annotate([GPU(uuid=GPU_HERE, minor_number=0)]) == {}
        (warning,) = warnings(caplog, "allocated through DRA claims are not attributed")
        assert f"gpu.nvidia.com/{NODE}/gpu-0" in warning
        assert "gpu-test1/dra-gpu-example-798fccd4d-sfl2p-single-gpu-d2jzk" in warning
        assert "kubernetes.dra.resource_slices: true" in warning
        assert telemetry.value("gpumetrics.kubernetes.dra_devices", {"state": "unattributed"}) == 1
        kubelet.set(pods=[])  # the pod went away: the condition ends, said once
        assert attr.refresh()
        attr.annotate([GPU(uuid=GPU_HERE, minor_number=0)])
        assert [r for r in caplog.records if "every DRA claim device is attributed" in r.message]
    finally:
        attr.stop()


def test_the_recorded_resource_slices_attribute_the_claimed_gpu(fake_kubelet, caplog):
    kubelet = fake_kubelet(pods=[WORKLOAD], api_server=True)
    kubelet.set(resource_slices_file=str(RECORDED))
    attr, telemetry = attribution(kubelet, resource_slices=True)
    caplog.set_level(logging.INFO, "gpumetrics.kubernetes")
    try:
        assert attr.refresh()
        gpus = [GPU(uuid=GPU_HERE, minor_number=0), GPU(uuid=GPU_THERE, minor_number=1)]
        notes = attr.annotate(gpus)
        assert dict(notes[GPU_HERE].attributes) == {
            "k8s.namespace.name": "gpu-test1",
            "k8s.pod.name": "dra-gpu-example-798fccd4d-sfl2p",
            "k8s.container.name": "ctr",
        }
        # the other node's gpu-0 is another GPU: only this node's slices were read
        assert GPU_THERE not in notes
        ((attrs, ids),) = notes[GPU_HERE].allocations
        assert dict(attrs)["nvidia.gpu.k8s.resource_name"] == "gpu.nvidia.com" and ids == 1
        assert telemetry.value("gpumetrics.kubernetes.dra_devices", {"state": "attributed"}) == 1
        assert telemetry.value("gpumetrics.kubernetes.resource_slice_reads", {"outcome": "ok"}) == 1
        assert not warnings(caplog, "not attributed")
        assert attr.refresh()  # not due again: no second read within dra.refresh_interval_s
        assert telemetry.value("gpumetrics.kubernetes.resource_slice_reads", {"outcome": "ok"}) == 1
    finally:
        attr.stop()


def test_a_mig_device_of_a_claim_is_its_mig_instance(fake_kubelet):
    mig_pod = pod(
        "ml",
        "finetune-0",
        {"trainer": []},
        {
            "trainer": [
                claim("ml", "mig-claim", ("gpu.nvidia.com", "gpu-node-7", "gpu-0-mig-9-0-4"))
            ]
        },
    )
    kubelet = fake_kubelet(pods=[mig_pod], api_server=True)
    kubelet.set(resource_slices_file=str(MIG_NODE))
    attr, _ = attribution(kubelet, node="gpu-node-7", resource_slices=True)
    try:
        assert attr.refresh()
        gpus = [
            GPU(uuid=MIG_PARENT, minor_number=0),
            GPU(uuid=MIG_3G, parent_uuid=MIG_PARENT, gpu_instance_id=2, compute_instance_id=0),
        ]
        notes = attr.annotate(gpus)
        assert dict(notes[MIG_3G].attributes)["k8s.pod.name"] == "finetune-0"
        assert dict(notes[MIG_PARENT].attributes)["k8s.pod.name"] == "finetune-0"  # the board
        assert notes[MIG_PARENT].allocations == ()
    finally:
        attr.stop()


def test_an_api_server_serving_only_v1beta2_is_read_too(fake_kubelet):
    kubelet = fake_kubelet(pods=[WORKLOAD], api_server=True)
    kubelet.set(resource_slices_file=str(RECORDED), resource_slice_versions=["v1beta2"])
    attr, _ = attribution(kubelet, resource_slices=True)
    try:
        assert attr.refresh()
        assert GPU_HERE in attr.annotate([GPU(uuid=GPU_HERE)])
    finally:
        attr.stop()


def test_missing_rbac_is_logged_once_and_the_claim_stays_unattributed(fake_kubelet, caplog):
    kubelet = fake_kubelet(pods=[WORKLOAD], api_server=True)
    kubelet.set(resource_slices_file=str(RECORDED), forbidden=True)
    clock = Clock()
    attr, telemetry = attribution(kubelet, clock=clock, resource_slices=True, refresh_interval_s=10)
    caplog.set_level(logging.INFO, "gpumetrics.kubernetes")
    try:
        for _ in range(3):
            assert attr.refresh()  # the kubelet answered; only the slices are missing
            assert attr.annotate([GPU(uuid=GPU_HERE)]) == {}
            clock.now += 10  # each refresh may read again (a claim device is unknown)
        (warning,) = warnings(caplog, "reading ResourceSlices")
        assert "403" in warning and "cannot list resource" in warning
        assert "podAttribution.dra.resourceSlices=true" in warning
        reads = telemetry.value(
            "gpumetrics.kubernetes.resource_slice_reads", {"outcome": "forbidden"}
        )
        assert reads == 3
        (unattributed,) = warnings(caplog, "not attributed")  # reported once, with the cause
        assert "could not be read" in unattributed
        kubelet.set(forbidden=False)  # the RBAC was added
        assert attr.refresh()
        assert GPU_HERE in attr.annotate([GPU(uuid=GPU_HERE)])
    finally:
        attr.stop()


def test_a_wrong_token_is_forbidden_naming_the_rbac(fake_kubelet, caplog):
    kubelet = fake_kubelet(pods=[WORKLOAD], api_server=True)
    kubelet.set(resource_slices_file=str(RECORDED), token="another-token")
    attr, telemetry = attribution(kubelet, resource_slices=True)
    caplog.set_level(logging.WARNING, "gpumetrics.kubernetes")
    try:
        assert attr.refresh()
        (warning,) = warnings(caplog, "reading ResourceSlices")
        assert "401" in warning
    finally:
        attr.stop()


def test_index_reads_every_shape_of_the_api():
    device = {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}}}
    v1 = {"spec": {"driver": "gpu.nvidia.com", "pool": {"name": "n"}, "devices": [device]}}
    v1beta1 = {
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "n"},
            "devices": [
                {
                    "name": "gpu-1",
                    "basic": {"attributes": {"gpu.nvidia.com/uuid": {"string": "GPU-b"}}},
                }
            ],
        }
    }
    other = {"spec": {"driver": "nic.example.com", "pool": {"name": "n"}, "devices": [device]}}
    no_uuid = {
        "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "n"}, "devices": [{"name": "x"}]}
    }
    index = index_resource_slices({"items": [v1, v1beta1, other, no_uuid]}, ["gpu.nvidia.com"])
    assert index == {
        ClaimDevice("gpu.nvidia.com", "n", "gpu-0"): "GPU-a",
        ClaimDevice("gpu.nvidia.com", "n", "gpu-1"): "GPU-b",
    }
    with pytest.raises(ValueError, match="not a ResourceSliceList"):
        index_resource_slices({"kind": "Status"}, ["gpu.nvidia.com"])


def test_the_api_server_must_be_https():
    with pytest.raises(ValidationError, match="https://"):
        DRASettings(api_server="http://10.0.0.1:6443")
