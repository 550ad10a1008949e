"""The console script's commands in-process against a running sidecar; exit codes; errors."""

from __future__ import annotations

import os

import gpumetrics
import pytest
from google.protobuf import json_format
from gpumetrics.cli import main
from gpumetrics.metrics import count_points, names
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from .conftest import GPU0


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpumetrics {gpumetrics.__version__}"


def test_pull_json_is_otlp_json_and_acknowledges(running, capsys):
    sidecar, address = running
    code, out, err = run(capsys, "pull", address, "--format", "json", "--consumer", "c1")
    assert code == 0 and err == ""
    request = json_format.Parse(out, metrics_service_pb2.ExportMetricsServiceRequest())
    assert count_points(request) >= 1
    assert '"resourceMetrics"' in out  # protobuf JSON mapping: lowerCamelCase names
    (consumer,) = [c for c in sidecar.parts.store.stats().consumers if c.name == "c1"]
    assert consumer.acked_sequence == 1
    # the acknowledged batch is not delivered again to the same consumer: stdout is the JSON of
    # an empty request, so a script always parses one document, and stderr says why
    code, out, err = run(capsys, "pull", address, "--consumer", "c1")
    epoch = sidecar.parts.store.epoch
    assert (code, out) == (0, "{}\n")
    assert json_format.Parse(out, metrics_service_pb2.ExportMetricsServiceRequest()) == (
        metrics_service_pb2.ExportMetricsServiceRequest()
    )
    assert err == f"no new batches for consumer 'c1' (epoch {epoch})\n"
    code, out, err = run(capsys, "pull", address, "--consumer", "c1", "--format", "text")
    assert (code, out, err) == (0, f"no new batches for consumer 'c1' (epoch {epoch})\n", "")


def test_pull_no_ack_leaves_the_cursor(running, capsys):
    sidecar, address = running
    assert run(capsys, "pull", address, "--consumer", "c2", "--no-ack")[0] == 0
    (consumer,) = [c for c in sidecar.parts.store.stats().consumers if c.name == "c2"]
    assert consumer.acked_sequence == 0
    code, out, _ = run(capsys, "pull", address, "--consumer", "c2", "--format", "text")
    assert code == 0
    assert out.splitlines()[0].startswith("epoch ") and "batches 1..1" in out
    assert "hw.power" in out


def _process_resources(out: str, pid: int) -> list[dict]:
    request = json_format.Parse(out, metrics_service_pb2.ExportMetricsServiceRequest())
    found = []
    for rm in request.resource_metrics:
        attrs = {kv.key: json_format.MessageToDict(kv.value) for kv in rm.resource.attributes}
        if attrs.get("process.pid") == {"intValue": str(pid)}:
            found.append(attrs)
    return found


def test_declare_then_pull_shows_the_declared_resource(running, capsys):
    """`declare` sends a resource shaped like the eBPF profiler's for this live process
    (pid, executable from /proc, the --env as process.environment_variable.*, the --attr), and
    in profiler mode (the default) the process's GPU resource is exactly that resource."""
    sidecar, address = running
    pid = os.getpid()
    code, out, err = run(
        capsys,
        "declare",
        address,
        "--pid",
        str(pid),
        "--env",
        "OTEL_SERVICE_NAME=trainer",
        "--attr",
        "service.name=trainer-apm",
    )
    assert (code, out.strip(), err) == (0, "accepted 1", "")
    sidecar.parts.producer.record_process(
        pid, lambda b: b.add(names.MetricProcessUtilization, 0.5, 1, GPU0.id_attributes())
    )
    sidecar.parts.batcher.run_once()
    code, out, _ = run(capsys, "pull", address, "--consumer", "d")
    exe = os.readlink(f"/proc/{pid}/exe")
    expected = {
        "process.pid": {"intValue": str(pid)},
        "process.executable.path": {"stringValue": exe},
        "process.executable.name": {"stringValue": os.path.basename(exe)},
        "process.environment_variable.OTEL_SERVICE_NAME": {"stringValue": "trainer"},
        "service.name": {"stringValue": "trainer-apm"},
    }
    with open(f"/proc/{pid}/cgroup", "rb") as f:
        from gpumetrics.identity.cgroup import container_id

        cid = container_id(f.read())
    if cid:
        expected["container.id"] = {"stringValue": cid}
    assert _process_resources(out, pid) == [expected]


