"""The chart's rendered workloads (deploy/manifests/) as plain processes, as compose.py does for
docker-compose.yaml: there is no cluster here, so the test runs what a node would run.

A container's command line follows Kubernetes' rules over its image (built from the repository's
Dockerfiles; compose.py reads their ENTRYPOINT, CMD and ENV): ``command`` replaces ENTRYPOINT,
``args`` replaces CMD. Its environment is the image's ENV, then the container's ``env``
(``fieldRef`` values from the test's stand-ins for the node and the pod, ``$(VAR)`` expanded).
Volumes become directories: a ConfigMap's items are written from the rendered ConfigMap, an
emptyDir is one directory shared by the pod's containers, a hostPath is the test's stand-in
for that host path (the fake kubelet's directory for the pod-resources socket). Every container
path, container port and Service name in arguments, environment and ConfigMap files is mapped
onto this host (ports to free loopback ports, one set per pod). Nothing else is changed, except
what the test adds and says (the simulated driver).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .compose import image_spec
from .harness import REPO, free_port

MANIFESTS = REPO / "deploy" / "manifests"

# image repository -> (Dockerfile, target); a tag ending in -subprocess is collector/Dockerfile's
# otelcol-subprocess target.
IMAGES = {
    "gpumetrics": (REPO / "Dockerfile", None),
    "otelcol-gpumetrics": (REPO / "collector" / "Dockerfile", "otelcol"),
}
SUBPROCESS_TARGET = "otelcol-subprocess"
# Images not built from this repository: their entrypoint, from the upstream image.
UPSTREAM_ENTRYPOINTS = {"otel/opentelemetry-collector-contrib": ["/otelcol-contrib"]}


def load(name: str) -> list[dict[str, Any]]:
    """The objects of ``deploy/manifests/<name>``."""
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def find(objects: Sequence[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of ``kind`` (and ``name``)."""
    found = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects named {name!r}"
    return found[0]


@dataclass
class ContainerRun:
    """One container as a plain process, after host mapping."""

    name: str
    image: str
    argv: list[str]
    env: dict[str, str]
    ports: dict[str, int]  # port name -> local port
    probes: dict[str, dict[str, Any]]  # readiness / liveness -> the probe, with a local port


@dataclass
class PodMapping:
    """Container paths, ports and Service names of one pod mapped onto this host."""

    root: Path
    ports: dict[int, int] = field(default_factory=dict)  # container port -> local port
    paths: dict[str, Path] = field(default_factory=dict)  # mount path -> host directory
    remote: dict[str, str] = field(default_factory=dict)  # service host:port -> local host:port

    def port(self, container_port: int) -> int:
        """The local port standing in for ``container_port`` in this pod."""
        if container_port not in self.ports:
            self.ports[container_port] = free_port()
        return self.ports[container_port]

    def rewrite(self, text: str) -> str:
        """``text`` with Service addresses, mount paths and this pod's listeners mapped."""
        for hostport, local in self.remote.items():
            text = text.replace(hostport, local)
        if self.paths:  # one pass: a mapped host path is never mapped again (e.g. under /tmp)
            alternatives = "|".join(re.escape(p) for p in sorted(self.paths, key=len, reverse=True))
            text = re.sub(
                rf"(?<![\w.-])({alternatives})(?![\w.-])",
                lambda m: str(self.paths[m.group(1)]),
                text,
            )

        def local_port(m: re.Match[str]) -> str:
            port = int(m.group(2))
            return f"127.0.0.1:{self.ports[port]}" if port in self.ports else m.group(0)

        text = re.sub(r"(0\.0\.0\.0|\$\{env:POD_IP\}):(\d+)\b", local_port, text)
        # the Collector's own metrics: `host: 0.0.0.0` and `port: N` on separate keys
        text = re.sub(r"(?m)^(\s*host:\s*)(0\.0\.0\.0)\s*$", r"\g<1>127.0.0.1", text)
        return re.sub(
            r"(?m)^(\s*port:\s*)(\d+)\s*$",
            lambda m: m.group(1) + str(self.ports.get(int(m.group(2)), m.group(2))),
            text,
        )


def _expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$`` escapes; an unknown name stays as written)."""

    def one(m: re.Match[str]) -> str:
        return "$" if m.group(1) is None else env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, value)


def _image(
    container: Mapping[str, Any],
) -> tuple[list[str], list[str], dict[str, str], dict[str, Path]]:
    """ENTRYPOINT, CMD, ENV and COPYed files of a container's image."""
    repository, _, tag = container["image"].rpartition(":")
    if repository in UPSTREAM_ENTRYPOINTS:
        return list(UPSTREAM_ENTRYPOINTS[repository]), [], {}, {}
    dockerfile, target = IMAGES[repository]
    if tag.endswith("-subprocess"):
        target = SUBPROCESS_TARGET
    spec = image_spec(dockerfile, REPO, target)
    return spec.entrypoint, spec.cmd, spec.env, spec.copies


