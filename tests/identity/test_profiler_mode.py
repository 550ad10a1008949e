"""ProcessResourcer in identity.mode: profiler (the default): the cases as data, what it never
reads, the relabel rules it refuses, variables that are not UTF-8, and a live process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpumetrics.identity.cgroup import container_id
from gpumetrics.identity.modes import IdentityMode, is_observed_key, validate_env_var_names
from gpumetrics.identity.procfs import ProcfsReader
from gpumetrics.identity.relabel_config import RelabelConfigError
from gpumetrics.identity.resourcer import (
    NOT_UTF8_WARN_INTERVAL_NS,
    ProcessResourcer,
    new_process_resourcer,
)

from .conftest import load_cases
from .fakeproc import PID, build, expected_resource, make_proc, resource_bytes

CASES = load_cases("profiler_mode_cases.yaml")
ENRICHED_CASES = load_cases("precedence_cases.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_profiler_mode_case(case: dict[str, Any], tmp_path: Path) -> None:
    if "error" in case:
        with pytest.raises(RelabelConfigError) as err:
            build(case, tmp_path, "profiler")
        assert str(err.value) == case["error"]
        return
    r, stub = build(case, tmp_path, "profiler")
    attrs: dict[str, Any] = {}
    kept = r.put_resource(PID, attrs)
    assert stub.reads == 0  # the OTEL_CTX mapping is never read in profiler mode
    if case.get("dropped"):
        assert kept is False and attrs == {}
        return
    assert kept is True
    expected = expected_resource(case)
    assert attrs == expected
    assert {k: type(v) for k, v in attrs.items()} == {k: type(v) for k, v in expected.items()}


def test_profiler_mode_is_the_default(tmp_path: Path) -> None:
    make_proc(tmp_path, {"start": 500, "comm": "py", "environ": {"OTEL_SERVICE_NAME": "svc"}})
    r = new_process_resourcer(None, None, "n", False, procfs=ProcfsReader(str(tmp_path)))
    assert r.mode is IdentityMode.PROFILER
    assert r.resource(PID) == {"process.pid": PID}


@pytest.mark.parametrize(
    "case",
    [c for c in ENRICHED_CASES if "expected" in c],
    ids=[c["id"] for c in ENRICHED_CASES if "expected" in c],
)
def test_enriched_resource_contains_the_profiler_resource(
    case: dict[str, Any], tmp_path: Path
) -> None:
    """Every key the profiler mode gives a process is in its enriched resource, equal, except
    process.pid, which enriched mode always sets to the int pid. Enriched mode only adds.
    (Rules that write labels are refused in profiler mode: its resource is built without them.)"""
    config = {k: v for k, v in case.get("config", {}).items() if k != "relabel_configs"}
    profiler, _ = build({**case, "config": config}, tmp_path / "p", "profiler")
    enriched, _ = build(case, tmp_path / "e", "enriched")
    base = profiler.resource(PID)
    full = enriched.resource(PID)
    assert base is not None and full is not None
    base.pop("process.pid", None)
    assert {k: full.get(k) for k in base} == base


def test_variable_that_is_not_utf8_is_replaced_counted_and_logged_once_per_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 27 item 2: the profiles exporter's rule (gpumetrics.identity.utf8): each run of
    invalid bytes becomes U+FFFD, so the key stays and equals what the exporter declares; the
    process is counted once (not once per recomputation) and logged at WARNING at most once a
    minute, the processes in between at DEBUG."""
    make_proc(tmp_path, {"start": 500})
    (tmp_path / str(PID) / "environ").write_bytes(b"GOOD=ok\x00BAD=caf\xe9\x00WORSE=\xff\xfe\x00")
    for other in (PID + 1, PID + 2):
        shutil.copytree(tmp_path / str(PID), tmp_path / str(other), symlinks=True)
    procfs = ProcfsReader(str(tmp_path), include_env_vars=["GOOD", "BAD", "WORSE"])
    caplog.set_level("DEBUG", logger="gpumetrics.identity.resourcer")
    now = [1]
    r = ProcessResourcer(procfs=procfs, procfs_ttl_ns=0, clock=lambda: now[0])
    assert r.resource(PID) == {
        "process.pid": PID,
        "process.environment_variable.GOOD": "ok",
        "process.environment_variable.BAD": "caf\ufffd",
        "process.environment_variable.WORSE": "\ufffd",
    }
    r.resource(PID)  # recomputed (no TTL): the same process, neither counted nor logged again
    assert r.stats()["env_var_not_utf8"] == 1
    r.resource(PID + 1)  # another process within the minute: counted, logged at DEBUG
    assert r.stats()["env_var_not_utf8"] == 2
    now[0] += NOT_UTF8_WARN_INTERVAL_NS
    r.resource(PID + 2)
    assert r.stats()["env_var_not_utf8"] == 3
    logged = [
        (rec.levelname, rec.getMessage())
        for rec in caplog.records
        if rec.name == "gpumetrics.identity.resourcer"
    ]
    assert [level for level, _ in logged] == ["WARNING", "DEBUG", "WARNING"]
    assert logged[0][1].startswith(f"pid {PID}: BAD, WORSE are not UTF-8; ")
    assert logged[1][1].startswith(f"pid {PID + 1}: BAD, WORSE are not UTF-8; ")
    assert logged[2][1].endswith("(1 more process(es) since the last warning)")


