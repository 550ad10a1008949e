"""OTEP 4719 reader against a context published by a real child process, and its faults."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gpumetrics.identity.attrs import AttrValue
from gpumetrics.identity.ctxproto import (
    ProcessContextDecodeError,
    decode_process_context,
    encode_process_context,
)
from gpumetrics.identity.processctx import (
    MemFile,
    ProcessContextReader,
    ReadStatus,
    _OsMemFile,
    find_mapping,
)

from .ctx_publisher import Publisher

RESOURCE: dict[str, AttrValue] = {
    "deployment.environment.name": "prod",
    "service.instance.id": "0f8b5a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b",
    "service.name": "trainer",
    "service.version": "1.2.3",
    "telemetry.sdk.language": "python",
    "telemetry.sdk.version": "1.45.0",
    "telemetry.sdk.name": "opentelemetry",
    "gpu.count": 8,
    "enabled": True,
    "ratio": 0.5,
    "tags": ["a", "b"],
}
EXTRA = {"threadlocal.schema_version": "tlsdesc_v1_dev"}
PAYLOAD = encode_process_context(RESOURCE, EXTRA)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def pub() -> Iterator[Publisher]:
    p = Publisher()
    try:
        yield p
    finally:
        p.close()


def _start(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rpartition(")")[2].split()[19])


class Hooked:
    """A mem opener that calls ``hook(n, size, offset)`` after the n-th read of each open."""

    def __init__(self, hook: Callable[[int, int, int], None]) -> None:
        self.hook = hook
        self.reads: list[tuple[int, int]] = []

    def __call__(self, path: str) -> MemFile:
        inner = _OsMemFile(path)
        outer = self

        class _File:
            n = 0

            def pread(self, size: int, offset: int) -> bytes:
                data = inner.pread(size, offset)
                self.n += 1
                outer.reads.append((size, offset))
                outer.hook(self.n, size, offset)
                return data

            def close(self) -> None:
                inner.close()

        return _File()


def test_payload_roundtrip_without_a_process() -> None:
    decoded = decode_process_context(PAYLOAD)
    assert decoded.resource == RESOURCE
    assert decoded.attributes == EXTRA
    assert decode_process_context(b"").resource == {}


@pytest.mark.parametrize(
    "payload",
    [
        b"\x0a\x05\x0a",  # field 1 claims 5 bytes, has 1
        b"\x0a\x03\x0a\x01\xff",  # resource > KeyValue whose only byte is a truncated tag
        b"\x0a\x07\x0a\x05\x0a\x03\x0a\x01\xff",  # resource > KeyValue > key b"\xff": not UTF-8
        b"\x12\x03\x0a\x01\xff",  # attributes[0].key b"\xff": not UTF-8
        b"\x00",  # field number 0
        b"\x0b",  # field 1 with wire type 3 (start group)
    ],
)
def test_payload_decode_errors(payload: bytes) -> None:
    with pytest.raises(ProcessContextDecodeError, match="^not a ProcessContext: "):
        decode_process_context(payload)


def test_field_with_another_wire_type_is_an_unknown_field() -> None:
    # Protobuf's rule (and so every generated reader's, the eBPF profiler's Go one included):
    # field 1 as a varint is not the `resource` message but an unknown field, skipped.
    assert decode_process_context(b"\x08\x01" + PAYLOAD) == decode_process_context(PAYLOAD)
    assert decode_process_context(b"\x08\x01").resource == {}


def test_unknown_fields_skipped_and_resource_merged() -> None:
    one = encode_process_context({"a": "1"})
    two = encode_process_context({"b": "2"})
    unknown = b"\x18\x07" + b"\x25\x00\x00\x00\x00"  # field 3 varint, field 4 fixed32
    assert decode_process_context(one + unknown + two).resource == {"a": "1", "b": "2"}


def test_ptrace_read_permitted(pub: Publisher) -> None:
    """Reading another process's memory needs ptrace access; fail loudly if this host blocks it."""
    info = pub.publish(PAYLOAD)
    try:
        fd = os.open(f"/proc/{pub.pid}/mem", os.O_RDONLY)
        try:
            header = os.pread(fd, 8, info["header"])
        finally:
            os.close(fd)
    except OSError as exc:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope")
        detail = scope.read_text().strip() if scope.exists() else "no Yama"
        pytest.fail(f"cannot read /proc/<child>/mem ({exc}); ptrace_scope={detail}")
    assert header == b"OTEL_CTX"


