"""ProcfsReader and the cgroup rules against fake procfs trees (tests/testdata/proc/)."""

from __future__ import annotations

import os

import pytest
from gpumetrics.identity.cgroup import container_id, main_cgroup_path
from gpumetrics.identity.procfs import ProcfsReader, parse_environ, parse_stat, select_environ

from .conftest import PROC, load_cases

CGROUP_CASES = load_cases("cgroup_cases.yaml")
PROFILER_CASES = load_cases("ebpf_profiler_container_id_cases.yaml")
K8S_CID = "3f2b8e1c9d7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c"


def _reader(tree: str = "host", **kw: object) -> ProcfsReader:
    kw.setdefault("user_name", {1000: "alice", 0: "root"}.get)
    return ProcfsReader(str(PROC / tree), **kw)  # type: ignore[arg-type]


def _cgroup_text(case: dict) -> str:
    return case["cgroup"].replace("{pad}", "x" * case.get("pad", 0))


@pytest.mark.parametrize("case", CGROUP_CASES, ids=[c["id"] for c in CGROUP_CASES])
def test_container_id(case: dict) -> None:
    text = _cgroup_text(case)
    assert container_id(text) == case["container_id"]
    assert container_id(text.encode()) == case["container_id"]


@pytest.mark.parametrize("case", PROFILER_CASES, ids=[c["id"] for c in PROFILER_CASES])
def test_container_id_as_the_ebpf_profiler(case: dict) -> None:
    """The eBPF profiler's own TestExtractContainerID strings give its own expectations."""
    assert container_id(case["cgroup"].encode()) == case["container_id"]


def test_container_id_line_limit_counts_bytes() -> None:
    """A line of two-byte characters: 8 193 bytes in 4 131 characters ends the scan."""
    cid = "ab" * 32
    line = f"0::/{'é' * 4062}/{cid}"
    assert len(line.encode()) >= 8192 > len(line)
    assert container_id(line.encode()) is None
    assert container_id(line) is None


@pytest.mark.parametrize(
    "case", [c for c in CGROUP_CASES if "cgroup_path" in c], ids=lambda c: c["id"]
)
def test_main_cgroup_path(case: dict) -> None:
    assert main_cgroup_path(case["cgroup"]) == case["cgroup_path"]


def test_full_process() -> None:
    info = _reader().read(4242)
    assert info is not None
    assert info.start_time_ticks == 123456
    assert info.ppid == 4200
    assert info.comm == "python3"
    assert info.exe_target == info.exe_path == "/usr/bin/python3.11"
    assert info.exe_name == "python3.11"
    assert info.cmdline == ("python3", "train.py", "--epochs", "3")
    assert info.uid == 1000  # the real uid, not the effective 1001
    assert info.owner == "alice"
    # only OTEL_* kept, raw bytes, the first of a duplicated name wins (as getenv)
    assert info.environ == {
        "OTEL_SERVICE_NAME": b"trainer",
        "OTEL_RESOURCE_ATTRIBUTES": b"deployment.environment.name=prod,service.name=ignored",
    }
    assert info.env_vars == {}  # none configured
    assert info.container_id == K8S_CID
    assert info.cgroup_path is not None and info.cgroup_path.endswith(K8S_CID + ".scope")


def test_missing_files_are_none_not_errors() -> None:
    info = _reader().read(5000)
    assert info is not None
    assert info.comm == "kworker/0:1"
    assert (info.exe_target, info.exe_path, info.exe_name, info.cmdline) == (None,) * 4
    assert (info.uid, info.owner, info.environ, info.env_vars) == (None,) * 4
    assert (info.cgroup, info.container_id, info.cgroup_path) == (None,) * 3


def test_comm_with_parens_deleted_exe_and_cgroup_v1() -> None:
    r = _reader()
    info = r.read(6000)
    assert info is not None
    assert info.start_time_ticks == 777 and info.ppid == 1
    assert info.comm == "my (odd) ) name"
    assert info.exe_target == "/opt/app/server (deleted)"  # as readlink says: the profiler's
    assert info.exe_path == "/opt/app/server"  # " (deleted)" trimmed: parca-agent's
    assert info.cmdline == ()
    assert info.owner == "root"
    assert info.container_id == "ab" * 32
    assert info.cgroup_path == "/docker/" + "ab" * 32  # the cpu controller's line


