"""Every Collector configuration in collector-config/ and the sample sidecar configuration load.

Always: YAML without duplicate keys, a `gpumetrics` receiver in exactly one mode, pipelines that
name only defined components, every `${env:NAME}` without a default known to this test, no
deprecated prometheus exporter setting, and what the end-to-end tests rely on in the e2e-*.yaml
files. With the built distribution
($OTELCOL_GPUMETRICS, set by scripts/test.sh after building it): `otelcol-gpumetrics validate`
on each file (with the profiles feature gate where a profiles pipeline needs it), which runs the
receiver's and the exporter's own Config.Validate. The eBPF profiler's own Collector
configuration (collector-config/profiler/, for the upstream otelcol-ebpf-profiler distribution)
gets the same structural checks, without a gpumetrics component.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpumetrics.config.load import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "collector-config"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
PROFILER_CONFIGS = sorted((CONFIG_DIR / "profiler").glob("*.yaml"))
PROFILES_GATE = "--feature-gates=+service.profilesSupport"
SAMPLE_SIDECAR_CONFIG = REPO / "examples" / "gpumetrics.yaml"
OTELCOL_ENV = "OTELCOL_GPUMETRICS"

SECTIONS = ("receivers", "processors", "exporters", "connectors", "extensions")
ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}")


def placeholders(tmp: Path) -> dict[str, str]:
    """Values for every variable a file requires (no default), shaped as the file expects."""
    return {
        "SIDECAR_COMMAND": str(Path(sys.executable).parent / "gpumetrics"),
        "SIDECAR_SIMULATE": "h100-sxm",
        "SIDECAR_PROFILER_SOCKET": str(tmp / "profiler.sock"),
        "SIDECAR_ENDPOINT": f"unix://{tmp / 'gm.sock'}",
        "SIDECAR_PROFILER_ENDPOINT": f"unix://{tmp / 'gm-profiler.sock'}",
        "OTLP_TOKEN_FILE": str(tmp / "otlp.token"),
        "PROFILES_TOKEN_FILE": str(tmp / "otlp.token"),
        "E2E_OUTPUT": str(tmp / "metrics.jsonl"),
        "E2E_PROFILES_OUTPUT": str(tmp / "profiles.jsonl"),
        "OTLP_HTTP_ENDPOINT": "127.0.0.1:4318",
        "OTLP_GRPC_ENDPOINT": "127.0.0.1:4317",
        "OTELCOL_TELEMETRY_PORT": "8888",
        "DOWNSTREAM_ENDPOINT": "127.0.0.1:4317",
        "E2E_STORAGE_DIR": str(tmp / "queue"),
        "E2E_EVENTS_OUTPUT": str(tmp / "events.jsonl"),
    }


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping (PyYAML keeps the last one)."""


def _construct_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load(path: Path) -> dict[str, Any]:
    data = yaml.load(path.read_text(), Loader=UniqueKeyLoader)  # noqa: S506 (safe subclass)
    assert isinstance(data, dict), f"{path.name}: not a mapping"
    return data


