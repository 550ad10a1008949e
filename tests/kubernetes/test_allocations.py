"""Device ids → holders → device attributes: the pure part of pod attribution."""

from __future__ import annotations

import pytest
from gpumetrics.kubernetes import (
    GPUIdType,
    Grant,
    Holder,
    KubernetesSettings,
    build_allocations,
    device_attributes,
    parse_device_id,
)
from gpumetrics.kubernetes.podresources.v1 import podresources_pb2 as pr
from gpumetrics.metrics.gpu import GPU

A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
MIG = "MIG-cccccccc-0000-5000-8000-000000000000"


@pytest.mark.parametrize(
    ("device_id", "id_type", "key"),
    [
        (A, GPUIdType.AUTO, ("uuid", A)),
        (A + "::3", GPUIdType.AUTO, ("uuid", A)),  # time-slicing / MPS replica
        (MIG, GPUIdType.UUID, ("uuid", MIG)),
        (MIG + "::7", GPUIdType.UUID, ("uuid", MIG)),  # EKS MIG replicas
        # the older MIG form (R450/R460 drivers, older device plugins): parent GPU, GI, CI
        ("MIG-" + A + "/1/0", GPUIdType.AUTO, ("mig", A, 1, 0)),
        ("MIG-" + A + "/13/2::4", GPUIdType.UUID, ("mig", A, 13, 2)),
        ("MIG-" + A + "/1/0", GPUIdType.DEVICE_NAME, None),
        ("nvidia0", GPUIdType.AUTO, ("minor", 0)),
        ("nvidia12/vgpu3", GPUIdType.DEVICE_NAME, ("minor", 12)),
        ("nvidia1/gi5", GPUIdType.AUTO, ("gi", 1, 5)),
        ("nvidia1/gi5/vgpu0", GPUIdType.AUTO, ("gi", 1, 5)),
        ("nvidia0", GPUIdType.UUID, None),
        (A, GPUIdType.DEVICE_NAME, None),
        ("0", GPUIdType.AUTO, None),
        ("GPU-", GPUIdType.AUTO, None),
        ("gpu-0", GPUIdType.AUTO, None),  # a DRA device name is not a device-plugin id
        ("nvidia0/gi", GPUIdType.AUTO, None),
        (A + "::x", GPUIdType.AUTO, None),
    ],
)
def test_parse_device_id(device_id, id_type, key):
    assert parse_device_id(device_id, id_type) == key


def h(ns, pod, container="main"):
    return Holder(ns, pod, container)


@pytest.mark.parametrize(
    ("holders", "expected"),
    [
        ([], ()),
        (
            [h("ml", "train-0", "trainer")],
            (
                ("k8s.namespace.name", "ml"),
                ("k8s.pod.name", "train-0"),
                ("k8s.container.name", "trainer"),
            ),
        ),
        # two containers of one pod: the pod is common, the container is not
        (
            [h("ml", "p", "a"), h("ml", "p", "b")],
            (("k8s.namespace.name", "ml"), ("k8s.pod.name", "p"), ("nvidia.gpu.k8s.shared", True)),
        ),
        # two pods of one namespace
        (
            [h("ml", "a"), h("ml", "b")],
            (("k8s.namespace.name", "ml"), ("nvidia.gpu.k8s.shared", True)),
        ),
        # pods of two namespaces: nothing in common, never one of them picked
        ([h("ml", "a"), h("web", "a")], (("nvidia.gpu.k8s.shared", True),)),
    ],
)
def test_attribute_rule(holders, expected):
    grants = [Grant(x, "nvidia.com/gpu") for x in holders]
    assert device_attributes(grants) == expected
    assert device_attributes(reversed(grants)) == expected  # order of the answer does not matter


def listing(*pods):
    out = pr.ListPodResourcesResponse()
    for ns, name, containers in pods:
        p = out.pod_resources.add(namespace=ns, name=name)
        for cname, devices in containers.items():
            c = p.containers.add(name=cname)
            for resource, ids in devices:
                c.devices.add(resource_name=resource, device_ids=ids)
    return out


def test_build_keeps_gpu_resources_only_and_counts_what_it_cannot_use():
    settings = KubernetesSettings(max_device_ids=3)
    got = build_allocations(
        listing(
            ("ml", "a", {"c": [("nvidia.com/gpu", [A]), ("example.com/nic", ["eth0", A])]}),
            ("ml", "b", {"c": [("nvidia.com/gpu.shared", [B + "::0", B + "::1", "weird"])]}),
            ("", "c", {"c": [("nvidia.com/gpu", ["nvidia4"])]}),  # no namespace: not a pod name
            ("ml", "d", {"c": [("nvidia.com/gpu", ["nvidia5", "nvidia6"])]}),
        ),
        None,
        settings,
    )
    assert got.grants == {
        ("uuid", A): (Grant(h("ml", "a", "c"), "nvidia.com/gpu", 1),),
        ("uuid", B): (Grant(h("ml", "b", "c"), "nvidia.com/gpu.shared", 2),),
    }
    assert got.unrecognised == 2  # "weird", and the id of the pod without a namespace
    assert got.over_limit == 2  # nvidia5, nvidia6 past max_device_ids=3
    assert got.allocatable is None


def gpus():
    """Two whole GPUs (minors 0, 1) and a MIG GPU (minor 2) with instances in GI 1 and GI 5."""
    parent = "GPU-dddddddd-0000-4000-8000-000000000000"
    return [
        GPU(uuid=A, index=0, minor_number=0),
        GPU(uuid=B, index=1, minor_number=1),
        GPU(uuid=parent, index=2, minor_number=2),
        GPU(uuid=MIG, parent_uuid=parent, gpu_instance_id=1, compute_instance_id=0),
        GPU(uuid="MIG-eeee", parent_uuid=parent, gpu_instance_id=5, compute_instance_id=0),
    ]


