"""The sidecar configuration the chart renders (deploy/manifests/) is one the sidecar accepts,
and it points at what the DaemonSet mounts. (The Collector's configuration is run for real by
tests/e2e/test_helm.py; every object's Kubernetes schema by tests/kubernetes/manifests.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from gpumetrics.config import load_config

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "manifests"
FILES = sorted(p.name for p in MANIFESTS.glob("*.yaml"))


def objects(name):
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def test_the_three_rendered_manifests_are_here():
    assert FILES == ["gpumetrics-gateway.yaml", "gpumetrics-subprocess.yaml", "gpumetrics.yaml"]


@pytest.mark.parametrize("name", FILES)
def test_rendered_sidecar_config_loads_and_matches_the_pod(name, tmp_path):
    objs = objects(name)
    config_map = next(
        o for o in objs if o["kind"] == "ConfigMap" and "gpumetrics.yaml" in o["data"]
    )
    path = tmp_path / "gpumetrics.yaml"
    path.write_text(config_map["data"]["gpumetrics.yaml"])
    config = load_config(str(path), environ={})  # raises ConfigError naming any bad setting

    spec = next(o for o in objs if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    reader = next(
        c for c in spec["containers"]
        if any(e["name"] == "NVIDIA_VISIBLE_DEVICES" for e in c.get("env", []))
    )  # fmt: skip
    mounts = {m["mountPath"] for m in reader["volumeMounts"]}
    k8s = config.kubernetes
    assert k8s.pod_attribution is True
    assert str(Path(k8s.pod_resources_socket).parent) in mounts
    assert config.identity.in_kubernetes is True
    assert config.server.health_listen is not None
    port = int(config.server.health_listen.rsplit(":", 1)[1])
    assert port in {p["containerPort"] for p in reader["ports"]}
    assert spec.get("hostPID") is True  # the defaults: per-process metrics through hostPID
    for listen in config.server.listen:
        if listen.startswith("unix:"):
            socket_dir = str(Path(listen.removeprefix("unix://")).parent)
            assert all(
                socket_dir in {m["mountPath"] for m in c["volumeMounts"]}
                for c in spec["containers"]
            ), "both containers must mount the sidecar's socket directory"
            assert config.server.unix_socket_mode == 0o660
            collector = next(c for c in spec["containers"] if c["name"] == "otelcol")
            assert (
                str(collector["securityContext"]["runAsGroup"]) == config.server.unix_socket_group
            )


@pytest.mark.parametrize("name", FILES)
def test_the_durable_store_is_on_a_host_path_the_sidecar_mounts(name, tmp_path):
    """store.path is set and mounted from a hostPath, so the sidecar's unacknowledged batches
    survive a new pod on the node (a DaemonSet rollout), not only a container restart."""
    objs = objects(name)
    config_map = next(
        o for o in objs if o["kind"] == "ConfigMap" and "gpumetrics.yaml" in o["data"]
    )
    path = tmp_path / "gpumetrics.yaml"
    path.write_text(config_map["data"]["gpumetrics.yaml"])
    store_path = load_config(str(path), environ={}).store.path
    assert store_path == "/var/lib/gpumetrics"
    spec = next(o for o in objs if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    reader = next(
        c for c in spec["containers"]
        if any(e["name"] == "NVIDIA_VISIBLE_DEVICES" for e in c.get("env", []))
    )  # fmt: skip
    mount = next(m for m in reader["volumeMounts"] if m["mountPath"] == store_path)
    assert not mount.get("readOnly")
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"] == {
        "path": "/var/lib/gpumetrics/gpumetrics-gpumetrics",
        "type": "DirectoryOrCreate",
    }
    if reader["securityContext"]["runAsUser"] != 0:  # the kubelet's directory is root's
        init = {c["name"]: c for c in spec.get("initContainers", [])}["store-owner"]
        assert init["command"][:2] == ["chown", "-R"] and store_path in init["command"]
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