def test_declare_with_a_start_time_sends_only_what_it_is_given(capsys):
    from gpumetrics.cli.client import build_declaration
    from gpumetrics.cli.parser import build_parser
    from opentelemetry.proto.resource.v1 import resource_pb2

    args = build_parser().parse_args(
        ["declare", "x:1", "--pid", "41201", "--start-time-ticks", "0", "--env", "A=b=c",
         "--attr", "service.name=trainer"]
    )  # fmt: skip
    decl = build_declaration(args)
    res = resource_pb2.Resource.FromString(decl.profiler_resource)
    assert {kv.key: json_format.MessageToDict(kv.value) for kv in res.attributes} == {
        "process.pid": {"intValue": "41201"},
        "process.environment_variable.A": {"stringValue": "b=c"},
        "service.name": {"stringValue": "trainer"},
    }
    assert [(e.name, e.value) for e in decl.environment] == [("A", b"b=c")]


def test_declare_rejection_exits_3_and_prints_the_field(running, capsys):
    _, address = running
    code, out, _ = run(
        capsys,
        "declare",
        address,
        "--pid",
        "4194305",
        "--start-time-ticks",
        "1",
    )
    assert code == 3
    assert out.startswith("accepted 0") and "rejected pid 4194305: processes[0].pid:" in out


def test_declare_reads_the_start_time_from_proc(tmp_path, capsys):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text(
        "42 (a b) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0\n"
    )
    from gpumetrics.cli.client import build_declaration
    from gpumetrics.cli.parser import build_parser

    args = build_parser().parse_args(
        ["declare", "x:1", "--pid", "42", "--proc-root", str(tmp_path)]
    )
    assert build_declaration(args).start_time_ticks == 777


def test_count_gpus_counts_driver_entries(tmp_path, capsys):
    gpus = tmp_path / "driver" / "nvidia" / "gpus"
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (gpus / bus).mkdir(parents=True)
    assert run(capsys, "count-gpus", "--proc-root", str(tmp_path))[:2] == (0, "3\n")
    assert run(capsys, "count-gpus", "--proc-root", str(tmp_path / "none"))[:2] == (0, "0\n")


@pytest.mark.parametrize(
    ("argv", "code", "text"),
    [
        (["pull", "127.0.0.1:1", "--timeout", "2"], 1, "gpumetrics: pull 127.0.0.1:1: UNAVAILABLE"),
        (
            ["declare", "127.0.0.1:1", "--pid", "1", "--env", "NOEQUALS"],
            2,
            "--env 'NOEQUALS': expected KEY=VALUE",
        ),
        (
            ["pull", "127.0.0.1:1", "--token-file", "/nonexistent/token"],
            1,
            "--token-file /nonexistent/token",
        ),
        (["pull", "127.0.0.1:1", "--cert-file", "c.pem"], 2, "--cert-file and --key-file"),
        (
            ["serve", "--batch-interval", "0"],
            2,
            "'runtime.batch_interval_s' (from flag --batch-interval)",
        ),
        (
            ["serve", "--listen", "0.0.0.0:4319"],
            2,
            "'server.listen[0]' (from flag --listen): 0.0.0.0:4319 is not loopback",
        ),
        (
            ["serve", "--plugin"],
            1,
            "--plugin: go-plugin mode needs the GPUMETRICS_PLUGIN_MAGIC_COOKIE",
        ),
    ],
)
def test_errors_are_one_line_with_an_exit_code(capsys, monkeypatch, argv, code, text):
    for name in [n for n in os.environ if n.startswith("GPUMETRICS_")]:
        monkeypatch.delenv(name)
    got, out, err = run(capsys, *argv)
    assert got == code
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and text in err