def test_collector_configs_exist() -> None:
    names = {p.name for p in CONFIGS}
    assert {
        "subprocess.yaml",
        "remote.yaml",
        "profiles.yaml",
        "e2e-subprocess.yaml",
        "e2e-remote.yaml",
        "e2e-profiles.yaml",
        "e2e-live-profiler.yaml",
    } <= names
    assert [p.name for p in PROFILER_CONFIGS] == ["ebpf-profiler.yaml"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_structure(path: Path) -> None:
    config = load(path)
    receiver = config["receivers"]["gpumetrics"]
    modes = [key for key in ("command", "endpoint") if receiver.get(key)]
    assert len(modes) == 1, f"{path.name}: receivers.gpumetrics needs command or endpoint: {modes}"
    if "command" in receiver:
        assert receiver["args"][0] == "serve", f"{path.name}: args must start with serve"
        assert "--plugin" in receiver["args"], f"{path.name}: args should require go-plugin mode"
    assert_pipelines_consistent(path, config)
    if "profiles" in config["service"]["pipelines"]:
        profiles = config["service"]["pipelines"]["profiles"]
        assert "gpumetrics" in profiles["exporters"], f"{path.name}: profiles not declared"
        assert "endpoint" in config["exporters"]["gpumetrics"]


@pytest.mark.parametrize("path", PROFILER_CONFIGS, ids=lambda p: p.name)
def test_profiler_collector_structure(path: Path) -> None:
    """The profiler's Collector: the `profiling` receiver with the OTEL_* variables the sidecar
    takes, sending its profiles over OTLP to ours."""
    config = load(path)
    assert_pipelines_consistent(path, config)
    assert list(config["service"]["pipelines"]) == ["profiles"]
    env_vars = config["receivers"]["profiling"]["include_env_vars"].split(",")
    assert {"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} <= set(env_vars)
    assert config["service"]["pipelines"]["profiles"]["exporters"] == ["otlp_grpc"]


def assert_pipelines_consistent(path: Path, config: dict[str, Any]) -> None:
    """Known top-level keys; pipelines of known signals that name only defined components; no
    component defined and unused."""
    unknown = set(config) - {*SECTIONS, "service"}
    assert not unknown, f"{path.name}: unknown top-level keys {unknown}"
    service = config["service"]
    for name, pipeline in service["pipelines"].items():
        signal = name.split("/")[0]
        assert signal in ("metrics", "profiles", "logs"), f"{path.name}: pipeline {name}"
        for section in ("receivers", "processors", "exporters"):
            for component in pipeline.get(section, []):
                assert component in config.get(section, {}), (
                    f"{path.name}: service.pipelines.{name}.{section}: {component} not defined"
                )
    for component in service.get("extensions", []):
        assert component in config.get("extensions", {}), f"{path.name}: extension {component}"
    used = {
        c
        for p in service["pipelines"].values()
        for s in ("receivers", "processors", "exporters")
        for c in p.get(s, [])
    } | set(service.get("extensions", []))
    for section in SECTIONS:
        for component in config.get(section, {}):
            assert component in used, f"{path.name}: {section}.{component} is defined, not used"


@pytest.mark.parametrize("path", CONFIGS + PROFILER_CONFIGS, ids=lambda p: p.name)
def test_required_variables_are_known(path: Path, tmp_path: Path) -> None:
    known = placeholders(tmp_path)
    required = {m.group(1) for m in ENV_REF.finditer(path.read_text()) if m.group(2) is None}
    assert required <= set(known), (
        f"{path.name} requires {sorted(required - set(known))}: add a placeholder to this test"
    )


@pytest.mark.parametrize(
    "path", [p for p in CONFIGS if p.name.startswith("e2e-")], ids=lambda p: p.name
)
def test_e2e_configs_give_what_the_tests_read(path: Path) -> None:
    config = load(path)
    exporters = config["exporters"]
    assert "file" in exporters or "otlp_grpc" in exporters, f"{path.name}: nothing to read back"
    if "otlp_grpc" in exporters:  # forwards to a Collector the test runs (test_persistent_queue)
        assert exporters["otlp_grpc"]["sending_queue"]["storage"] in config["extensions"]
    files = [name for name in ("file", "file/events") if name in exporters]
    for name in files:
        file_exporter = exporters[name]
        assert file_exporter.get("format", "json") == "json"
        assert "compression" not in file_exporter  # compressed records are length-prefixed
    if "logs" in config["service"]["pipelines"]:  # the GPU events (test_events)
        assert config["service"]["pipelines"]["logs"]["exporters"] == ["file/events"]
    metrics = config["service"]["telemetry"]["metrics"]
    if "readers" in metrics:  # the test reads them (test_live_profiler), on a port it chose
        (prometheus,) = [r["pull"]["exporter"]["prometheus"] for r in metrics["readers"]]
        assert prometheus == {"host": "127.0.0.1", "port": "${env:OTELCOL_TELEMETRY_PORT}"}
    else:  # no fixed internal-telemetry port (8888) that parallel runs would fight over
        assert metrics["level"] == "none"
    assert config["service"]["telemetry"]["logs"]["encoding"] == "json"
    assert config["service"]["telemetry"]["logs"]["level"] == "debug"  # go-plugin's messages


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_prometheus_exporters_avoid_deprecated_settings(path: Path) -> None:
    """prometheusexporter v0.161.0 warns at every start that `resource_to_telemetry_conversion`
    is deprecated; `resource_constant_labels: {included: ["*"]}` does the same (every resource
    attribute becomes a label, which the Grafana dashboard's per-process panels group by)."""
    exporters = load(path).get("exporters", {})
    for name, exporter in exporters.items():
        if name.split("/")[0] != "prometheus":
            continue
        assert "resource_to_telemetry_conversion" not in exporter, f"{path.name}: {name}"
        assert exporter["resource_constant_labels"] == {"included": ["*"]}, f"{path.name}: {name}"


def test_sample_sidecar_config_loads() -> None:
    config = load_config(str(SAMPLE_SIDECAR_CONFIG), environ={})
    assert config.server.listen  # something that the file sets


@pytest.mark.e2e
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_otelcol_validate(path: Path, tmp_path: Path) -> None:
    binary = os.environ.get(OTELCOL_ENV)
    if not binary:
        pytest.skip(f"${OTELCOL_ENV} is not set (scripts/test.sh sets it after building)")
    env = {k: v for k, v in os.environ.items() if k not in placeholders(tmp_path)}
    env.update(placeholders(tmp_path))
    gates = [PROFILES_GATE] if "profiles" in load(path)["service"]["pipelines"] else []
    done = subprocess.run(
        [binary, "validate", f"--config={path}", *gates],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, f"{path.name}: {done.stderr[-3000:]}"


USER_CONFIGS = [p for p in CONFIGS if not p.name.startswith("e2e-")]


@pytest.mark.parametrize("path", USER_CONFIGS, ids=lambda p: p.name)
def test_user_configs_acknowledge_only_what_is_persisted(path: Path) -> None:
    """docs/collector.md "What acknowledged means": no shipped configuration a user runs puts a
    `batch` processor after the gpumetrics receiver, every exporter with a sending queue keeps
    it in `file_storage`, and the receiver's GPU events have a logs pipeline."""
    assert_acknowledged_is_persisted(path.name, load(path))


def assert_acknowledged_is_persisted(name: str, config: dict[str, Any]) -> None:
    """The checks of test_user_configs_acknowledge_only_what_is_persisted on one configuration
    (also run on the Helm chart's, below)."""
    pipelines = config["service"]["pipelines"]
    processors = config.get("processors", {})
    assert not [p for p in processors if p.split("/")[0] == "batch"], f"{name}: batch processor"
    signals = {n.split("/")[0] for n, p in pipelines.items() if "gpumetrics" in p["receivers"]}
    assert {"metrics", "logs"} <= signals, f"{name}: the gpumetrics receiver's pipelines {signals}"
    for exporter, settings in config["exporters"].items():
        queue = (settings or {}).get("sending_queue")
        if exporter.split("/")[0] in ("otlp", "otlp_grpc", "otlphttp", "prometheus"):
            assert queue, f"{name}: exporters.{exporter} has no persistent sending_queue"
        if queue:
            assert queue.get("storage") == "file_storage", f"{name}: exporters.{exporter} queue"
    assert config["extensions"]["file_storage"]["fsync"] is True, f"{name}: file_storage fsync"
    assert "file_storage" in config["service"]["extensions"], f"{name}: file_storage not enabled"


MANIFESTS = REPO / "deploy" / "manifests"


@pytest.mark.parametrize("manifest", sorted(p.name for p in MANIFESTS.glob("*.yaml")))
def test_the_charts_collector_acknowledges_only_what_is_persisted(manifest: str) -> None:
    """The node Collector the Helm chart renders (deploy/manifests/) follows the same rule, its
    queue directory is a volume the Collector container mounts, and the gateway (which the node
    Collectors push GPU events to as well) has a logs pipeline and no batch processor."""
    objects = [d for d in yaml.safe_load_all((MANIFESTS / manifest).read_text()) if d]
    maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    node = next(yaml.safe_load(d["otelcol.yaml"]) for d in maps.values() if "otelcol.yaml" in d)
    assert_acknowledged_is_persisted(manifest, node)
    spec = next(o for o in objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    collector = next(c for c in spec["containers"] if c["name"] == "otelcol")
    mounts = {m["mountPath"]: m["name"] for m in collector["volumeMounts"]}
    directory = node["extensions"]["file_storage"]["directory"]
    assert directory in mounts, f"{manifest}: {directory} is not mounted in {collector['name']}"
    volume = next(v for v in spec["volumes"] if v["name"] == mounts[directory])
    assert "emptyDir" in volume and "medium" not in volume["emptyDir"], volume  # on disk
    for name, data in maps.items():
        if name.endswith("-gateway"):
            gateway = yaml.safe_load(data["config.yaml"])
            assert "logs" in gateway["service"]["pipelines"], f"{manifest}: gateway drops events"
            assert not [p for p in gateway["processors"] if p.startswith("batch")], manifest


@pytest.mark.parametrize("path", USER_CONFIGS, ids=lambda p: p.name)
def test_a_shipped_profiles_pipeline_authenticates_what_it_receives(path: Path) -> None:
    """Issue 23 item 2: a profiles pipeline with the gpumetrics exporter turns every profile's
    resource into a declaration, so its OTLP receiver must not take an unauthenticated export:
    every protocol of every receiver feeding it requires an authenticator whose extension is
    enabled (the sidecar trusts the exporter's connection)."""
    config = load(path)
    pipelines = config["service"]["pipelines"]
    declaring = [p for n, p in pipelines.items() if n.split("/")[0] == "profiles"]
    declaring = [
        p for p in declaring if any(e.split("/")[0] == "gpumetrics" for e in p["exporters"])
    ]
    for pipeline in declaring:
        for name in pipeline["receivers"]:
            protocols = config["receivers"][name]["protocols"]
            for protocol, settings in protocols.items():
                auth = (settings or {}).get("auth", {}).get("authenticator")
                assert auth, f"{path.name}: receivers.{name}.protocols.{protocol} has no auth"
                assert auth in config["service"]["extensions"], f"{path.name}: {auth} not enabled"
                assert auth.split("/")[0] == "bearertokenauth"
                ext = config["extensions"][auth]
                assert ext["filename"] == "${env:OTLP_TOKEN_FILE}", "the token comes from a file"
                assert ext["wait_for_token_file"] is True, "a missing file fails the start"


def test_the_profiler_sends_the_token_the_receiver_requires() -> None:
    """profiler/ebpf-profiler.yaml's exporter sends the bearer token profiles.yaml requires."""
    (profiler,) = PROFILER_CONFIGS
    exporter = load(profiler)["exporters"]["otlp_grpc"]
    assert exporter["headers"] == {"authorization": "Bearer ${file:${env:PROFILES_TOKEN_FILE}}"}
