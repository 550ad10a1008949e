"""Shared helpers of the identity tests: a fake procfs written from a case's ``procfs`` mapping,
and a ProcessResourcer built from a test vector (tests/testdata/identity/*_cases.yaml)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpumetrics.identity.attrs import to_key_values
from gpumetrics.identity.ctxproto import encode_process_context
from gpumetrics.identity.declared import DeclaredStore
from gpumetrics.identity.processctx import ContextRead, ProcessContext, ReadStatus
from gpumetrics.identity.procfs import ProcfsReader
from gpumetrics.identity.resourcer import ProcessResourcer, iso8601_ns, new_process_resourcer
from opentelemetry.proto.resource.v1 import resource_pb2

PID = 4242
BTIME = 1_700_000_000


def _stat(pid: int, comm: str, ppid: int, start: int) -> str:
    return f"{pid} ({comm}) S {ppid} " + "0 " * 17 + f"{start} " + "0 " * 30 + "\n"


def environ_bytes(environ: dict[str, str] | list[str]) -> bytes:
    """``environ`` file contents: a mapping, or raw entries (repeats and entries without ``=``
    allowed), each NUL-terminated, after a ``PATH`` entry as real environments have."""
    entries = [f"{k}={v}" for k, v in environ.items()] if isinstance(environ, dict) else environ
    return b"PATH=/bin\x00" + b"".join(e.encode() + b"\x00" for e in entries)


def make_proc(root: Path, proc: dict[str, Any] | None, foreign: bool = False) -> Path:
    """Write a fake procfs with pid 4242 as ``proc`` describes (keys: start, ppid, comm, exe,
    uid, environ, cgroup); ``None`` = the pid is not there."""
    (root / "1" / "ns").mkdir(parents=True)
    os.symlink("pid:[4026532999]" if foreign else "pid:[4026531836]", root / "1" / "ns" / "pid")
    (root / "stat").write_text(f"cpu 0\nbtime {BTIME}\n")
    if proc is None:
        return root
    d = root / str(PID)
    d.mkdir()
    (d / "stat").write_text(_stat(PID, proc.get("comm", "x"), proc.get("ppid", 1), proc["start"]))
    if "comm" in proc:
        (d / "comm").write_text(proc["comm"] + "\n")
    if "exe" in proc:
        os.symlink(proc["exe"], d / "exe")
    if "uid" in proc:
        (d / "status").write_text(f"Name:\tx\nUid:\t{proc['uid']}\t0\t0\t0\n")
    if "environ" in proc:
        (d / "environ").write_bytes(environ_bytes(proc["environ"]))
    if "cgroup" in proc:
        (d / "cgroup").write_text(proc["cgroup"] + "\n")
    return root


def resource_bytes(attrs: dict[str, Any]) -> bytes:
    """A serialized ``Resource`` with ``attrs`` (typed: int stays int_value)."""
    res = resource_pb2.Resource()
    to_key_values(res.attributes, attrs)
    return res.SerializeToString()


class StubContextReader:
    """Stands in for ProcessContextReader: a fixed context, and a count of reads."""

    def __init__(self, resource: dict[str, Any] | None, ts: int = 1) -> None:
        self.resource = resource
        self.ts = ts
        self.reads = 0

    def read(self, pid: int, start: int) -> ContextRead:
        self.reads += 1
        if self.resource is None:
            return ContextRead(None, ReadStatus.NO_MAPPING)
        return ContextRead(ProcessContext(self.resource, {}, self.ts), ReadStatus.OK)


class DictResolver:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels

    def labels_for_pid(self, pid: int) -> dict[str, str]:
        return self.labels


def declare(store: DeclaredStore, d: dict[str, Any]) -> None:
    """Declare pid 4242 as a case's ``declared`` mapping says (start, environment, context,
    profiler)."""
    ctx = d.get("context")
    store.declare(
        PID,
        d["start"],
        encode_process_context(ctx["resource"], ctx.get("attributes")) if ctx else b"",
        [(k, v.encode()) for k, v in d.get("environment", {}).items()],
        resource_bytes(d["profiler"]) if "profiler" in d else b"",
    )


def build(
    case: dict[str, Any], root: Path, mode: str, **kw: Any
) -> tuple[ProcessResourcer, StubContextReader]:
    """The resourcer a case describes, over a fake procfs under ``root``."""
    foreign = bool(case.get("foreign_pid_namespace"))
    make_proc(root, case.get("procfs"), foreign)
    cfg = case.get("config", {})
    procfs = ProcfsReader(
        str(root),
        user_name={1000: "alice", 65534: "nobody"}.get,
        include_env_vars=cfg.get("include_env_vars", ()),
    )
    store = None
    if "declared" in case:
        store = DeclaredStore(start_time_reader=procfs.start_time_ticks)
        declare(store, case["declared"])
    stub = StubContextReader(case.get("otel_ctx"))
    resolver = DictResolver(case["resolver"]) if "resolver" in case else None
    r = new_process_resourcer(
        resolver,
        store,
        cfg.get("node_name", ""),
        cfg.get("in_kubernetes", False),
        cfg.get("relabel_configs"),
        procfs=procfs,
        context_reader=stub,  # type: ignore[arg-type]
        host_name=cfg.get("host_name"),
        mode=mode,
        **kw,
    )
    return r, stub


def expected_resource(case: dict[str, Any]) -> dict[str, Any]:
    """A case's ``expected``, with ``$created`` replaced by the creation time it stands for."""
    expected = case["expected"]
    if "$created" not in expected.values():
        return expected
    procfs = ProcfsReader("/nonexistent", host_pid_namespace=True)
    if case.get("foreign_pid_namespace") or "procfs" not in case:
        start = case["declared"]["start"]
    else:
        start = case["procfs"]["start"]
    created = iso8601_ns(BTIME * 10**9 + start * 10**9 // procfs.clock_ticks_per_second)
    return {k: (created if v == "$created" else v) for k, v in expected.items()}