def test_pull_with_a_wrong_token_is_unauthenticated(make_sidecar, tmp_path, capsys):
    from .conftest import config

    token = tmp_path / "pull.token"
    token.write_text("s3cret-pull-token-0123\n")
    wrong = tmp_path / "wrong.token"
    wrong.write_text("wrong-pull-token-0123\n")
    sidecar, collector, _ = make_sidecar(
        config(server={"listen": ["127.0.0.1:0"], "pull_token_file": str(token)})
    )
    sidecar.start()
    address = sidecar.parts.server.addresses.listen[0]
    code, _, err = run(capsys, "pull", address, "--token-file", str(wrong))
    assert code == 1 and "UNAUTHENTICATED" in err
    collector.record()
    sidecar.parts.batcher.run_once()
    code, out, _ = run(capsys, "pull", address, "--token-file", str(token))
    assert code == 0 and "resourceMetrics" in out


def test_pull_wait_retries_until_the_first_batch_is_stored(make_sidecar, capsys):
    import threading

    sidecar, collector, ticker = make_sidecar()
    sidecar.start()
    address = sidecar.parts.server.addresses.listen[0]
    code, _, err = run(capsys, "pull", address)  # no --wait: one attempt, UNAVAILABLE
    assert code == 1 and "UNAVAILABLE" in err
    result: dict[str, object] = {}
    puller = threading.Thread(
        target=lambda: result.setdefault(
            "code", main(["pull", address, "--wait", "30", "--format", "text"])
        )
    )
    puller.start()
    collector.record()
    collector.ready.set()
    ticker.tick()  # the batcher stores the first batch; health turns SERVING
    puller.join(30)
    assert not puller.is_alive() and result["code"] == 0
    assert "hw.power" in capsys.readouterr().out


def test_pull_into_a_closed_pipe_exits_quietly_without_acknowledging(running, capsys, monkeypatch):
    sidecar, address = running
    r, w = os.pipe()
    os.close(r)  # the reader (e.g. `| head`) is gone
    broken = os.fdopen(w, "w")
    monkeypatch.setattr("sys.stdout", broken)
    try:
        code = main(["pull", address, "--consumer", "piped"])
    finally:
        monkeypatch.undo()
        broken.close()
    assert code == 141
    assert "Traceback" not in capsys.readouterr().err
    (consumer,) = [c for c in sidecar.parts.store.stats().consumers if c.name == "piped"]
    assert consumer.acked_sequence == 0  # nothing acknowledged that was not printed


def test_serving_on_a_live_unix_socket_is_one_clear_line(tmp_path, capsys):
    import socket

    path = tmp_path / "busy.sock"
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(path))
    live.listen(1)
    try:
        code = main(["serve", "--simulate", "h100-sxm", "--listen", f"unix:{path}"])
    finally:
        live.close()
    err = capsys.readouterr().err
    assert code == 2  # a configuration problem: choose another path
    assert err.splitlines()[-1] == (
        f"gpumetrics: 'server.listen[0]' (from flag --listen): unix socket '{path}' is in use by "
        "a running server; stop it or choose another path"
    )
    assert "Traceback" not in err and "stopped" not in err  # the undone start says nothing
    import nvmlsim as sim

    assert sim.installed() is None  # the failed start undid the simulation it installed