def test_roundtrip_memfd(pub: Publisher) -> None:
    info = pub.publish(PAYLOAD)
    addr = find_mapping(f"/proc/{pub.pid}/maps")
    assert addr == info["header"]
    with open(f"/proc/{pub.pid}/maps") as fh:
        assert any("/memfd:OTEL_CTX" in line for line in fh)
    reader = ProcessContextReader(clock=FakeClock())
    got = reader.read(pub.pid, _start(pub.pid))
    assert got.status is ReadStatus.OK and not got.cached
    assert got.context is not None
    assert got.context.resource == RESOURCE
    assert got.context.attributes == EXTRA
    assert got.context.published_at_ns == info["ts"]


def test_unchanged_timestamp_uses_cache_without_payload_read(pub: Publisher) -> None:
    pub.publish(PAYLOAD)
    hooked = Hooked(lambda n, size, off: None)
    reader = ProcessContextReader(clock=FakeClock(), opener=hooked)
    first = reader.read(pub.pid, _start(pub.pid))
    hooked.reads.clear()
    second = reader.read(pub.pid, _start(pub.pid))
    assert second.status is ReadStatus.OK and second.cached
    assert second.context is first.context
    assert hooked.reads == [(32, pub.call("noop")["header"])]  # the header only


def test_update_is_seen(pub: Publisher) -> None:
    pub.publish(PAYLOAD)
    reader = ProcessContextReader(clock=FakeClock())
    start = _start(pub.pid)
    assert reader.read(pub.pid, start).status is ReadStatus.OK
    newer = encode_process_context({"service.name": "v2"})
    ts = pub.update(newer)["ts"]
    got = reader.read(pub.pid, start)
    assert got.status is ReadStatus.OK and not got.cached
    assert got.context is not None and got.context.resource == {"service.name": "v2"}
    assert got.context.published_at_ns == ts


def test_torn_update_retries_and_reads_the_new_payload(pub: Publisher) -> None:
    pub.publish(PAYLOAD)
    newer = encode_process_context({"service.name": "after-update"})

    def hook(n: int, size: int, offset: int) -> None:
        if n == 2:  # right after the first payload read, before the timestamp is re-read
            pub.update(newer)

    hooked = Hooked(hook)
    reader = ProcessContextReader(clock=FakeClock(), opener=hooked)
    got = reader.read(pub.pid, _start(pub.pid))
    assert got.status is ReadStatus.OK
    assert got.context is not None and got.context.resource == {"service.name": "after-update"}
    sizes = [size for size, _ in hooked.reads]
    assert sizes == [32, len(PAYLOAD), 8, 32, len(newer), 8]  # exactly one retry


def test_torn_every_time_gives_up_after_bounded_attempts(pub: Publisher) -> None:
    pub.publish(PAYLOAD)
    start = _start(pub.pid)
    reader_ok = ProcessContextReader(clock=FakeClock())
    updates: list[int] = []

    def hook(n: int, size: int, offset: int) -> None:
        if size not in (8, 32):  # every payload read is followed by a concurrent update
            updates.append(pub.update(encode_process_context({"n": len(updates)}))["ts"])

    reader = ProcessContextReader(clock=FakeClock(), opener=Hooked(hook), max_attempts=3)
    got = reader.read(pub.pid, start)
    assert got.status is ReadStatus.CONCURRENT_UPDATE
    assert got.context is None  # nothing earlier to keep
    assert len(updates) == 3
    # a reader that already had a context keeps it through torn reads
    before = reader_ok.read(pub.pid, start).context
    assert before is not None
    pub.update(encode_process_context({"service.name": "changed"}))
    reader_ok._open = Hooked(hook)  # type: ignore[assignment]
    kept = reader_ok.read(pub.pid, start)
    assert kept.status is ReadStatus.CONCURRENT_UPDATE and kept.context is before
    assert len(updates) == 6


