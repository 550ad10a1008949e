"""DeclaredStore: validation with named fields, pid reuse, exits, resync, bounds, threads."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from gpumetrics.identity.attrs import to_key_values
from gpumetrics.identity.ctxproto import encode_process_context
from gpumetrics.identity.declaration import DeclarationError, DeclarationInput
from gpumetrics.identity.declared import DeclaredStore
from opentelemetry.proto.resource.v1 import resource_pb2

CTX = encode_process_context({"service.name": "from-ctx", "n": 3}, {"extra": "x"})


def resource_bytes(attrs: dict) -> bytes:
    res = resource_pb2.Resource()
    to_key_values(res.attributes, attrs)
    return res.SerializeToString()


PROF = resource_bytes({"container.id": "abc", "k8s.pod.name": "p-0"})


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000_000_000

    def __call__(self) -> int:
        return self.now


class Live:
    """start_time_reader stand-in: pid → start ticks (None = gone)."""

    def __init__(self, starts: dict[int, int] | None = None) -> None:
        self.starts = dict(starts or {})
        self.calls = 0

    def __call__(self, pid: int) -> int | None:
        self.calls += 1
        return self.starts.get(pid)


def store(**kw) -> DeclaredStore:
    kw.setdefault("clock", Clock())
    return DeclaredStore(**kw)


def test_declare_decodes_everything() -> None:
    clock = Clock()
    s = store(clock=clock, start_time_reader=Live({42: 100}))
    env = [("OTEL_SERVICE_NAME", b"svc"), ("OTEL_RESOURCE_ATTRIBUTES", b"a=\xff")]
    d = s.declare(42, 100, CTX, env, PROF, declarer="agent-1")
    assert (d.pid, d.start_time_ticks, d.declarer) == (42, 100, "agent-1")
    assert d.declared_at_ns == clock.now
    assert d.context_resource == {"service.name": "from-ctx", "n": 3}
    assert d.context_attributes == {"extra": "x"}
    assert d.has_process_context
    assert d.environment == {"OTEL_SERVICE_NAME": b"svc", "OTEL_RESOURCE_ATTRIBUTES": b"a=\xff"}
    assert d.profiler_attributes == {"container.id": "abc", "k8s.pod.name": "p-0"}
    assert s.lookup(42) == (d, True)
    assert len(s) == 1


def test_any_captured_variable_name_is_accepted() -> None:
    """A profiler configured with -env-vars=CUDA_VISIBLE_DEVICES reports that variable as
    process.environment_variable.CUDA_VISIBLE_DEVICES; its declaration must not be refused."""
    env = [("CUDA_VISIBLE_DEVICES", b"0,1"), ("my var", b""), ("OTEL_SERVICE_NAME", b"svc")]
    d = store().declare(7, 0, b"", env, b"")
    assert d.environment == dict(env)


def test_empty_fields_are_empty() -> None:
    d = store().declare(7, 0, b"", [], b"")
    assert not d.has_process_context
    assert dict(d.context_resource) == {} and dict(d.environment) == {}
    assert dict(d.profiler_attributes) == {}


BAD = [
    ({"pid": 0}, "pid", "1..4194304"),
    ({"pid": 4194305}, "pid", "1..4194304"),
    ({"pid": True}, "pid", "integer"),
    ({"start_time_ticks": -1}, "start_time_ticks", "0..2^64-1"),
    ({"start_time_ticks": 2**64}, "start_time_ticks", "0..2^64-1"),
    ({"process_context": b"\x00" * 65537}, "process_context", "65537 bytes exceed the limit"),
    ({"process_context": b"\x0a\x05\x0a"}, "process_context", "not a ProcessContext: Error"),
    ({"process_context": "text"}, "process_context", "must be bytes"),
    ({"environment": [("", b"x")]}, "environment[0].name", "non-empty"),
    ({"environment": [("OTEL_A", b"1"), ("A=B", b"/")]}, "environment[1].name", "'='"),
    ({"environment": [("OTEL_A\x00B", b"1")]}, "environment[0].name", "NUL"),
    (
        {"environment": [("OTEL_A", b"1"), ("OTEL_B", b"2"), ("OTEL_A", b"3")]},
        "environment[2].name",
        "duplicate of environment[0].name",
    ),
    ({"environment": [("OTEL_A", b"a\x00b")]}, "environment[0].value", "NUL"),
    ({"environment": [("OTEL_A", "str")]}, "environment[0].value", "must be bytes"),
    ({"environment": [("OTEL_A",)]}, "environment[0]", "(name, value) pair"),
    ({"environment": [("OTEL_A", b"x" * 65536)]}, "environment", "more than 65536 bytes"),
    ({"environment": [(f"OTEL_{i}", b"") for i in range(257)]}, "environment", "257 variables"),
    ({"profiler_resource": b"\x0a\x02\x0a"}, "profiler_resource", "not a Resource"),
    ({"profiler_resource": b"\x00" * 65537}, "profiler_resource", "exceed the limit"),
]


@pytest.mark.parametrize(("override", "field", "reason"), BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_rejection_names_the_field_and_keeps_what_was_held(override, field, reason) -> None:
    s = store()
    held = s.declare(42, 100, CTX, [("OTEL_SERVICE_NAME", b"old")], PROF)
    args: dict[str, Any] = {
        "pid": 42,
        "start_time_ticks": 100,
        "process_context": b"",
        "environment": [],
        "profiler_resource": b"",
    }
    args.update(override)
    with pytest.raises(DeclarationError) as err:
        s.declare(**args)
    assert err.value.field == field
    assert reason in err.value.reason
    assert err.value.reason.count(reason.split(":")[0]) == 1, "a prefix said twice"
    assert str(err.value) == f"{field}: {err.value.reason}"
    assert isinstance(err.value, ValueError)
    assert s.lookup(42) == (held, True)  # nothing already held changed
    assert len(s) == 1
    assert s.stats().rejected == 1


def test_configured_limits_apply() -> None:
    s = store(max_process_context_bytes=10, max_environment_bytes=8, pid_max=100)
    with pytest.raises(DeclarationError, match="^pid: must be an integer in 1..100"):
        s.declare(101, 0, b"", [], b"")
    with pytest.raises(DeclarationError, match="^process_context: .* exceed the limit of 10"):
        s.declare(1, 0, CTX, [], b"")
    with pytest.raises(DeclarationError, match="^environment: more than 8 bytes"):
        s.declare(1, 0, b"", [("OTEL_ABC", b"x")], b"")
    with pytest.raises(ValueError, match="max_processes: must be >= 1"):
        DeclaredStore(max_processes=0)


def test_f16_reused_pid_does_not_inherit_identity() -> None:
    live = Live({4242: 1000})
    s = store(start_time_reader=live)
    s.declare(4242, 1000, b"", [("OTEL_SERVICE_NAME", b"python")], b"")
    assert s.lookup(4242)[1] is True
    live.starts[4242] = 5000  # the pid now belongs to another process (ffmpeg)
    assert s.lookup(4242) == (None, False)
    assert s.stats().released_stale == 1
    assert len(s) == 0
    live.starts[4242] = 1000  # released for good: a later lookup does not resurrect it
    assert s.lookup(4242) == (None, False)


def test_unknown_start_times() -> None:
    live = Live({1: 50})
    s = store(start_time_reader=live)
    d0 = s.declare(1, 0, b"", [], b"")  # profiler did not know the start time
    assert s.lookup(1) == (d0, True)  # matched on pid alone
    d2 = s.declare(2, 70, b"", [], b"")
    assert s.lookup(2) == (d2, True)  # live start unknown (not visible): cannot be disproved
    assert s.get(2, 71) == (None, False)
    assert store().lookup(99) == (None, False)


def test_redeclaring_replaces() -> None:
    s = store()
    s.declare(5, 10, b"", [("OTEL_SERVICE_NAME", b"a")], b"")
    d = s.declare(5, 11, b"", [("OTEL_SERVICE_NAME", b"b")], b"")
    assert s.get(5, 11) == (d, True)
    assert len(s) == 1 and s.stats().declared == 2


def test_exit() -> None:
    s = store()
    s.declare(5, 10, b"", [], b"")
    s.declare(6, 0, b"", [], b"")
    assert s.exit(5, 11) == 0  # another process's exit
    assert s.exit(5, 10) == 1
    assert s.exit(5, 10) == 0
    assert s.exit(6, 99) == 1  # held with unknown start: released by pid
    s.declare(7, 10, b"", [], b"")
    assert s.exit(7) == 1  # 0 releases whatever the pid holds
    assert s.stats().released_exit == 3 and len(s) == 0
    with pytest.raises(DeclarationError) as err:
        s.exit(0)
    assert err.value.field == "pid"


def test_resync_releases_what_was_not_redeclared() -> None:
    s = store()
    for pid in (1, 2, 3):
        s.declare(pid, 0, b"", [], b"", declarer="a")
    s.declare(10, 0, b"", [], b"", declarer="b")
    resync = s.begin_resync("a")
    s.declare(1, 0, b"", [], b"", declarer="a")
    s.declare(4, 0, b"", [], b"", declarer="a")
    with pytest.raises(DeclarationError):  # a rejected re-declaration keeps the old one
        s.declare(2, 0, b"garbage", [], b"", declarer="a")
    s.declare(11, 0, b"", [], b"", declarer="b")  # another declarer during a's resync
    assert s.end_resync(resync) == 1  # pid 3
    assert {pid for pid in (1, 2, 3, 4, 10, 11) if s.get(pid, None)[1]} == {1, 2, 4, 10, 11}
    assert s.stats().released_resync == 1
    with pytest.raises(DeclarationError) as err:
        s.end_resync(resync)
    assert err.value.field == "resync_end"


def test_replace_all_batch() -> None:
    s = store()
    for pid in (1, 2, 3):
        s.declare(pid, 0, b"", [], b"", declarer="a")
    errors: list[tuple[int, str]] = []
    released = s.replace_all(
        "a",
        [
            DeclarationInput(1, 0),
            DeclarationInput(5, 0, CTX, [("OTEL_SERVICE_NAME", b"x")], PROF),
            DeclarationInput(0, 0),  # rejected, does not stop the batch
        ],
        on_error=lambda i, e: errors.append((i, e.field)),
    )
    assert released == 2  # pids 2 and 3
    assert errors == [(2, "pid")]
    assert sorted(pid for pid in range(1, 6) if s.get(pid, None)[1]) == [1, 5]


def test_bounded_evicts_oldest() -> None:
    s = store(max_processes=3)
    for pid in (1, 2, 3):
        s.declare(pid, 0, b"", [], b"")
    s.declare(1, 0, b"", [], b"")  # re-declared: now the newest
    s.declare(4, 0, b"", [], b"")
    assert [pid for pid in range(1, 5) if s.get(pid, None)[1]] == [1, 3, 4]
    assert s.stats().evicted_oldest == 1 and len(s) == 3


def test_bounded_evicts_exited_and_reused_first() -> None:
    clock = Clock()
    live = Live({1: 10, 2: 20, 3: 30})
    s = store(max_processes=3, start_time_reader=live, clock=clock, sweep_interval_ns=100)
    for pid in (1, 2, 3):
        s.declare(pid, pid * 10, b"", [], b"")
    del live.starts[2]  # exited
    live.starts[3] = 31  # reused
    s.declare(4, 40, b"", [], b"")
    assert [pid for pid in range(1, 5) if s.get(pid, None)[1]] == [1, 4]
    st = s.stats()
    assert (st.evicted_stale, st.evicted_oldest) == (2, 0)
    # within the sweep interval a full store evicts the oldest without reading procfs again
    s.declare(5, 50, b"", [], b"")
    s.declare(6, 60, b"", [], b"")
    calls = live.calls
    s.declare(7, 70, b"", [], b"")
    assert live.calls == calls
    assert s.stats().evicted_oldest >= 1 and len(s) == 3
    clock.now += 100
    del live.starts[1]
    s.declare(8, 80, b"", [], b"")
    assert live.calls > calls  # swept again after the interval


@pytest.mark.parametrize("max_processes", [500, 2000])
def test_threads_declare_while_producer_looks_up(max_processes: int) -> None:
    # Live({}) says every pid is gone, so once the store is full a sweep releases everything
    # held, including a pid another thread declared and has not exited yet: that exit then finds
    # nothing and releases 0. Which exits miss depends on the threads' interleaving, so the
    # assertions count what each exit() returned instead of assuming none missed. With room for
    # every declaration (2000) nothing is evicted and every exit must release exactly one.
    s = store(max_processes=max_processes, start_time_reader=Live({}))
    n_threads, per_thread = 4, 300
    barrier = threading.Barrier(n_threads + 1)
    errors: list[BaseException] = []
    released = [0] * n_threads
    missed = [0] * n_threads

    def declarer(t: int) -> None:
        barrier.wait()
        try:
            for i in range(per_thread):
                pid = 1 + t * per_thread + i
                s.declare(pid, pid, CTX, [("OTEL_SERVICE_NAME", b"x")], PROF, declarer=str(t))
                if i % 3 == 0:
                    n = s.exit(pid, pid)
                    released[t] += n
                    missed[t] += 1 - n
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    found = 0

    def producer() -> None:
        nonlocal found
        barrier.wait()
        for _ in range(3):
            for pid in range(1, n_threads * per_thread + 1):
                d, ok = s.lookup(pid)
                if ok:
                    assert d is not None and d.pid == pid
                    found += 1

    threads = [threading.Thread(target=declarer, args=(t,)) for t in range(n_threads)]
    threads.append(threading.Thread(target=producer))
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    assert errors == []
    st = s.stats()
    exits = n_threads * per_thread // 3
    assert st.declared == n_threads * per_thread
    assert sum(released) + sum(missed) == exits
    assert st.released_exit == sum(released)
    evicted = st.evicted_oldest + st.evicted_stale
    assert sum(missed) <= evicted  # an exit misses only a pid that eviction released first
    if max_processes >= n_threads * per_thread:
        assert evicted == 0 and st.released_exit == exits
    assert st.processes == len(s) <= max_processes
    assert st.processes == st.declared - st.released_exit - evicted - st.released_stale


def test_resyncs_in_progress_are_bounded_and_can_be_abandoned() -> None:
    s = DeclaredStore(max_resyncs=2)
    s.declare(1, 0, b"", [], b"", declarer="a")
    a = s.begin_resync("a")
    s.begin_resync("b")
    with pytest.raises(DeclarationError) as err:
        s.begin_resync("c")
    assert err.value.field == "resync_begin"
    assert s.abort_resync(a) is True
    assert s.abort_resync(a) is False
    s.begin_resync("c")  # the slot a held is free again
    assert s.get(1, None)[1]  # abandoning released nothing
    with pytest.raises(DeclarationError):
        s.end_resync(a)
