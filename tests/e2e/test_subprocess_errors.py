"""End-to-end, subprocess mode: the real Collector starts the real sidecar with a configuration
the sidecar refuses (a profile name that does not exist in ``args``, a bad value in ``env``).
The Collector must fail to start with the sidecar's own message and exit status in its error,
and log the sidecar's line at ERROR, not go-plugin's "Unrecognized remote plugin message" nor a
kill (issue 17, item 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .harness import Proc, clean_environ, gpumetrics_command, log_records, procs

pytestmark = pytest.mark.e2e

EXIT_TIMEOUT_S = 120.0  # Collector start + sidecar start (Python imports) on a loaded machine


def collector_config(path: Path, args: list[str], env: dict[str, str]) -> Path:
    config = {
        "receivers": {
            "gpumetrics": {
                "command": str(gpumetrics_command()),
                "args": args,
                "env": env,
                "collection_interval": "10s",
            }
        },
        "exporters": {"debug": {}},
        "service": {
            "telemetry": {"logs": {"encoding": "json"}, "metrics": {"level": "none"}},
            "pipelines": {"metrics": {"receivers": ["gpumetrics"], "exporters": ["debug"]}},
        },
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (
            ["serve", "--plugin", "--simulate", "h100-8x"],
            {},
            "gpumetrics: 'runtime.simulate' (from flag --simulate): h100-8x: no such profile, "
            "field case or file; built-in profiles: ",
        ),
        (
            ["serve", "--plugin", "--simulate"],
            {"GPUMETRICS_BATCH_INTERVAL_S": "soon"},
            "gpumetrics: 'runtime.batch_interval_s' (from GPUMETRICS_BATCH_INTERVAL_S='soon'): "
            "Input should be a valid number",
        ),
    ],
)
def test_a_refused_sidecar_configuration_is_the_collectors_start_error(
    otelcol: Path, tmp_path: Path, args: list[str], env: dict[str, str], said: str
) -> None:
    config = collector_config(tmp_path / "collector.yaml", args, env)
    log = tmp_path / "otelcol.log"
    with procs() as started:
        collector = Proc("otelcol", [otelcol, f"--config={config}"], clean_environ(), log)
        started.append(collector)
        code = collector.popen.wait(timeout=EXIT_TIMEOUT_S)
    text = log.read_text(errors="replace")
    assert code != 0, text
    command = str(gpumetrics_command())
    assert (
        f'starting sidecar "{command}": it exited with status 2 before the go-plugin handshake; '
        f"its stderr ended with: {said}"
    ) in text, text[-4000:]
    for noise in ("Unrecognized remote plugin message", "compiled for this architecture",
                  "failed to exit gracefully", "signal: killed", "Traceback"):  # fmt: skip
        assert noise not in text, text[-4000:]
    sidecar_lines = [
        r for r in log_records(log) if str(r.get("msg", "")).startswith("[ERROR] " + said)
    ]
    assert [r.get("level") for r in sidecar_lines] == ["error"], text[-4000:]