def test_timestamp_zero_means_retry_then_keep_previous(pub: Publisher) -> None:
    pub.publish(PAYLOAD)
    start = _start(pub.pid)
    reader = ProcessContextReader(clock=FakeClock())
    fresh = ProcessContextReader(clock=FakeClock())
    before = reader.read(pub.pid, start).context
    assert before is not None
    pub.call("set", field="ts", value=0)  # an update in progress that never finishes
    held = reader.read(pub.pid, start)
    assert held.status is ReadStatus.IN_PROGRESS and held.context is before
    first = fresh.read(pub.pid, start)
    assert first.status is ReadStatus.IN_PROGRESS and first.context is None
    assert fresh.stats()["in_progress"] == 1


@pytest.mark.parametrize(
    ("field", "value", "status"),
    [
        ("version", 1, ReadStatus.BAD_VERSION),
        ("version", 3, ReadStatus.BAD_VERSION),
        ("size", 0, ReadStatus.BAD_SIZE),
        ("size", 65537, ReadStatus.BAD_SIZE),
    ],
)
def test_invalid_header_gives_no_context(pub: Publisher, field: str, value: int, status) -> None:
    pub.publish(PAYLOAD)
    start = _start(pub.pid)
    reader = ProcessContextReader(clock=FakeClock())
    assert reader.read(pub.pid, start).status is ReadStatus.OK
    pub.call("set", field=field, value=value)
    got = reader.read(pub.pid, start)
    assert got.status is status and got.context is None


def test_oversize_payload_published_is_rejected(pub: Publisher) -> None:
    big = encode_process_context({"blob": "x" * 70000})
    assert len(big) > 65536
    pub.publish(big)
    got = ProcessContextReader(clock=FakeClock()).read(pub.pid, _start(pub.pid))
    assert got.status is ReadStatus.BAD_SIZE and got.context is None


def test_largest_payload_is_accepted(pub: Publisher) -> None:
    payload = encode_process_context({"blob": "y" * 65520})
    payload = encode_process_context({"blob": "y" * (65520 + 65536 - len(payload))})
    assert len(payload) == 65536
    pub.publish(payload)
    got = ProcessContextReader(clock=FakeClock()).read(pub.pid, _start(pub.pid))
    assert got.status is ReadStatus.OK and got.context is not None


def test_garbage_payload_is_a_decode_error(pub: Publisher) -> None:
    pub.publish(b"\xff\xff\xff")
    got = ProcessContextReader(clock=FakeClock()).read(pub.pid, _start(pub.pid))
    assert got.status is ReadStatus.DECODE_ERROR and got.context is None


def test_process_exiting_mid_read(pub: Publisher) -> None:
    pub.publish(PAYLOAD)
    start = _start(pub.pid)

    def hook(n: int, size: int, offset: int) -> None:
        if n == 1:  # header read; the process exits before the payload is read
            pub.exit()

    reader = ProcessContextReader(clock=FakeClock(), opener=Hooked(hook))
    got = reader.read(pub.pid, start)
    assert pub.proc.returncode == 0
    assert got.status is ReadStatus.UNREADABLE and got.context is None
    again = reader.read(pub.pid, start)  # gone: no maps, no mem
    assert again.status in (ReadStatus.NO_MAPPING, ReadStatus.UNREADABLE)
    assert again.context is None


def test_unmapped_context_is_no_longer_used(pub: Publisher) -> None:
    pub.publish(PAYLOAD)
    start = _start(pub.pid)
    reader = ProcessContextReader(clock=FakeClock())
    assert reader.read(pub.pid, start).status is ReadStatus.OK
    pub.call("unmap")
    assert reader.read(pub.pid, start).context is None
    assert reader.read(pub.pid, start).status is ReadStatus.NO_MAPPING


def test_late_publication_found_after_rescan_interval(pub: Publisher) -> None:
    clock = FakeClock()
    reader = ProcessContextReader(clock=clock, rescan_interval_ns=10)
    start = _start(pub.pid)
    assert reader.read(pub.pid, start).status is ReadStatus.NO_MAPPING
    pub.publish(PAYLOAD)
    assert reader.read(pub.pid, start).status is ReadStatus.NO_MAPPING  # negative cache
    clock.now += 10
    assert reader.read(pub.pid, start).status is ReadStatus.OK


