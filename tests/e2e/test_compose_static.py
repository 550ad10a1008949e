"""Static checks of docker-compose.yaml that need no process: both sidecars' settings (image ENV
plus compose environment) validate as sidecar configuration, the `gpu` profile has what
docs/deployment.md asks for a real GPU host (and not the demo's node name), the sidecars'
healthchecks probe often while starting, the Collector runs collector-config/profiles.yaml
against the sockets the sidecar listens on (pull and profiler service) with the profiles feature
gate and the host's /proc, and the `profiler` profile adds the eBPF profiler sending to it. The
runtime check is test_compose.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from gpumetrics.config.load import load_config

import nvmlsim as sim

from .compose import HostMapping, ServiceRun, compose_cli, compose_config, service_run
from .harness import REPO


def mapped_runs(
    tmp_path: Path, *profiles: str
) -> tuple[dict[str, Any], HostMapping, dict[str, ServiceRun]]:
    config = compose_config(compose_cli(), *profiles)
    mapping = HostMapping(tmp_path, set(config["services"]))
    runs = {
        name: service_run(config, name, mapping)
        for name, service in config["services"].items()
        if "build" in service
    }
    return config, mapping, runs


def test_default_profile_runs_the_simulated_sidecar(tmp_path: Path) -> None:
    config, mapping, runs = mapped_runs(tmp_path)
    assert "gpumetrics-gpu" not in config["services"]
    sidecar = runs["gpumetrics"]
    assert sidecar.argv[:2] == ["gpumetrics", "serve"]
    profile = sidecar.argv[sidecar.argv.index("--simulate") + 1]
    assert sim.load_scenario(profile).devices  # a built-in profile that exists
    settings = load_config(environ=mapping.rewrite_env(sidecar.env))
    assert settings.runtime.simulate is None  # given by the flag, not the environment
    assert [str(a) for a in settings.server.listen] == [
        mapping.rewrite("unix:///run/gpumetrics/gpumetrics.sock")
    ]
    assert settings.identity.node_name == "gpumetrics-demo"  # the demo's host.name


def test_gpu_profile_sidecar_has_host_pids_proc_and_gpus(tmp_path: Path) -> None:
    config, mapping, runs = mapped_runs(tmp_path, "gpu")
    assert "gpumetrics" not in config["services"], "--profile gpu must replace the simulated one"
    service = config["services"]["gpumetrics-gpu"]
    sidecar = runs["gpumetrics-gpu"]
    assert "--simulate" not in sidecar.argv
    assert service["pid"] == "host"
    proc_root = sidecar.env["GPUMETRICS_PROC_ROOT"]
    binds = {v["target"]: v for v in service["volumes"] if v["type"] == "bind"}
    assert binds[proc_root]["source"] == "/proc" and binds[proc_root]["read_only"]
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    settings = load_config(environ=mapping.rewrite_env(sidecar.env))
    # /host/proc in the container is the host's /proc (mapped back here).
    assert settings.identity.proc_root == "/proc"


@pytest.mark.parametrize(
    ("node_name_env", "expected"),
    [(None, None), ("", None), ("gpu-node-7", "gpu-node-7")],
    ids=["NODE_NAME unset", "NODE_NAME empty", "NODE_NAME set"],
)
def test_gpu_profile_node_name_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node_name_env: str | None, expected: str | None
) -> None:
    """A real node must not report the demo's host.name: `gpu` takes NODE_NAME (compose reads
    the shell's environment and .env) and otherwise leaves the sidecar's default."""
    if node_name_env is None:
        monkeypatch.delenv("NODE_NAME", raising=False)
    else:
        monkeypatch.setenv("NODE_NAME", node_name_env)
    _, mapping, runs = mapped_runs(tmp_path, "gpu")
    sidecar = runs["gpumetrics-gpu"]
    assert "gpumetrics-demo" not in sidecar.env.values()
    settings = load_config(environ=mapping.rewrite_env(sidecar.env))
    assert settings.identity.node_name == expected


def duration_s(text: str) -> float:
    """A compose duration such as ``1s``, ``500ms`` or ``1m30s``, in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"unreadable duration {text!r}"
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * scale[u] for n, u in parts)


