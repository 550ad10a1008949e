"""The pod-resources client against the upstream generated server (the fake kubelet)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import grpc
import pytest
from gpumetrics.kubernetes import Failure, PodResourcesClient, PodResourcesError

from .fake import device, pod

GPU0 = "GPU-00000000-0000-4000-8000-000000000000"


def client(kubelet, timeout_s=5.0, max_bytes=1 << 20):
    return PodResourcesClient(str(kubelet.socket), timeout_s, max_bytes)


def test_list_decodes_the_upstream_answer_and_skips_fields_it_does_not_define(fake_kubelet):
    """Devices and DRA claims are decoded; CPU ids, memory and topology are skipped."""
    train = pod("ml", "train-0", {"trainer": [device("nvidia.com/gpu", GPU0)]})
    # Fields the sidecar's .proto leaves out: topology, cpu_ids, memory.
    train["containers"][0]["devices"][0]["topology"] = {"nodes": [{"ID": 1}]}
    train["containers"][0]["cpu_ids"] = [4, 5]
    train["containers"][0]["memory"] = [{"memory_type": "memory", "size": 1 << 30}]
    train["containers"][0]["dynamic_resources"] = [
        {
            "claim_name": "gpu-claim",
            "claim_namespace": "ml",
            "claim_resources": [
                {
                    "driver_name": "gpu.nvidia.com",
                    "pool_name": "node-1",
                    "device_name": "gpu-0",
                    "cdi_devices": [{"name": "nvidia.com/gpu=0"}],
                }
            ],
        }
    ]
    train["containers"].append({"name": "sidecar", "devices": []})
    kubelet = fake_kubelet(
        pods=[train, pod("kube-system", "dns", {"coredns": []})],
        allocatable=[device("nvidia.com/gpu", GPU0, "GPU-1"), device("example.com/nic", "eth1")],
    )
    c = client(kubelet)
    try:
        listing = c.list()
        allocatable = c.allocatable()
    finally:
        c.close()
    assert [(p.namespace, p.name) for p in listing.pod_resources] == [
        ("ml", "train-0"),
        ("kube-system", "dns"),
    ]
    trainer, sidecar = listing.pod_resources[0].containers
    assert (trainer.name, sidecar.name) == ("trainer", "sidecar")
    assert [(d.resource_name, list(d.device_ids)) for d in trainer.devices] == [
        ("nvidia.com/gpu", [GPU0])
    ]
    assert list(sidecar.devices) == []
    ((claim_name, driver, device_name),) = [
        (d.claim_name, r.driver_name, r.device_name)
        for d in trainer.dynamic_resources
        for r in d.claim_resources
    ]
    assert (claim_name, driver, device_name) == ("gpu-claim", "gpu.nvidia.com", "gpu-0")
    assert [(d.resource_name, list(d.device_ids)) for d in allocatable.devices] == [
        ("nvidia.com/gpu", [GPU0, "GPU-1"]),
        ("example.com/nic", ["eth1"]),
    ]


def test_missing_socket_says_to_mount_the_directory(short_dir):
    c = PodResourcesClient(str(short_dir / "absent" / "kubelet.sock"), 2.0, 1 << 20)
    with pytest.raises(PodResourcesError) as err:
        c.list()
    assert err.value.kind is Failure.SOCKET_MISSING
    assert "does not exist" in str(err.value) and "/var/lib/kubelet/pod-resources" in str(err.value)


def test_a_socket_nobody_listens_on_is_unavailable(short_dir):
    import socket

    path = short_dir / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # the file stays, nobody listens: what a kubelet restart leaves for a moment
    with pytest.raises(PodResourcesError) as err:
        PodResourcesClient(str(path), 2.0, 1 << 20).list()
    assert err.value.kind is Failure.UNAVAILABLE


PERMISSION_CHILD = """
import os, sys
from gpumetrics.kubernetes import PodResourcesClient, PodResourcesError
try:  # the whole call path once as root, so that grpc's lazy imports are done too
    PodResourcesClient("/nonexistent/kubelet.sock", 5.0, 1 << 20).list()
except PodResourcesError:
    pass
os.setgroups([]); os.setgid(65534); os.setuid(65534)  # after the imports: nobody may not read them
try:
    PodResourcesClient(sys.argv[1], 5.0, 1 << 20).list()
except PodResourcesError as err:
    print(err.kind.value); print(err)
else:
    print("ok")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the client as another user")