def test_several_config_problems_are_one_line_each_with_unknown_variables(
    capsys, monkeypatch, tmp_path
):
    for name in [n for n in os.environ if n.startswith("GPUMETRICS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GPUMETRICS_ALLOW_INSECURE_LISTN", "true")  # a typo of ours
    cfg = tmp_path / "typo.yaml"
    cfg.write_text(
        "runtime:\n  batch_intreval_s: 3\ncollection:\n  disabled_metrics: [hw.temprature]\n"
    )
    code, out, err = run(capsys, "serve", "--config", str(cfg))
    lines = err.strip().splitlines()
    assert code == 2 and out == ""
    assert all(line.startswith("gpumetrics: ") for line in lines)
    assert any("'runtime.batch_intreval_s'" in line for line in lines)
    assert any("'collection.disabled_metrics'" in line for line in lines)
    assert any("GPUMETRICS_ALLOW_INSECURE_LISTN" in line for line in lines)
    assert len(lines) == 3


def test_the_insecure_listen_error_names_the_flags_that_fix_it(capsys, monkeypatch):
    for name in [n for n in os.environ if n.startswith("GPUMETRICS_")]:
        monkeypatch.delenv(name)
    code, _, err = run(capsys, "serve", "--listen", "0.0.0.0:4319")
    assert code == 2
    assert "--tls-cert-file" in err and "--allow-insecure-listen" in err


@pytest.mark.parametrize("how", ["flag", "env"])
def test_allow_insecure_listen_from_a_flag_or_the_environment(how, monkeypatch):
    from gpumetrics.cli.parser import build_parser, serve_overrides
    from gpumetrics.config import load_config

    argv = ["serve", "--listen", "0.0.0.0:4319"]
    environ = {}
    if how == "flag":
        argv.append("--allow-insecure-listen")
    else:
        environ["GPUMETRICS_ALLOW_INSECURE_LISTEN"] = "true"
    config = load_config(None, environ, serve_overrides(build_parser().parse_args(argv)))
    assert config.server.allow_insecure_listen is True
    assert config.server.listen == ["0.0.0.0:4319"]


@pytest.mark.parametrize(
    ("argv", "usage", "error"),
    [
        (
            ["serve", "--simulte"],
            "usage: gpumetrics serve ",
            "gpumetrics serve: error: unrecognized argument --simulte; did you mean --simulate?",
        ),
        (
            ["serve", "--listen=127.0.0.1:0", "--pull-tokn-file=/t"],
            "usage: gpumetrics serve ",
            "gpumetrics serve: error: unrecognized argument --pull-tokn-file=/t; did you mean "
            "--pull-token-file?",
        ),
        (
            ["pull", "127.0.0.1:4319", "--formt", "text"],
            "usage: gpumetrics pull ",
            "gpumetrics pull: error: unrecognized argument --formt; did you mean --format?",
        ),
        (
            ["serve", "--zzzz"],
            "usage: gpumetrics serve ",
            "gpumetrics serve: error: unrecognized argument --zzzz; see gpumetrics serve --help",
        ),
    ],
)
def test_a_mistyped_flag_prints_its_commands_usage_and_the_closest_flag(capsys, argv, usage, error):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(usage), err
    assert err.rstrip().splitlines()[-1] == error


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["pull", "unix:/x", "--max-points", "-1"],
            "argument --max-points: -1: must be 0..4294967295",
        ),
        (["pull", "unix:/x", "--max-points", "99999999999"], "argument --max-points: 99999999999"),
        (["pull", "unix:/x", "--max-bytes", "-1"], "argument --max-bytes: -1: must be 0..1844674"),
        (
            ["declare", "unix:/x", "--pid", "0"],
            "argument --pid: 0: must be a process id in 1..4294967295",
        ),
        (
            ["declare", "unix:/x", "--pid", "99999999999", "--start-time-ticks", "0"],
            "argument --pid",
        ),
        (
            ["declare", "unix:/x", "--pid", "41201", "--start-time-ticks", "-5"],
            "argument --start-time-ticks: -5",
        ),
        (
            ["declare", "unix:/x", "--pid", "41201", "--start-time-ticks", str(2**64)],
            f"argument --start-time-ticks: {2**64}: must be 0..18446744073709551615",
        ),
    ],
)
def test_out_of_range_integer_flags_are_usage_errors_naming_the_flag(capsys, argv, error):
    """Values protobuf cannot hold (uint32, uint64, PID_MAX_LIMIT) are refused by the parser
    with exit 2, not a ValueError from the request builder (newcomer report F11)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.splitlines()[-1].startswith(f"gpumetrics {argv[0]}: error: {error}")
    assert "Traceback" not in err and "internal error" not in err