def pod_runs(
    objects: Sequence[dict[str, Any]],
    workload: dict[str, Any],
    mapping: PodMapping,
    host_paths: Mapping[str, Path],
    fields: Mapping[str, str],
) -> list[ContainerRun]:
    """Every container of ``workload``'s pod template as a plain process (see the module
    docstring); ConfigMap files are written under ``mapping.root``.

    Args:
        objects: the rendered objects (for the ConfigMaps).
        workload: the DaemonSet or Deployment.
        mapping: this pod's mapping (``remote`` already filled for Services it talks to).
        host_paths: stand-ins for the hostPath volumes' paths.
        fields: ``fieldRef`` values (``spec.nodeName``, ``status.podIP``).

    """
    spec = workload["spec"]["template"]["spec"]
    volumes: dict[str, Path] = {}
    configmap_files: list[Path] = []
    for volume in spec["volumes"]:
        where = mapping.root / volume["name"]
        if "configMap" in volume:
            data = find(objects, "ConfigMap", volume["configMap"]["name"])["data"]
            where.mkdir(parents=True)
            items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                (where / item["path"]).write_text(data[item["key"]])
                configmap_files.append(where / item["path"])
        elif "emptyDir" in volume:
            where.mkdir(parents=True, mode=0o777)
        elif "hostPath" in volume:
            assert volume["hostPath"]["path"] in host_paths, (
                f"the test has no stand-in for hostPath {volume['hostPath']['path']}"
            )
            where = host_paths[volume["hostPath"]["path"]]
        else:
            raise AssertionError(f"volume {volume['name']}: a kind this mapping does not know")
        volumes[volume["name"]] = where
    images = {c["name"]: _image(c) for c in spec["containers"]}
    for container in spec["containers"]:
        mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
        for path, repo_file in images[container["name"]][3].items():
            if not any(path == m or path.startswith(m + "/") for m in mounts):
                mapping.paths.setdefault(path, repo_file)  # an image file no mount hides
        for mount in container.get("volumeMounts", []):
            host = volumes[mount["name"]]
            known = mapping.paths.setdefault(mount["mountPath"], host)
            assert known == host, f"{mount['mountPath']} is two volumes in one pod"
        for port in container.get("ports", []):
            mapping.port(port["containerPort"])
    for file in configmap_files:
        file.write_text(mapping.rewrite(file.read_text()))

    runs = []
    for container in spec["containers"]:
        entrypoint, cmd, image_env, _ = images[container["name"]]
        argv = list(container["command"]) if "command" in container else entrypoint
        if "args" in container:
            argv = argv + list(container["args"])
        elif "command" not in container:
            argv = argv + cmd
        env = {k: v for k, v in image_env.items() if k != "PATH"}
        for var in container.get("env", []):
            if "valueFrom" in var:
                value = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
            else:
                value = _expand(str(var.get("value", "")), env)
            env[var["name"]] = value
        ports = {p["name"]: mapping.ports[p["containerPort"]] for p in container.get("ports", [])}
        probes = {}
        for kind in ("readinessProbe", "livenessProbe"):
            probe = dict(container[kind])
            target = probe.get("grpc") or probe.get("httpGet")
            assert target is not None, f"{container['name']}: {kind} is neither gRPC nor HTTP"
            port = target["port"]
            local = ports[port] if isinstance(port, str) else mapping.ports[port]
            probes[kind] = {**probe, "local_port": local}
        runs.append(
            ContainerRun(
                container["name"],
                container["image"],
                [mapping.rewrite(_expand(a, env)) for a in argv],
                {k: mapping.rewrite(v) for k, v in env.items()},
                ports,
                probes,
            )
        )
    return runs


def service_address(service: dict[str, Any], port_name: str, runs: Sequence[ContainerRun]) -> str:
    """``127.0.0.1:N`` of the container port a Service port targets."""
    port = next(p for p in service["spec"]["ports"] if p["name"] == port_name)
    target = port["targetPort"]
    for run in runs:
        if target in run.ports:
            return f"127.0.0.1:{run.ports[target]}"
    raise AssertionError(f"Service {service['metadata']['name']}: no container port {target!r}")


def service_host(service: dict[str, Any], port_name: str) -> str:
    """The in-cluster ``<name>.<namespace>.svc:<port>`` address of a Service port."""
    port = next(p for p in service["spec"]["ports"] if p["name"] == port_name)
    meta = service["metadata"]
    return f"{meta['name']}.{meta['namespace']}.svc:{port['port']}"


def executable(argv0: str, gpumetrics: Path, otelcol: Path) -> str:
    """The local program for an image's executable."""
    name = os.path.basename(argv0)
    if name == "gpumetrics":
        return str(gpumetrics)
    if name in ("otelcol-gpumetrics", "otelcol-contrib"):
        return str(otelcol)
    raise AssertionError(f"no local stand-in for {argv0}")
