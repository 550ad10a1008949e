"""nvidia.gpu.k8s.allocation on a node with many pods sharing GPUs (issue 23 item 5).

5,000 time-sliced pods on 8 GPUs, served by the fake kubelet (the upstream server): the
allocation points are recorded when they change and every ``allocation_interval_s``, never more
than ``max_allocation_points`` at once, and each condition is logged once per change.
"""

from __future__ import annotations

import logging

from gpumetrics.kubernetes import KubernetesSettings, PodAttribution
from gpumetrics.metrics.attribution import DeviceAnnotation
from gpumetrics.metrics.gpu import GPU
from gpumetrics.selftelemetry import Telemetry

from .fake import device, pod

GPUS = [GPU(uuid=f"GPU-{g:08x}-0000-4000-8000-000000000000", minor_number=g) for g in range(8)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def crowd(pods: int = 5000) -> list[dict]:
    """``pods`` pods, one time-slicing replica each, spread over the 8 GPUs."""
    return [
        pod(
            "ml",
            f"infer-{i}",
            {"main": [device("nvidia.com/gpu.shared", f"{GPUS[i % 8].uuid}::{i // 8}")]},
        )
        for i in range(pods)
    ]


def points(notes) -> int:
    return sum(len(n.allocations) for n in notes.values())


def messages(caplog, needle: str, level: int = logging.WARNING) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if needle in r.getMessage() and r.levelno == level
    ]


def test_a_crowded_node_records_allocations_on_change_and_at_the_cadence_only(fake_kubelet, caplog):
    kubelet = fake_kubelet(pods=crowd())
    clock, telemetry = Clock(), Telemetry()
    settings = KubernetesSettings(
        pod_attribution=True, pod_resources_socket=str(kubelet.socket), stale_after_s=3600
    )
    attr = PodAttribution(settings, telemetry, clock=clock)
    caplog.set_level(logging.DEBUG, "gpumetrics.kubernetes")
    try:
        recorded = []
        for second in range(125):  # two minutes of 1 s collection cycles, a refresh every 10 s
            if second % 10 == 0:
                assert attr.refresh()
            notes = attr.annotate(GPUS)
            recorded.append(points(notes))
            # the device points keep their attributes in every cycle
            assert dict(notes[GPUS[0].uuid].attributes)["nvidia.gpu.k8s.shared"] is True
            clock.now += 1
        # t=0 (first answer), t=60 and t=120 (the cadence); the same answer every 10 s is no
        # change; 4,096 kept ids (max_device_ids) cut to 1,024 points each time
        assert [i for i, n in enumerate(recorded) if n] == [0, 60, 120]
        assert {n for n in recorded if n} == {1024}
        cut = telemetry.value("gpumetrics.kubernetes.allocation_points", {"outcome": "cut"})
        assert cut == 3 * (4096 - 1024)
        # the cut keeps every GPU's first holders: 128 per GPU
        notes = attr.annotate(GPUS)  # t=125: not due
        assert points(notes) == 0
        # a pod leaves: recorded in the very next cycle
        kubelet.set(pods=crowd()[1:])
        assert attr.refresh()
        assert points(attr.annotate(GPUS)) == 1024
        assert points(attr.annotate(GPUS)) == 0
        # logged once per condition, not at every refresh (13 refreshes above)
        assert len(messages(caplog, "past kubernetes.max_device_ids")) == 1
        assert len(messages(caplog, "allocation points cut")) == 1
    finally:
        attr.stop()


def test_the_cut_is_spread_over_the_gpus():
    from gpumetrics.kubernetes.emission import cut_allocations

    holders = tuple(((("k8s.pod.name", f"p{i}"),), 1) for i in range(10))
    notes = {"a": DeviceAnnotation((), holders), "b": DeviceAnnotation((), holders[:2])}
    kept, cut = cut_allocations(notes, ["a", "b"], 5)
    assert (len(kept["a"].allocations), len(kept["b"].allocations), cut) == (3, 2, 7)
    assert kept["a"].allocations == holders[:3]  # the first holders, in their order
    assert cut_allocations(notes, ["a", "b"], 12) == (notes, 0)


def test_interval_zero_records_every_cycle_and_a_change_is_recorded_at_once():
    from gpumetrics.kubernetes.emission import AllocationEmitter

    clock = Clock()
    emitter = AllocationEmitter(0.0, 100, clock)
    notes = {"a": DeviceAnnotation((), (((("k8s.pod.name", "p"),), 1),))}
    assert [emitter.pick(notes, ["a"]).recorded for _ in range(3)] == [1, 1, 1]
    emitter = AllocationEmitter(60.0, 100, clock)
    assert emitter.pick(notes, ["a"]).recorded == 1
    assert emitter.pick(dict(notes), ["a"]).recorded == 0  # a new object, the same content
    changed = {"a": DeviceAnnotation((), (((("k8s.pod.name", "q"),), 1),))}
    assert emitter.pick(changed, ["a"]).recorded == 1
    clock.now += 59.9
    assert emitter.pick(changed, ["a"]).recorded == 0
    clock.now += 0.1
    assert emitter.pick(changed, ["a"]).recorded == 1


def test_a_world_writable_socket_is_warned_about_once(fake_kubelet, caplog):
    kubelet = fake_kubelet(pods=[], socket_mode="0666")
    settings = KubernetesSettings(pod_attribution=True, pod_resources_socket=str(kubelet.socket))
    attr = PodAttribution(settings, Telemetry(), clock=Clock())
    caplog.set_level(logging.INFO, "gpumetrics.kubernetes")
    try:
        assert attr.refresh() and attr.refresh() and attr.refresh()
        (warning,) = messages(caplog, "world-writable")
        assert str(kubelet.socket) in warning and "mode 0666" in warning
    finally:
        attr.stop()


def test_a_socket_only_root_may_use_is_not_warned_about(fake_kubelet, caplog):
    kubelet = fake_kubelet(pods=[], socket_mode="0660")
    settings = KubernetesSettings(pod_attribution=True, pod_resources_socket=str(kubelet.socket))
    attr = PodAttribution(settings, Telemetry(), clock=Clock())
    caplog.set_level(logging.INFO, "gpumetrics.kubernetes")
    try:
        assert attr.refresh()
        assert not messages(caplog, "world-writable")
    finally:
        attr.stop()
