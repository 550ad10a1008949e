"""ProcessResourcer in enriched mode: precedence as data, F15/F16 scenarios, caching and a real
process. Profiler mode (the default): test_profiler_mode.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpumetrics.identity.ctxproto import encode_process_context
from gpumetrics.identity.declared import DeclaredStore
from gpumetrics.identity.procfs import ProcfsReader
from gpumetrics.identity.relabel_config import RelabelConfigError, parse_relabel_configs
from gpumetrics.identity.resourcer import ProcessResourcer, new_process_resourcer

from .conftest import PROC, load_cases
from .ctx_publisher import Publisher
from .fakeproc import (
    PID,
    StubContextReader,
    expected_resource,
    make_proc,
    resource_bytes,
)
from .fakeproc import (
    build as build_case,
)

CASES = load_cases("precedence_cases.yaml")
ENRICHED = "enriched"


def build(case: dict[str, Any], root: Path, **kw: Any) -> tuple[ProcessResourcer, Any]:
    return build_case(case, root, ENRICHED, **kw)


def enriched(root: Path, resolver: Any = None, **kw: Any) -> ProcessResourcer:
    """An enriched-mode resourcer over the fake procfs at ``root``, no OTEL_CTX reader."""
    return new_process_resourcer(
        resolver,
        None,
        "n",
        False,
        procfs=ProcfsReader(str(root)),
        read_process_context=False,
        mode=ENRICHED,
        **kw,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_precedence_case(case: dict[str, Any], tmp_path: Path) -> None:
    r, _ = build(case, tmp_path)
    attrs: dict[str, Any] = {"preexisting": "kept"}
    kept = r.put_resource(PID, attrs)
    if case.get("dropped"):
        assert kept is False
        assert attrs == {"preexisting": "kept"}  # untouched
        assert r.stats()["dropped"] == 1
        return
    assert kept is True
    assert attrs.pop("preexisting") == "kept"
    assert attrs == expected_resource(case)
    assert type(attrs["process.pid"]) is int


def test_creation_time_format(tmp_path: Path) -> None:
    make_proc(tmp_path, {"start": 12345, "comm": "x"})
    procfs = ProcfsReader(str(tmp_path))
    r = new_process_resourcer(
        None, None, "n", False, procfs=procfs, read_process_context=False, mode=ENRICHED
    )
    created = r.resource(PID)["process.creation.time"]  # type: ignore[index]
    assert procfs.clock_ticks_per_second == 100, "USER_HZ is 100 on Linux"
    assert created == "2023-11-14T22:15:23.450Z"  # 1700000000 s + 123.45 s


def test_declared_context_means_mapping_is_not_read(tmp_path: Path) -> None:
    case = next(c for c in CASES if c["id"] == "declared-context-wins-and-mapping-is-not-read")
    r, stub = build(case, tmp_path)
    r.put_resource(PID, {})
    assert stub.reads == 0


def _switch(link: Path, tree: str) -> None:
    tmp = link.with_name("next")
    os.symlink(PROC / tree, tmp)
    os.replace(tmp, link)


def test_f16_pid_reuse_across_cycles(tmp_path: Path) -> None:
    """F16: 4242 is python, then gone, then ffmpeg with another start time."""
    link = tmp_path / "proc"
    _switch(link, "f16_cycle1")
    procfs = ProcfsReader(str(link), host_pid_namespace=True)
    store = DeclaredStore(start_time_reader=procfs.start_time_ticks)
    store.declare(PID, 1000, b"", [("OTEL_SERVICE_NAME", b"python-trainer")], b"")
    r = new_process_resourcer(
        None, store, "n", False, procfs=procfs, read_process_context=False, mode=ENRICHED
    )
    first = r.resource(PID)
    assert first is not None and first["service.name"] == "python-trainer"
    assert first["process.executable.name"] == "python3"

    _switch(link, "f16_cycle2")  # the process exited; no exit was reported
    second = r.resource(PID)
    assert second == first  # still the declared process: nothing proves the pid was reused

    _switch(link, "f16_cycle3")  # pid reused by ffmpeg
    third = r.resource(PID)
    assert third is not None
    assert third["service.name"] == "ffmpeg"  # the python declaration is not inherited
    assert third["process.executable.name"] == "ffmpeg"
    assert store.lookup(PID) == (None, False)


def test_f15_container_proc_never_names_host_pid() -> None:
    procfs = ProcfsReader(str(PROC / "container"))
    r = new_process_resourcer(
        None, None, "n", False, procfs=procfs, read_process_context=False, mode=ENRICHED
    )
    assert r.resource(3412002) == {"host.name": "n", "process.pid": 3412002}


class CountingProcfs(ProcfsReader):
    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.full_reads = 0

    def read(self, pid: int):  # type: ignore[override]
        self.full_reads += 1
        return super().read(pid)


def test_cache_hits_and_invalidation(tmp_path: Path) -> None:
    make_proc(tmp_path, {"start": 500, "comm": "py"})
    procfs = CountingProcfs(str(tmp_path))
    clock = Clock()
    stub = StubContextReader({"service.name": "v1"}, ts=1)
    store = DeclaredStore(start_time_reader=procfs.start_time_ticks)
    r = ProcessResourcer(
        procfs=procfs,
        declared=store,
        context_reader=stub,  # type: ignore[arg-type]
        clock=clock,
        procfs_ttl_ns=1000,
        mode=ENRICHED,
    )
    first = r.resource(PID)
    assert first is not None and first["service.name"] == "v1"
    assert r.resource(PID) == first
    assert procfs.full_reads == 1 and r.stats()["cache_hits"] == 1

    stub.resource, stub.ts = {"service.name": "v2"}, 2  # a new publication
    assert r.resource(PID)["service.name"] == "v2"  # type: ignore[index]
    assert procfs.full_reads == 2

    store.declare(PID, 500, b"", [], resource_bytes({"service.name": "apm"}))  # a declaration
    assert r.resource(PID)["service.name"] == "apm"  # type: ignore[index]
    assert procfs.full_reads == 3

    clock.now += 1000  # procfs values are re-read after the TTL (exec keeps pid and start)
    r.resource(PID)
    assert procfs.full_reads == 4
    assert r.stats()["cache_misses"] == 4


def test_cache_is_bounded(tmp_path: Path) -> None:
    make_proc(tmp_path, None)
    r = enriched(tmp_path, cache_size=2)
    for pid in (1, 2, 3, 4):
        r.resource(pid)
    assert r.stats()["cached"] == 2


def test_resolver_failure_is_counted_not_raised(tmp_path: Path, caplog) -> None:
    make_proc(tmp_path, {"start": 500, "comm": "py"})

    class Broken:
        def labels_for_pid(self, pid: int) -> dict[str, str]:
            raise RuntimeError("kubelet unreachable")

    r = enriched(tmp_path, Broken(), procfs_ttl_ns=0)
    caplog.set_level("DEBUG", logger="gpumetrics.identity.resourcer")
    assert r.resource(PID) is not None
    assert r.resource(PID) is not None
    assert r.stats()["resolver_errors"] == 2
    warnings = [rec for rec in caplog.records if rec.levelname == "WARNING"]
    assert len(warnings) == 1  # logged once, then at DEBUG


def test_env_errors_counted(tmp_path: Path) -> None:
    make_proc(tmp_path, {"start": 500, "comm": "py", "environ": {"OTEL_RESOURCE_ATTRIBUTES": "a"}})
    r = enriched(tmp_path)
    r.resource(PID)
    assert r.stats()["env_discarded"] == 1


def test_relabel_rules_given_as_mappings_or_configs(tmp_path: Path) -> None:
    make_proc(tmp_path, {"start": 500, "comm": "sshd"})
    procfs = ProcfsReader(str(tmp_path))
    raw = [{"source_labels": ["comm"], "regex": "sshd", "action": "drop"}]
    for rules in (raw, parse_relabel_configs(raw)):
        r = new_process_resourcer(
            None, None, "n", False, rules, procfs=procfs, read_process_context=False
        )
        assert r.put_resource(PID, {}) is False
    with pytest.raises(RelabelConfigError, match=r"relabel_configs\[0\]\.action"):
        new_process_resourcer(None, None, "n", False, [{"action": "nope"}], procfs=procfs)


@pytest.fixture
def child_with_context() -> Iterator[Publisher]:
    env = dict(os.environ)
    env.update(
        OTEL_SERVICE_NAME="from-env",
        OTEL_RESOURCE_ATTRIBUTES="service.namespace=ml,deployment.environment.name=prod",
    )
    p = Publisher.__new__(Publisher)
    p.proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("ctx_publisher.py"))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    p.pid = p.proc.pid
    try:
        yield p
    finally:
        p.close()


FORGED_K8S = {
    "k8s.pod.name": "victim-pod",
    "k8s.namespace.name": "prod",
    "k8s.container.name": "main",
    "k8s.deployment.name": "victim",
    "container.name": "victim-ctr",
}


AS_NOBODY = """
import ctypes, os, sys
sys.path.insert(0, sys.argv[1])
import ctx_publisher  # as root: nobody cannot read the interpreter's library
os.setgroups([]); os.setgid(65534); os.setuid(65534)
ctypes.CDLL(None).prctl(4, 1)  # PR_SET_DUMPABLE: /proc/<pid> shows its owner again, not root
ctx_publisher._child_main()
"""


@pytest.fixture
def forging_child() -> Iterator[Publisher]:
    """A live child (as uid nobody when the tests run as root) that says it is another pod."""
    env = dict(os.environ)
    env["OTEL_RESOURCE_ATTRIBUTES"] = ",".join(f"{k}={v}" for k, v in FORGED_K8S.items())
    env["OTEL_SERVICE_NAME"] = "mine"
    here = Path(__file__).parent
    argv = [sys.executable, str(here / "ctx_publisher.py")]
    if os.geteuid() == 0:
        argv = [sys.executable, "-c", AS_NOBODY, str(here)]
    p = Publisher.__new__(Publisher)
    p.proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    p.pid = p.proc.pid
    try:
        yield p
    finally:
        p.close()


def test_a_real_process_cannot_name_itself_another_pod(forging_child: Publisher) -> None:
    """Issue 23 item 3: k8s.* and container.* from the process's own environment (read from
    /proc/<pid>/environ) and from its OTEL_CTX mapping never reach its enriched resource."""
    import pwd

    pub = forging_child
    pub.publish(encode_process_context({**FORGED_K8S, "k8s.statefulset.name": "victim-db"}))
    r = new_process_resourcer(
        None, None, "node-1", True, proc_root="/proc", host_pid_namespace=True, mode=ENRICHED
    )
    res = r.resource(pub.pid)
    assert res is not None
    assert res["service.name"] == "mine"  # what the process may say still applies
    assert res["k8s.node.name"] == "node-1"  # configured, not claimed
    assert [k for k in res if k.startswith(("k8s.", "container.")) and k != "k8s.node.name"] == []
    owner = pwd.getpwuid(os.stat(f"/proc/{pub.pid}").st_uid).pw_name
    assert res["process.owner"] == owner == ("nobody" if os.geteuid() == 0 else owner)


def test_real_process_end_to_end(child_with_context: Publisher) -> None:
    """A live child: environment from /proc/<pid>/environ, context from its OTEL_CTX mapping."""
    pub = child_with_context
    pub.publish(encode_process_context({"service.name": "from-ctx", "service.version": "2.0"}))
    r = new_process_resourcer(
        None, None, "node-1", False, proc_root="/proc", host_pid_namespace=True, mode=ENRICHED
    )
    res = r.resource(pub.pid)
    assert res is not None
    assert res["service.name"] == "from-ctx"  # process context over OTEL_SERVICE_NAME
    assert res["service.version"] == "2.0"
    assert res["service.namespace"] == "ml"  # environment fills what the context lacks
    assert res["deployment.environment.name"] == "prod"
    assert res["process.pid"] == pub.pid
    assert res["process.executable.path"] == os.readlink(f"/proc/{pub.pid}/exe")
    assert res["process.executable.name"] == os.path.basename(os.readlink(f"/proc/{pub.pid}/exe"))
    assert res["host.name"] == "node-1"
    creation = res["process.creation.time"]
    assert isinstance(creation, str) and creation.endswith("Z")
