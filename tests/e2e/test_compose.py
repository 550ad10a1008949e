"""docker-compose.yaml cannot run here (no Docker engine), so this runs what it runs: the sidecar
and the Collector with the commands, environment and configuration files the compose file and
the Dockerfiles give them, as plain processes (tests/e2e/compose.py maps paths and ports), then
checks what the demo shows: the sidecar's compose healthcheck passes, every Prometheus target of
compose/prometheus.yml serves, the simulated profile's GPUs appear in the Collector's Prometheus
exporter, every metric the Grafana dashboard queries exists, and the compose Prometheus service
itself (the real Prometheus, at the version compose runs, scraping the Collector with
compose/prometheus.yml) answers every panel's PromQL with series (docs/e2e.md)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import nvmlsim as sim

from .compose import HostMapping, compose_cli, compose_config, service_run
from .harness import Proc, clean_environ, gpumetrics_command, procs, wait_for
from .promql import dashboard_queries, evaluate

pytestmark = pytest.mark.e2e

TIMEOUT_S = 90.0
# Metric names in dashboard queries start with one of these (the OTLP names, translated).
METRIC_PREFIXES = "(?:hw|nvidia|gpumetrics|otelcol)"


@pytest.fixture
def volume_root() -> Iterator[Path]:
    """A short directory for the compose volumes (unix socket paths must stay < 108 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="gm-compose-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def http_get(url: str) -> str | None:
    """The body of a 200 answer, else None (not up yet)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (loopback)
            if response.status == 200:
                return str(response.read().decode())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return None


def series(exposition: str, metric: str) -> list[str]:
    """Sample lines of ``metric`` in a Prometheus text exposition."""
    return [
        line
        for line in exposition.splitlines()
        if line.startswith(metric + "{") or line.startswith(metric + " ")
    ]


def bind_source(service: dict[str, Any], target: str) -> Path:
    for volume in service.get("volumes", []):
        if volume["type"] == "bind" and volume["target"] == target:
            return Path(volume["source"])
    raise AssertionError(f"no bind mount at {target}")


def prometheus_run(
    config: dict[str, Any], mapping: HostMapping, binary: Path, tmp_path: Path
) -> tuple[list[str], Path, str]:
    """The compose ``prometheus`` service as a process: (argv, working directory, base URL).

    The image (``prom/prometheus``) runs ``/bin/prometheus`` in ``/prometheus`` with the compose
    ``command`` in place of its CMD, so its TSDB is ``data/`` there; here that directory is a
    temporary one. The bind-mounted configuration is copied with its targets mapped to the
    Collector's loopback ports, and the listener (the image's ``0.0.0.0:9090``, published on
    127.0.0.1:9090) moves to a free loopback port. Nothing else is changed.
    """
    service = config["services"]["prometheus"]
    image = service["image"]
    assert image.startswith("prom/prometheus:"), image
    source = bind_source(service, "/etc/prometheus/prometheus.yml")
    mapped = tmp_path / "prometheus.yml"
    mapped.write_text(mapping.rewrite(source.read_text()))
    (published,) = [int(p["target"]) for p in service.get("ports", [])]
    listen = f"127.0.0.1:{mapping.port(published)}"
    argv = [str(binary)]
    for arg in service["command"]:
        argv.append(arg.replace("/etc/prometheus/prometheus.yml", str(mapped)))
    argv.append(f"--web.listen-address={listen}")
    workdir = tmp_path / "prometheus-workdir"
    workdir.mkdir()
    return argv, workdir, f"http://{listen}"


def test_compose_services_run_as_plain_processes(
    otelcol: Path, prometheus: Path, tmp_path: Path, volume_root: Path
) -> None:
    config = compose_config(compose_cli())
    assert {"gpumetrics", "otelcol", "prometheus", "grafana"} <= set(config["services"]), (
        "the default profile (.env: COMPOSE_PROFILES=simulated) must start the simulated sidecar"
    )
    mapping = HostMapping(volume_root, set(config["services"]))
    token_writer = service_run(config, "otlp-token", mapping)
    sidecar = service_run(config, "gpumetrics", mapping)
    collector = service_run(config, "otelcol", mapping)

    assert sidecar.argv[0] == "gpumetrics", sidecar.argv
    assert Path(collector.argv[0]).name == "otelcol-gpumetrics", collector.argv
    profile = sidecar.argv[sidecar.argv.index("--simulate") + 1]
    uuids = {d.uuid for d in sim.load_scenario(profile).devices}

    sidecar_argv = [str(gpumetrics_command())] + [mapping.rewrite(a) for a in sidecar.argv[1:]]
    collector_argv = [str(otelcol)] + [mapping.rewrite(a) for a in collector.argv[1:]]
    assert sidecar.healthcheck is not None and sidecar.healthcheck[0] == "python"
    health_argv = [sys.executable] + [mapping.rewrite(a) for a in sidecar.healthcheck[1:]]

    prom_service = config["services"]["prometheus"]
    scrape = yaml.safe_load(bind_source(prom_service, "/etc/prometheus/prometheus.yml").read_text())
    targets = {
        job["job_name"]: [mapping.rewrite(t) for sc in job["static_configs"] for t in sc["targets"]]
        for job in scrape["scrape_configs"]
    }
    health_url = f"http://{mapping.rewrite_env(collector.env)['HEALTH_CHECK_ENDPOINT']}/"
    prom_argv, prom_dir, prom_url = prometheus_run(config, mapping, prometheus, tmp_path)
    dashboards = bind_source(config["services"]["grafana"], "/var/lib/grafana/dashboards")
    queries = [(f"{path.name}: {title}", expr) for path in sorted(dashboards.glob("*.json"))
               for title, expr in dashboard_queries(path)]  # fmt: skip
    assert queries, f"no panel query in {dashboards}"

    # otelcol depends on otlp-token having written the OTLP receiver's token (and exited 0)
    assert config["services"]["otelcol"]["depends_on"]["otlp-token"]["condition"] == (
        "service_completed_successfully"
    )
    assert token_writer.argv[0] == "python", token_writer.argv
    written = subprocess.run(
        [sys.executable, *(mapping.rewrite(a) for a in token_writer.argv[1:])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert written.returncode == 0, written.stderr
    token_file = Path(mapping.rewrite_env(collector.env)["OTLP_TOKEN_FILE"])
    token = token_file.read_text().strip()
    assert token.startswith("gpm-") and len(token) == 68 and token_file.stat().st_mode & 0o7 == 0

    with procs() as started:
        side = Proc(
            "sidecar",
            sidecar_argv,
            clean_environ(mapping.rewrite_env(sidecar.env)),
            tmp_path / "sidecar.log",
        )
        started.append(side)

        def healthy() -> bool:
            return subprocess.run(health_argv, capture_output=True, timeout=30).returncode == 0

        wait_for(healthy, TIMEOUT_S, "the sidecar's compose healthcheck to pass", side.log_tail)

        col = Proc(
            "otelcol",
            collector_argv,
            clean_environ(mapping.rewrite_env(collector.env)),
            tmp_path / "otelcol.log",
        )
        started.append(col)

        def gpus_exported() -> str | None:
            body = http_get(f"http://{targets['gpumetrics'][0]}/metrics")
            if body is None:
                return None
            seen = set(
                re.findall(r'hw_id="([^"]+)"', "\n".join(series(body, "hw_gpu_utilization_ratio")))
            )
            return body if seen == uuids else None

        wait_for(
            gpus_exported,
            TIMEOUT_S,
            f"hw_gpu_utilization_ratio for the {len(uuids)} GPUs of {profile}",
            lambda: side.log_tail() + "\n" + col.log_tail(),
        )

        # Some series start after the first batch: the GPM profiling metrics with the second
        # tick (a reading needs two samples), slow-cadence counters at their first cadence.
        def exporter_text() -> str:
            return http_get(f"http://{targets['gpumetrics'][0]}/metrics") or ""

        def dashboard_served() -> str | None:
            body = exporter_text()
            return body if body and not missing_dashboard_series(config, body) else None

        exposition = wait_for(
            dashboard_served,
            TIMEOUT_S,
            "a series for every Grafana dashboard query",
            lambda: "missing: " + ", ".join(missing_dashboard_series(config, exporter_text())),
        )
        for job, urls in targets.items():
            for target in urls:
                assert http_get(f"http://{target}/metrics") is not None, f"{job}: {target}"
        own = http_get(f"http://{targets['otelcol'][0]}/metrics") or ""
        assert series(own, "otelcol_receiver_accepted_metric_points"), "no Collector metrics"
        assert http_get(health_url) is not None, f"health_check at {health_url}"

        otlp = mapping.rewrite_env(collector.env)["OTLP_GRPC_ENDPOINT"]
        assert_profiles_need_the_token(otlp, token, exporter_text)

        # The dashboard's PromQL in the compose Prometheus, scraping the Collector as compose
        # runs it (scrape_interval 10 s: rate() over [1m] needs two scrapes).
        prom = Proc("prometheus", prom_argv, clean_environ(), tmp_path / "prometheus.log", prom_dir)
        started.append(prom)

        def wrong_queries() -> list[str]:
            return [
                f"{panel}: {expr!r}: {problem}"
                for panel, expr in queries
                if (problem := evaluate(prom_url, expr)[0]) is not None
            ]

        def panels_answered() -> bool:
            return prom.running() and not wrong_queries()

        wait_for(
            panels_answered,
            TIMEOUT_S,
            "every Grafana panel query to return series from Prometheus",
            lambda: "\n".join(wrong_queries()) + "\n" + prom.log_tail() + col.log_tail(),
        )
        # the check itself can fail: a broken query, a series that does not exist
        broken = queries[0][1].rstrip("}")[:-1] if "}" in queries[0][1] else queries[0][1] + "{"
        assert evaluate(prom_url, broken)[0] is not None, broken
        assert "no series" in str(evaluate(prom_url, "hw_gpu_utilization_ratio{hw_id='nope'}")[0])
        assert prom.stop(timeout_s=20) == 0, prom.log_tail()

        assert col.stop(timeout_s=20) == 0, col.log_tail()
        assert side.stop(timeout_s=20) == 0, side.log_tail()

    # No setting of the shipped configuration is deprecated (each would warn at every start).
    deprecated = [
        line for line in (tmp_path / "otelcol.log").read_text().splitlines() if "deprecated" in line
    ]
    assert not deprecated, f"the Collector warned: {deprecated}"

    assert_dashboard_metrics_exist(config, exposition)


def _profiles_of(pid: int, extra: dict[str, str]) -> Any:
    """An ExportProfilesServiceRequest of one empty sample on ``pid``'s resource (what the
    gpumetrics exporter declares; the OTLP receiver drops a request without samples). The
    fields used (ResourceProfiles 1-2, ScopeProfiles.profiles 2, Profile.samples 2) are numbered
    alike in the PyPI package's older profiles proto and the Collector's pdata v1.67."""
    from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.profiles.v1development import profiles_pb2
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

    attrs = [KeyValue(key="process.pid", value=AnyValue(int_value=pid))]
    attrs += [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in extra.items()]
    profile = profiles_pb2.Profile(samples=[profiles_pb2.Sample()])
    return profiles_service_pb2.ExportProfilesServiceRequest(
        resource_profiles=[
            profiles_pb2.ResourceProfiles(
                resource=Resource(attributes=attrs),
                scope_profiles=[profiles_pb2.ScopeProfiles(profiles=[profile])],
            )
        ]
    )


def assert_profiles_need_the_token(
    endpoint: str, token: str, exposition: Callable[[], str]
) -> None:
    """Issue 23 item 2: the shipped profiles pipeline's OTLP receiver refuses an export without
    the bearer token (a forged identity for a victim's pid would reach the sidecar through the
    exporter, which may declare), and the same export with the token is declared."""
    import grpc
    from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2_grpc

    victim = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE)  # fmt: skip
    honest = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE)  # fmt: skip
    forged = _profiles_of(
        victim.pid, {"host.name": "x", "container.id": "y", "k8s.pod.name": "victim-pod"}
    )
    try:
        with grpc.insecure_channel(endpoint) as channel:
            stub = profiles_service_pb2_grpc.ProfilesServiceStub(channel)
            for metadata in [(), (("authorization", "Bearer gpm-not-the-token"),)]:
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Export(forged, metadata=metadata, timeout=10)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
            good = (("authorization", f"Bearer {token}"),)
            stub.Export(
                _profiles_of(honest.pid, {"service.name": "e2e"}), metadata=good, timeout=10
            )

        def declared() -> str | None:
            lines = series(exposition(), "gpumetrics_declarations")
            return lines[0] if lines and float(lines[0].rsplit(" ", 1)[1]) >= 1 else None

        line = wait_for(declared, TIMEOUT_S, "the sidecar to hold the authorized declaration")
        assert float(line.rsplit(" ", 1)[1]) == 1, line  # only the authorized one
    finally:
        for child in (victim, honest):
            child.communicate(b"", timeout=30)


def assert_dashboard_metrics_exist(config: dict[str, Any], exposition: str) -> None:
    """Every metric a Grafana panel queries is in the Collector's exposition, with a series
    matching the query's equality label matchers."""
    missing = missing_dashboard_series(config, exposition)
    assert not missing, f"no series is exported for: {missing}"


def missing_dashboard_series(config: dict[str, Any], exposition: str) -> list[str]:
    """The dashboard selectors (``file: name{matchers}``) that no exported series matches."""
    missing = []
    dashboards = bind_source(config["services"]["grafana"], "/var/lib/grafana/dashboards")
    files = sorted(dashboards.glob("*.json"))
    assert files, f"no dashboard in {dashboards}"
    for path in files:
        dashboard = json.loads(path.read_text())
        exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
        assert exprs, f"{path.name}: no queries"
        for expr in exprs:
            selectors = re.findall(rf"\b({METRIC_PREFIXES}_\w+)(?:\{{([^}}]*)\}})?", expr)
            assert selectors, f"{path.name}: no metric in {expr!r}"
            for name, matchers in selectors:
                wanted = re.findall(r'(\w+)="([^"]*)"', matchers)
                lines = [
                    line
                    for line in series(exposition, name)
                    if all(f'{k}="{v}"' in line for k, v in wanted)
                ]
                if not lines:
                    missing.append(f"{path.name}: {name}{{{matchers}}}")
    return missing