def test_a_socket_owned_by_root_is_permission_denied_for_another_user(fake_kubelet):
    kubelet = fake_kubelet(pods=[], socket_mode="0660")
    os.chmod(kubelet.directory, 0o755)
    os.chmod(kubelet.directory.parent, 0o755)
    done = subprocess.run(
        [sys.executable, "-c", PERMISSION_CHILD, str(kubelet.socket)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    kind, message = done.stdout.splitlines()[:2]
    assert kind == "permission_denied"
    assert "permission denied" in message and "uid 0" in message


ROOT_CHILD = """
import sys
from gpumetrics.kubernetes import PodResourcesClient, PodResourcesError
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
assert not int(status["CapEff"], 16) >> 1 & 1, "CAP_DAC_OVERRIDE (bit 1) was not dropped"
try:
    PodResourcesClient(sys.argv[1], 5.0, 1 << 20).list()
except PodResourcesError as err:
    print(err.kind.value); print(err)
else:
    print("ok")
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv (util-linux) to drop capabilities",
)
def test_root_without_the_capability_is_told_what_it_lacks_not_to_run_as_uid_0(fake_kubelet):
    """As the chart runs it (uid 0, every capability dropped), a socket that is not root's
    (a user namespace shows the host's root as 65534) is refused: the hint names the socket's
    owner and mode and CAP_DAC_OVERRIDE, not "run as uid 0" (issue 28 item 8c)."""
    kubelet = fake_kubelet(pods=[], socket_mode="0600")
    os.chown(kubelet.socket, 65534, 65534)
    done = subprocess.run(
        [
            "setpriv",
            "--bounding-set=-dac_override,-dac_read_search",
            "--inh-caps=-all",
            "--",
            sys.executable,
            "-c",
            ROOT_CHILD,
            str(kubelet.socket),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    kind, message = done.stdout.splitlines()[:2]
    assert kind == "permission_denied"
    assert "run the sidecar as uid 0" not in message
    assert "runs as uid 0" in message and "CAP_DAC_OVERRIDE" in message
    assert "mode 0600, owner uid 65534 gid 65534" in message
    assert "supplementalGroups: [65534]" in message


@pytest.mark.parametrize(
    ("mode", "owner", "caps", "wanted"),
    [
        (0o600, 0, 0, "lets uid 0 connect, so the refusal comes from a directory"),
        (0o400, 0, 0, "gives the owner no write permission"),
        (0o600, 65534, 0, "is not uid 0's"),
        (0o600, 0, 1 << 1, "with CAP_DAC_OVERRIDE, so the refusal comes from a security module"),
    ],
)
def test_the_root_hint_follows_the_socket_and_the_capabilities(tmp_path, mode, owner, caps, wanted):
    from gpumetrics.kubernetes.client import permission_hint

    path = tmp_path / "kubelet.sock"
    path.write_text("")
    path.chmod(mode)
    if owner and os.geteuid() == 0:
        os.chown(path, owner, owner)
    elif owner:
        pytest.skip("needs root to give the file another owner")
    hint = permission_hint(str(path), euid=0, caps=caps)
    assert wanted in hint
    assert "run the sidecar as uid 0" not in hint
    other = permission_hint(str(path), euid=1000, caps=0)
    assert other.startswith("the kubelet's socket is root's: run the sidecar as uid 0")


def test_a_hanging_kubelet_ends_at_the_deadline(fake_kubelet):
    kubelet = fake_kubelet(pods=[])
    kubelet.set(hang=True)
    with pytest.raises(PodResourcesError) as err:
        client(kubelet, timeout_s=0.5).list()
    assert err.value.kind is Failure.DEADLINE_EXCEEDED
    assert "kubernetes.timeout_s" in str(err.value)


def test_an_answer_over_the_limit_is_refused_naming_the_setting(fake_kubelet):
    many = [
        pod("ml", f"p{i}", {"c": [device("nvidia.com/gpu", f"GPU-{i:08d}")]}) for i in range(400)
    ]
    kubelet = fake_kubelet(pods=many)
    with pytest.raises(PodResourcesError) as err:
        client(kubelet, max_bytes=4096).list()
    assert err.value.kind is Failure.RESPONSE_TOO_LARGE
    assert "kubernetes.max_response_bytes" in str(err.value)


@pytest.mark.parametrize(
    ("code", "kind"),
    [(12, Failure.UNIMPLEMENTED), (8, Failure.RATE_LIMITED), (13, Failure.ERROR)],
)
def test_status_codes_are_classified(fake_kubelet, code, kind):
    kubelet = fake_kubelet(pods=[])
    kubelet.set(error_code=code)
    with pytest.raises(PodResourcesError) as err:
        client(kubelet).list()
    assert err.value.kind is kind


def test_allocatable_unimplemented_on_old_kubelets(fake_kubelet):
    kubelet = fake_kubelet(pods=[])
    kubelet.set(allocatable_unimplemented=True)
    c = client(kubelet)
    assert list(c.list().pod_resources) == []
    with pytest.raises(PodResourcesError) as err:
        c.allocatable()
    assert err.value.kind is Failure.UNIMPLEMENTED


class _Cancelled(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED

    def details(self) -> str:
        return "Stream removed (RST_STREAM (Received RST_STREAM with error code 8))"


@pytest.mark.parametrize(
    ("took_s", "kind"), [(4.9, Failure.DEADLINE_EXCEEDED), (1.0, Failure.ERROR)]
)
def test_a_reset_at_the_deadline_is_the_deadline(took_s, kind):
    """A hung grpc-go kubelet resets the stream (RST_STREAM CANCEL) when the deadline we sent
    passes, which can reach grpcio just before its own deadline fires: CANCELLED then, seen on
    a loaded machine. At (nearly) the whole deadline it is classified as the deadline; earlier,
    a cancellation stays an error."""
    c = PodResourcesClient("/nonexistent/kubelet.sock", 5.0, 1 << 20)
    err = c._classify("List", _Cancelled(), took_s)  # noqa: SLF001
    assert err.kind is kind
    if kind is Failure.DEADLINE_EXCEEDED:
        assert "no answer within 5 s (kubernetes.timeout_s)" in str(err)