def test_gone_or_malformed_process_is_none() -> None:
    r = _reader()
    assert r.read(99999) is None
    assert r.start_time_ticks(99999) is None
    assert r.read(7000) is None  # truncated stat
    assert r.comm(7000) == "trunc"  # other files are still readable one by one
    assert r.read(0) is None and r.read(-1) is None


def test_unresolvable_uid_has_no_owner() -> None:
    info = _reader(user_name=lambda uid: None).read(4242)
    assert info is not None and info.uid == 1000 and info.owner is None
    info = _reader(resolve_user_names=False).read(6000)
    assert info is not None and info.uid == 0 and info.owner is None


def test_creation_time_from_btime_and_ticks() -> None:
    r = _reader()
    tck = r.clock_ticks_per_second
    assert r.boot_time_ns() == 1_700_000_000 * 10**9
    assert r.creation_time_ns(123456) == 1_700_000_000 * 10**9 + 123456 * 10**9 // tck


def test_no_btime_no_creation_time(tmp_path) -> None:
    r = ProcfsReader(str(tmp_path), host_pid_namespace=True)
    assert r.creation_time_ns(100) is None


def test_parse_stat_rejects_garbage() -> None:
    assert parse_stat("") is None
    assert parse_stat("1 (x) S") is None
    assert parse_stat("1 (x) S a " + "0 " * 30) is None


def test_parse_environ_skips_malformed_entries() -> None:
    assert parse_environ(b"OTEL_X\x00OTEL_\xff=1\x00OTEL_Y=a=b\x00") == {"OTEL_Y": b"a=b"}


def test_configured_variables_as_the_profiler_captures_them() -> None:
    """The last occurrence wins (the profiler fills a map in order; getenv would take the
    first), values are raw bytes, any name can be configured."""
    info = _reader(include_env_vars=["OTEL_SERVICE_NAME", "HOME", "LANG", "NOT_SET"]).read(4242)
    assert info is not None
    assert info.env_vars == {"OTEL_SERVICE_NAME": b"second", "HOME": b"/root"}
    assert info.environ is not None and info.environ["OTEL_SERVICE_NAME"] == b"trainer"
    data = b"A=1\x00A\x00B=\x00=x\x00A=2=3\x00C=\xff\x00"
    names = frozenset({b"A", b"B", b"C"})
    assert select_environ(data, names) == {"A": b"2=3", "B": b"", "C": b"\xff"}
    assert select_environ(data, frozenset()) == {}


def test_f15_detects_host_namespace_from_init_link() -> None:
    assert _reader("host").in_host_pid_namespace is True
    assert _reader("container").in_host_pid_namespace is False


def test_f15_container_namespace_never_names_host_pids() -> None:
    """F15: pid 3412002 exists in the container's /proc as an unrelated `bash`."""
    r = _reader("container")
    assert os.path.exists(PROC / "container" / "3412002" / "comm")  # the trap is really there
    assert r.read(3412002) is None
    assert r.comm(3412002) is None
    assert r.exe(3412002) is None
    assert r.start_time_ticks(3412002) is None


def test_f15_configuration_overrides_detection() -> None:
    assert _reader("container", host_pid_namespace=True).comm(3412002) == "bash"
    assert _reader("host", host_pid_namespace=False).comm(4242) is None


def test_f15_unknown_namespace_is_treated_as_foreign(tmp_path, caplog) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "stat").write_text("1 (init) S 0 " + "0 " * 40)
    caplog.set_level("WARNING", logger="gpumetrics.identity.procfs")
    r = ProcfsReader(str(tmp_path))
    assert r.in_host_pid_namespace is False
    assert r.in_host_pid_namespace is False
    warnings = [m for m in caplog.messages if "host_pid_namespace" in m]
    assert len(warnings) == 1  # logged once


def test_f15_self_link_fallback(tmp_path) -> None:
    (tmp_path / "self" / "ns").mkdir(parents=True)
    os.symlink("pid:[4026531836]", tmp_path / "self" / "ns" / "pid")
    assert ProcfsReader(str(tmp_path)).in_host_pid_namespace is True


def test_this_machine() -> None:
    """The real /proc: our own process is readable and its start time is stable."""
    r = ProcfsReader("/proc", host_pid_namespace=True)
    pid = os.getpid()
    info = r.read(pid)
    assert info is not None
    assert info.start_time_ticks == r.start_time_ticks(pid)
    assert info.exe_path is not None and os.path.basename(info.exe_path) == info.exe_name
