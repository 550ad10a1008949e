"""PodAttribution: reads the fake kubelet, logs each failure kind once, drops stale answers."""

from __future__ import annotations

import logging

from gpumetrics.kubernetes import EMPTY, KubernetesSettings, PodAttribution
from gpumetrics.metrics.gpu import GPU
from gpumetrics.selftelemetry import Telemetry

from .fake import FakeKubelet, device, pod, poll

GPU0 = "GPU-00000000-0000-4000-8000-000000000000"
GPU1 = "GPU-11111111-1111-4111-8111-111111111111"
TRAIN = pod("ml", "train-0", {"trainer": [device("nvidia.com/gpu", GPU0)]})


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def attribution(socket, clock=None, **settings):
    telemetry = Telemetry()
    s = KubernetesSettings(pod_attribution=True, pod_resources_socket=str(socket), **settings)
    return PodAttribution(s, telemetry, clock=clock or Clock()), telemetry


def records(caplog, needle):
    return [r for r in caplog.records if needle in r.getMessage()]


def test_a_refresh_swaps_in_the_kubelets_answer(fake_kubelet, caplog):
    kubelet = fake_kubelet(pods=[TRAIN], allocatable=[device("nvidia.com/gpu", GPU0, GPU1)])
    attr, telemetry = attribution(kubelet.socket)
    caplog.set_level(logging.DEBUG, "gpumetrics.kubernetes")
    assert attr.snapshot() is EMPTY
    assert attr.refresh()
    notes = attr.annotate([GPU(uuid=GPU0, minor_number=0), GPU(uuid=GPU1, minor_number=1)])
    assert dict(notes[GPU0].attributes)["k8s.pod.name"] == "train-0"
    assert GPU1 not in notes
    assert telemetry.value("gpumetrics.kubernetes.refreshes", {"outcome": "ok"}) == 1
    assert telemetry.value("gpumetrics.kubernetes.device_ids", {"state": "matched"}) == 1
    assert len(records(caplog, "the kubelet answers")) == 1
    attr.stop()