@pytest.mark.parametrize(
    ("profile", "service"),
    [((), "gpumetrics"), (("gpu",), "gpumetrics-gpu")],
    ids=["simulated", "gpu"],
)
def test_sidecar_healthcheck_probes_often_while_starting(
    profile: tuple[str, ...], service: str
) -> None:
    """The Collector waits for the sidecar's healthcheck: during `start_period` it is probed
    every `start_interval`, much sooner than the steady `interval`."""
    health = compose_config(compose_cli(), *profile)["services"][service]["healthcheck"]
    start_interval = duration_s(health["start_interval"])
    assert 0 < start_interval <= 2.0
    assert start_interval < duration_s(health["interval"])
    assert duration_s(health["start_period"]) >= 10 * start_interval


def test_collector_runs_profiles_config_against_the_sidecar_sockets(tmp_path: Path) -> None:
    config, mapping, runs = mapped_runs(tmp_path)
    collector = runs["otelcol"]
    config_arg = next(a for a in collector.argv if a.startswith("--config="))
    assert Path(mapping.rewrite(config_arg.removeprefix("--config="))) == (
        REPO / "collector-config" / "profiles.yaml"
    )
    assert "--feature-gates=+service.profilesSupport" in collector.argv
    sidecar_listen = runs["gpumetrics"].env["GPUMETRICS_LISTEN"]
    assert collector.env["SIDECAR_ENDPOINT"] == sidecar_listen
    profiler_listen = runs["gpumetrics"].env["GPUMETRICS_PROFILER_LISTEN"]
    assert collector.env["SIDECAR_PROFILER_ENDPOINT"] == profiler_listen
    proc = next(v for v in config["services"]["otelcol"]["volumes"] if v["source"] == "/proc")
    assert (proc["target"], proc.get("read_only")) == (collector.env["HOST_PROC"], True)
    sidecar_volumes = {v["source"] for v in config["services"]["gpumetrics"]["volumes"]}
    collector_volumes = {v["source"] for v in config["services"]["otelcol"]["volumes"]}
    assert sidecar_volumes & collector_volumes, "the socket's volume must be shared"


def test_profiler_profile_sends_profiles_to_the_collector(tmp_path: Path) -> None:
    """`--profile profiler` adds the upstream eBPF profiler distribution, pinned to the
    Collector release of otelcol-gpumetrics, privileged in the host PID namespace, sending OTLP
    to the Collector's OTLP receiver; without the profile it does not run."""
    assert "ebpf-profiler" not in compose_config(compose_cli())["services"]
    config = compose_config(compose_cli(), "gpu", "profiler")
    profiler = config["services"]["ebpf-profiler"]
    assert profiler["image"].endswith("/opentelemetry-collector-ebpf-profiler:0.161.0")
    builder = (REPO / "collector" / "builder-config.yaml").read_text()
    assert "otlpreceiver v0.161.0" in builder, "pin the profiler image to the Collector release"
    assert profiler["privileged"] is True
    assert profiler["pid"] == "host"
    assert "--feature-gates=+service.profilesSupport" in profiler["command"]
    mounts = {v["target"]: v["source"] for v in profiler["volumes"]}
    assert Path(mounts["/etc/otelcol-ebpf-profiler/config.yaml"]) == (
        REPO / "collector-config" / "profiler" / "ebpf-profiler.yaml"
    )
    host, port = profiler["environment"]["PROFILES_ENDPOINT"].rsplit(":", 1)
    otlp = config["services"]["otelcol"]["environment"]["OTLP_GRPC_ENDPOINT"]
    assert host == "otelcol"
    assert otlp == f"0.0.0.0:{port}"


@pytest.mark.parametrize(("profile", "service"), [((), "gpumetrics"), (("gpu",), "gpumetrics-gpu")])
def test_each_sidecar_keeps_its_store_on_a_volume_of_its_own(
    tmp_path: Path, profile: tuple[str, ...], service: str
) -> None:
    """store.path is on a named volume (on disk, not tmpfs) that no other service mounts: a
    restarted container resumes its store, and the two profiles' nodes never share one."""
    config, mapping, runs = mapped_runs(tmp_path, *profile)
    settings = load_config(environ=mapping.rewrite_env(runs[service].env))
    assert settings.store.path == mapping.rewrite("/var/lib/gpumetrics")
    mount = next(
        v for v in config["services"][service]["volumes"] if v["target"] == "/var/lib/gpumetrics"
    )
    assert mount["type"] == "volume"
    assert "driver_opts" not in config["volumes"][mount["source"]], "a tmpfs would not survive"
    others = {
        v["source"]
        for name, s in compose_config(compose_cli(), "gpu")["services"].items()
        if name != service
        for v in s.get("volumes", [])
    }
    assert mount["source"] not in others
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "install -d -m 0700 -o 10001 -g 10001 /var/lib/gpumetrics" in dockerfile
