"""Static checks of docker-compose.yaml that need no process: both sidecars' settings (image ENV
plus compose environment) validate as sidecar configuration, the `gpu` profile has what
docs/deployment.md asks for a real GPU host, and the Collector runs collector-config/remote.yaml
against the socket the sidecar listens on. The runtime check is test_compose.py."""

from __future__ import annotations

from pathlib import Path

from gpumetrics.config.load import load_config
from gpumetrics.nvml import sim

from .compose import HostMapping, compose_cli, compose_config, service_run
from .harness import REPO


def mapped_runs(tmp_path: Path, *profiles: str):
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


def test_collector_runs_remote_config_against_the_sidecar_socket(tmp_path: Path) -> None:
    config, mapping, runs = mapped_runs(tmp_path)
    collector = runs["otelcol"]
    config_arg = next(a for a in collector.argv if a.startswith("--config="))
    assert Path(mapping.rewrite(config_arg.removeprefix("--config="))) == (
        REPO / "collector-config" / "remote.yaml"
    )
    sidecar_listen = runs["gpumetrics"].env["GPUMETRICS_LISTEN"]
    assert collector.env["SIDECAR_ENDPOINT"] == sidecar_listen
    sidecar_volumes = {v["source"] for v in config["services"]["gpumetrics"]["volumes"]}
    collector_volumes = {v["source"] for v in config["services"]["otelcol"]["volumes"]}
    assert sidecar_volumes & collector_volumes, "the socket's volume must be shared"