def test_a_missing_socket_is_logged_once_then_the_kubelet_is_picked_up(short_dir, caplog):
    socket = short_dir / "k0" / "kubelet.sock"
    attr, telemetry = attribution(socket)
    caplog.set_level(logging.DEBUG, "gpumetrics.kubernetes")
    for _ in range(3):
        assert not attr.refresh()
    warnings = [r for r in records(caplog, "does not exist") if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "/var/lib/kubelet/pod-resources" in warnings[0].getMessage()
    assert telemetry.value("gpumetrics.kubernetes.refreshes", {"outcome": "socket_missing"}) == 3
    (short_dir / "k0").mkdir()
    kubelet = FakeKubelet(short_dir / "k0", pods=[TRAIN])
    try:
        assert attr.refresh()
        assert dict(attr.annotate([GPU(uuid=GPU0)])[GPU0].attributes)["k8s.container.name"] == (
            "trainer"
        )
        assert len(records(caplog, "the kubelet answers")) == 1
    finally:
        attr.stop()
        kubelet.close()


def test_an_answer_is_kept_through_failures_until_it_is_stale(fake_kubelet, caplog):
    kubelet = fake_kubelet(pods=[TRAIN])
    clock = Clock()
    attr, telemetry = attribution(kubelet.socket, clock, refresh_interval_s=10, stale_after_s=30)
    caplog.set_level(logging.DEBUG, "gpumetrics.kubernetes")
    assert attr.refresh()
    kubelet.set(error_code=14)  # UNAVAILABLE from the kubelet itself
    clock.now += 25
    assert not attr.refresh()
    assert attr.snapshot() is not EMPTY  # 25 s old: still used
    clock.now += 10
    assert attr.snapshot() is EMPTY  # 35 s old: a GPU may have changed hands meanwhile
    assert attr.annotate([GPU(uuid=GPU0)]) == {}
    assert attr.snapshot() is EMPTY
    assert len(records(caplog, "older than 30 s")) == 1
    kubelet.set(error_code=0)
    assert attr.refresh()
    assert attr.snapshot() is not EMPTY
    assert telemetry.value("gpumetrics.kubernetes.refreshes", {"outcome": "unavailable"}) == 1
    attr.stop()


def test_a_kubelet_without_get_allocatable_is_asked_once(fake_kubelet, caplog):
    kubelet = fake_kubelet(pods=[TRAIN])
    kubelet.set(allocatable_unimplemented=True)
    attr, _ = attribution(kubelet.socket)
    caplog.set_level(logging.INFO, "gpumetrics.kubernetes")
    assert attr.refresh() and attr.refresh()
    assert len(records(caplog, "has no GetAllocatableResources")) == 1
    assert dict(attr.annotate([GPU(uuid=GPU0)])[GPU0].attributes)["k8s.pod.name"] == "train-0"
    attr.stop()


def test_ids_that_match_no_gpu_are_reported_once_with_the_setting_to_check(fake_kubelet, caplog):
    kubelet = fake_kubelet(
        pods=[pod("ml", "x", {"c": [device("nvidia.com/gpu", "nvidia7")]})],
        allocatable=[device("nvidia.com/gpu", "nvidia7", "nvidia8")],
    )
    attr, telemetry = attribution(kubelet.socket)
    caplog.set_level(logging.INFO, "gpumetrics.kubernetes")
    assert attr.refresh()
    for _ in range(3):
        assert attr.annotate([GPU(uuid=GPU0, minor_number=0)]) == {}
    allocated = records(caplog, "allocated GPU device ids that match no GPU")
    assert len(allocated) == 1 and "nvidia7" in allocated[0].getMessage()
    assert "kubernetes.gpu_id_type" in allocated[0].getMessage()
    offered = records(caplog, "can allocate GPU device ids that match no GPU")
    assert len(offered) == 1 and "nvidia7, nvidia8" in offered[0].getMessage()
    assert telemetry.value("gpumetrics.kubernetes.device_ids", {"state": "unmatched"}) == 1
    attr.stop()


def test_the_refresher_thread_reads_on_its_own_and_stops(fake_kubelet):
    kubelet = fake_kubelet(pods=[TRAIN])
    attr, _ = attribution(kubelet.socket, clock=None, refresh_interval_s=0.1, stale_after_s=60)
    attr.start()
    try:
        poll(lambda: attr.snapshot() is not EMPTY, 30, "the first refresh")
        kubelet.set(pods=[])  # the pod went away
        poll(lambda: attr.snapshot().grants == {}, 30, "a refresh without the pod")
    finally:
        assert attr.stop(timeout_s=10)


def test_start_waits_for_the_first_read_at_most_the_given_time(fake_kubelet):
    kubelet = fake_kubelet(pods=[TRAIN])
    attr, _ = attribution(kubelet.socket, clock=None, refresh_interval_s=60, stale_after_s=120)
    try:
        assert attr.start(wait_first_s=30)
        assert attr.snapshot() is not EMPTY  # already read: the first batch carries pods
    finally:
        assert attr.stop(timeout_s=10)
    kubelet.set(hang=True)
    attr, _ = attribution(kubelet.socket, clock=None, timeout_s=5, stale_after_s=60)
    try:
        assert not attr.start(wait_first_s=0.2)  # a hanging kubelet holds start-up this long
        assert attr.snapshot() is EMPTY
    finally:
        attr.stop(timeout_s=10)


def test_an_ended_pods_allocation_beside_the_running_pod_is_logged_once(fake_kubelet, caplog):
    """The kubelet lists a Succeeded pod's GPU beside the running pod that reuses it
    (kubernetes/kubernetes#119423): both stay holders, and the stale allocation is logged once
    across refreshes (issue 28 item 8c)."""
    done = pod("ml", "job-1", {"main": [device("nvidia.com/gpu", GPU0)]})
    running = pod("ml", "job-2", {"main": [device("nvidia.com/gpu", GPU0)]})
    kubelet = fake_kubelet(pods=[done, running])
    attr, _ = attribution(kubelet.socket)
    caplog.set_level(logging.INFO, "gpumetrics.kubernetes")
    try:
        for _ in range(3):
            assert attr.refresh()
            notes = attr.annotate([GPU(uuid=GPU0, minor_number=0)])
            assert dict(notes[GPU0].attributes)["nvidia.gpu.k8s.shared"] is True
        stale = [
            r
            for r in records(caplog, "lists device ids for more than one container")
            if r.levelno == logging.WARNING
        ]
        assert len(stale) == 1
        assert f"{GPU0} held by ml/job-1/main and ml/job-2/main" in stale[0].getMessage()
        kubelet.set(pods=[running])  # the ended pod was deleted
        assert attr.refresh()
        attr.annotate([GPU(uuid=GPU0, minor_number=0)])
        assert len(records(caplog, "no device id is listed for more than one container")) == 1
    finally:
        attr.stop()