def test_executable_path_that_is_not_utf8_follows_the_same_rule(tmp_path: Path) -> None:
    """The profiler sends readlink's bytes; the exporter replaces what is not UTF-8, and so does
    the sidecar (an OTLP string must be UTF-8: a surrogate-escaped str could not be encoded)."""
    make_proc(tmp_path, {"start": 500})
    os.symlink(b"/opt/app/cam\xe9 (deleted)", os.fsencode(tmp_path / str(PID) / "exe"))
    r = ProcessResourcer(procfs=ProcfsReader(str(tmp_path)))
    resource = r.resource(PID)
    assert resource == {
        "process.pid": PID,
        "process.executable.path": "/opt/app/cam\ufffd (deleted)",
        "process.executable.name": "cam\ufffd (deleted)",
    }
    assert resource_bytes(resource)  # encodable as OTLP


def test_refused_rules_name_the_rule_index() -> None:
    from gpumetrics.identity.relabel_config import parse_relabel_configs

    rules = parse_relabel_configs(
        [
            {"source_labels": ["comm"], "target_label": "__tmp", "action": "lowercase"},
            {"source_labels": ["comm"], "target_label": "svc", "modulus": 4, "action": "hashmod"},
        ]
    )
    with pytest.raises(RelabelConfigError, match=r"^relabel_configs\[1\]\.target_label: action "):
        ProcessResourcer(procfs=ProcfsReader("/nonexistent"), relabel_configs=rules)
    # the same rules are fine in enriched mode
    ProcessResourcer(procfs=ProcfsReader("/nonexistent"), relabel_configs=rules, mode="enriched")


def test_unknown_mode_is_an_error() -> None:
    with pytest.raises(ValueError, match="'exact'"):
        new_process_resourcer(None, None, "n", False, mode="exact")


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ([""], "[0]: must be a non-empty string, got ''"),
        (["A", " B"], "[1]: ' B' has surrounding whitespace"),
        (["A=B"], "[0]: 'A=B' cannot contain '=' or NUL"),
        (["A\x00"], "[0]: 'A\\x00' cannot contain '=' or NUL"),
        ([f"V{i}" for i in range(257)], "257 names exceed the limit of 256"),
    ],
)
def test_configured_names_are_checked(names: list[str], message: str) -> None:
    with pytest.raises(ValueError) as err:
        validate_env_var_names(names)
    assert str(err.value) == message


def test_observed_keys() -> None:
    observed = [
        "host.name",
        "host.id",
        "k8s.node.name",
        "process.pid",
        "process.executable.name",
        "process.executable.path",
        "process.owner",
        "process.creation.time",
        "container.id",
        "process.environment_variable.HOME",
        # issue 23 item 3: what Kubernetes and the container runtime observe
        "k8s.pod.name",
        "k8s.namespace.name",
        "k8s.container.name",
        "k8s.deployment.name",
        "k8s.pod.uid",
        "container.name",
        "container.image.name",
    ]
    declared = [
        "service.name",
        "service.namespace",
        "deployment.environment.name",
        "process.runtime.name",
        "hostx",
        "k8sx",
        "containerx",
    ]
    assert [k for k in observed if not is_observed_key(k)] == []
    assert [k for k in declared if is_observed_key(k)] == []


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin"),
        "OTEL_SERVICE_NAME": "live-trainer",
        "CUDA_VISIBLE_DEVICES": "3",
    }
    # The child says when it runs: until its exec, /proc/<pid>/environ is still the parent's
    # (a loaded machine showed it: the test read the parent's environment).
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('running', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"running\n"
        yield proc
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_live_process(child: subprocess.Popen[bytes]) -> None:
    """A real child through the real /proc: exactly the profiler's keys, computed here from
    what the kernel says (readlink of exe, the cgroup file, the environment we gave it)."""
    r = new_process_resourcer(
        None,
        None,
        "node-1",
        False,
        proc_root="/proc",
        host_pid_namespace=True,
        include_env_vars=["OTEL_SERVICE_NAME", "CUDA_VISIBLE_DEVICES", "UNSET_VARIABLE"],
    )
    exe = os.readlink(f"/proc/{child.pid}/exe")
    with open(f"/proc/{child.pid}/cgroup", "rb") as f:
        cid = container_id(f.read())
    expected: dict[str, Any] = {
        "process.pid": child.pid,
        "process.executable.path": exe,
        "process.executable.name": exe.rsplit("/", 1)[-1],
        "process.environment_variable.OTEL_SERVICE_NAME": "live-trainer",
        "process.environment_variable.CUDA_VISIBLE_DEVICES": "3",
    }
    if cid is not None:
        expected["container.id"] = cid
    assert r.resource(child.pid) == expected