def test_other_start_time_is_another_process(pub: Publisher) -> None:
    pub.publish(PAYLOAD)
    reader = ProcessContextReader(clock=FakeClock())
    start = _start(pub.pid)
    first = reader.read(pub.pid, start)
    other = reader.read(pub.pid, start + 1)  # as if the pid had been reused
    assert other.status is ReadStatus.OK and not other.cached
    assert other.context is not first.context


def _fake_root(tmp_path: Path, pid: int, maps_line: str) -> str:
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "maps").write_text(
        "55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 1234 /usr/bin/python3.11\n" + maps_line
    )
    os.symlink(f"/proc/{pid}/mem", tmp_path / str(pid) / "mem")
    return str(tmp_path)


@pytest.mark.parametrize("name", ["[anon:OTEL_CTX]", "[anon_shmem:OTEL_CTX]"])
def test_anon_named_mapping_line(pub: Publisher, tmp_path: Path, name: str) -> None:
    """The maps line a named anonymous mapping produces, over the child's real memory.

    This kernel may lack CONFIG_ANON_VMA_NAME (see test_prctl_named_mapping), so the maps
    line is synthesised; the header and payload are still read from the live child.
    """
    info = pub.publish(PAYLOAD, mode="anon")
    addr = info["header"]
    line = f"{addr:x}-{addr + 4096:x} rw-p 00000000 00:00 0                          {name}\n"
    reader = ProcessContextReader(_fake_root(tmp_path, pub.pid, line), clock=FakeClock())
    got = reader.read(pub.pid, _start(pub.pid))
    assert got.status is ReadStatus.OK
    assert got.context is not None and got.context.resource == RESOURCE


def test_executable_mapping_is_ignored(pub: Publisher, tmp_path: Path) -> None:
    addr = pub.publish(PAYLOAD, mode="anon")["header"]
    line = f"{addr:x}-{addr + 4096:x} r-xp 00000000 00:00 0 [anon:OTEL_CTX]\n"
    reader = ProcessContextReader(_fake_root(tmp_path, pub.pid, line), clock=FakeClock())
    assert reader.read(pub.pid, _start(pub.pid)).status is ReadStatus.NO_MAPPING


def test_other_names_are_not_the_context(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "1000-2000 rw-p 00000000 00:00 0 [anon:OTEL_CTX_OTHER]\n"
        "3000-4000 rw-p 00000000 00:00 0 /tmp/OTEL_CTX\n"
        "5000-6000 rw-p 00000000 00:00 0 /memfd:OTEL_CTX (deleted)\n"
    )
    assert find_mapping(str(maps)) == 0x5000
    assert find_mapping(str(tmp_path / "missing")) is None


def test_prctl_named_mapping(pub: Publisher) -> None:
    """A mapping named by prctl(PR_SET_VMA_ANON_NAME) in a real process (Linux >= 5.17)."""
    info = pub.publish(PAYLOAD, mode="anon_named")
    if not info["named"]:
        pytest.skip(
            "kernel refused PR_SET_VMA_ANON_NAME "
            f"({errno.errorcode.get(info['errno'], info['errno'])}; needs CONFIG_ANON_VMA_NAME); "
            "the [anon:OTEL_CTX] line is covered by test_anon_named_mapping_line"
        )
    got = ProcessContextReader(clock=FakeClock()).read(pub.pid, _start(pub.pid))
    assert got.status is ReadStatus.OK
    assert got.context is not None and got.context.resource == RESOURCE


def test_unreadable_mem_is_no_context(pub: Publisher) -> None:
    pub.publish(PAYLOAD)

    def refuse(path: str) -> MemFile:
        raise PermissionError(errno.EACCES, "denied", path)

    got = ProcessContextReader(clock=FakeClock(), opener=refuse).read(pub.pid, _start(pub.pid))
    assert got.status is ReadStatus.UNREADABLE and got.context is None


def test_stats_count_outcomes(pub: Publisher) -> None:
    reader = ProcessContextReader(clock=FakeClock())
    reader.read(pub.pid, _start(pub.pid))
    stats = reader.stats()
    assert stats["no_mapping"] == 1 and stats["ok"] == 0 and stats["cached_processes"] == 1
    reader.forget(pub.pid)
    assert reader.stats()["cached_processes"] == 0