def test_annotate_matches_both_id_kinds_and_mig_instances():
    allocations = build_allocations(
        listing(
            ("ml", "train", {"t": [("nvidia.com/gpu", ["nvidia0"])]}),  # GKE: by minor number
            ("ml", "mig-a", {"w": [("nvidia.com/mig-3g.20gb", [MIG])]}),  # by MIG UUID
            ("ml", "mig-b", {"w": [("nvidia.com/mig-1g.5gb", ["nvidia2/gi5"])]}),  # GKE MIG
            ("ml", "lost", {"w": [("nvidia.com/gpu", ["nvidia7"])]}),  # no such GPU here
        ),
        pr.AllocatableResourcesResponse(
            devices=[
                pr.ContainerDevices(
                    resource_name="nvidia.com/gpu", device_ids=["nvidia0", "nvidia9"]
                )
            ]
        ),
        KubernetesSettings(),
    )
    match = allocations.annotate(gpus())
    notes = match.annotations
    assert dict(notes[A].attributes) == {
        "k8s.namespace.name": "ml",
        "k8s.pod.name": "train",
        "k8s.container.name": "t",
    }
    assert B not in notes  # nobody holds it
    assert dict(notes[MIG].attributes)["k8s.pod.name"] == "mig-a"
    assert dict(notes["MIG-eeee"].attributes)["k8s.pod.name"] == "mig-b"
    # the MIG GPU's board values: held by two pods through its instances
    parent = notes["GPU-dddddddd-0000-4000-8000-000000000000"]
    assert parent.attributes == (("k8s.namespace.name", "ml"), ("nvidia.gpu.k8s.shared", True))
    assert parent.allocations == ()  # the instances are what was allocated
    assert notes[MIG].allocations == (
        (
            (
                ("k8s.namespace.name", "ml"),
                ("k8s.pod.name", "mig-a"),
                ("k8s.container.name", "w"),
                ("nvidia.gpu.k8s.resource_name", "nvidia.com/mig-3g.20gb"),
            ),
            1,
        ),
    )
    assert match.unmatched == {("minor", 7)}
    assert match.unmatched_allocatable == {("minor", 9)}


def test_a_shared_gpu_lists_every_holder_with_its_share():
    allocations = build_allocations(
        listing(
            ("ml", "infer-a", {"main": [("nvidia.com/gpu", [A + "::0"])]}),
            ("web", "infer-b", {"main": [("nvidia.com/gpu", [A + "::1", A + "::2"])]}),
        ),
        None,
        KubernetesSettings(),
    )
    note = allocations.annotate(gpus()).annotations[A]
    assert note.attributes == (("nvidia.gpu.k8s.shared", True),)
    assert [(dict(attrs)["k8s.pod.name"], n) for attrs, n in note.allocations] == [
        ("infer-a", 1),
        ("infer-b", 2),
    ]


def test_the_older_mig_form_matches_the_mig_device_nvml_reports():
    """``MIG-GPU-<uuid>/<gi>/<ci>`` names the MIG device of that GPU with that GPU instance and
    compute instance, whatever UUID NVML gives the MIG device (issue 28 item 8a)."""
    parent = "GPU-dddddddd-0000-4000-8000-000000000000"
    allocations = build_allocations(
        listing(
            ("ml", "mig-a", {"w": [("nvidia.com/mig-3g.20gb", [f"MIG-{parent}/1/0"])]}),
            ("ml", "mig-b", {"w": [("nvidia.com/mig-1g.5gb", [f"MIG-{parent}/5/0::1"])]}),
            ("ml", "gone", {"w": [("nvidia.com/mig-1g.5gb", [f"MIG-{parent}/9/0"])]}),
        ),
        None,
        KubernetesSettings(),
    )
    match = allocations.annotate(gpus())
    assert dict(match.annotations[MIG].attributes)["k8s.pod.name"] == "mig-a"
    assert dict(match.annotations["MIG-eeee"].attributes)["k8s.pod.name"] == "mig-b"
    parent_note = match.annotations[parent]
    assert dict(parent_note.attributes)["nvidia.gpu.k8s.shared"] is True
    assert match.unmatched == {("mig", parent, 9, 0)}  # no instance 9 on that GPU


def test_an_id_listed_for_two_containers_is_reported_as_stale():
    """A terminal pod's allocation beside the running pod that reuses the device (issue 28
    item 8c, kubernetes/kubernetes#119423): both stay holders, the id is reported."""
    allocations = build_allocations(
        listing(
            ("ml", "job-1-done", {"main": [("nvidia.com/gpu", [A])]}),
            ("ml", "job-2", {"main": [("nvidia.com/gpu", [A])]}),
            ("ml", "shared-a", {"main": [("nvidia.com/gpu", [B + "::0"])]}),
            ("ml", "shared-b", {"main": [("nvidia.com/gpu", [B + "::1"])]}),  # replicas: fine
        ),
        None,
        KubernetesSettings(),
    )
    assert allocations.stale == ((A, (h("ml", "job-1-done"), h("ml", "job-2"))),)
    note = allocations.annotate(gpus()).annotations[A]
    assert dict(note.attributes)["nvidia.gpu.k8s.shared"] is True
    assert [dict(a)["k8s.pod.name"] for a, _ in note.allocations] == ["job-1-done", "job-2"]


def test_docstring_examples():
    import doctest

    from gpumetrics.kubernetes import allocations, apiserver, emission

    result = doctest.testmod(allocations)
    assert result.attempted >= 6 and result.failed == 0
    for module in (apiserver, emission):
        result = doctest.testmod(module)
        assert result.attempted >= 1 and result.failed == 0
