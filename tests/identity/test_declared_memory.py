"""DeclaredStore memory: a byte budget on what is held, and resyncs that hold no per-pid state."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from gpumetrics.identity.declaration import DeclarationError
from gpumetrics.identity.declared import DeclaredStore
from gpumetrics.identity.footprint import declared_bytes
from opentelemetry.proto.resource.v1 import resource_pb2

KiB = 1024


def many_attributes(n: int, tag: str = "k") -> bytes:
    """A Resource of ``n`` short int attributes: small on the wire, large once decoded."""
    res = resource_pb2.Resource()
    for i in range(n):
        res.attributes.add(key=f"{tag}{i:05d}").value.int_value = 1000 + i
    return res.SerializeToString()


def one_long_attribute(size: int) -> bytes:
    res = resource_pb2.Resource()
    res.attributes.add(key="k").value.string_value = "x" * size
    return res.SerializeToString()


def test_what_is_charged_follows_the_decoded_size_not_the_wire_size() -> None:
    s = DeclaredStore()
    dense = s.declare(1, 0, b"", [], many_attributes(2000))
    flat = s.declare(2, 0, b"", [], one_long_attribute(len(many_attributes(2000))))
    assert len(many_attributes(2000)) <= len(one_long_attribute(len(many_attributes(2000)))) + 16
    assert declared_bytes(dense) > 4 * declared_bytes(flat)
    assert s.held_bytes == declared_bytes(dense) + declared_bytes(flat)
    s.exit(1)
    assert s.held_bytes == declared_bytes(flat)


def test_a_declaration_that_does_not_fit_is_rejected_naming_the_limit_and_nothing_is_lost():
    s = DeclaredStore(max_bytes=1024 * KiB)
    big = many_attributes(4000)  # about 60 KB on the wire, several hundred KB decoded
    held = []
    with pytest.raises(DeclarationError) as err:
        for pid in range(1, 100):
            s.declare(pid, 0, b"", [("OTEL_SERVICE_NAME", b"s")], big, declarer="a")
            held.append(pid)
    assert 1 <= len(held) < 20
    assert err.value.field == ""  # the declaration as a whole
    assert "identity.declared.max_bytes" in err.value.reason
    assert s.held_bytes <= 1024 * KiB
    st = s.stats()
    assert (st.processes, st.rejected, st.rejected_bytes) == (len(held), 1, 1)
    assert all(s.get(pid, None)[1] for pid in held)  # nothing held was evicted for it
    small = s.declare(500, 0, b"", [("OTEL_SERVICE_NAME", b"s")], b"")  # a small one still fits
    assert s.get(500, None) == (small, True)
    s.exit(held[0])
    s.declare(held[-1] + 1, 0, b"", [], big)  # room again after an exit


def test_replacing_a_declaration_needs_room_only_for_the_difference() -> None:
    big = many_attributes(3000)
    s = DeclaredStore()
    size = declared_bytes(s.declare(7, 0, b"", [], big))
    s = DeclaredStore(max_bytes=size + size // 2)
    s.declare(7, 0, b"", [], big)
    s.declare(7, 0, b"", [], big)  # the old one's bytes are free for its replacement
    assert len(s) == 1 and s.held_bytes == size
    with pytest.raises(DeclarationError):
        s.declare(8, 0, b"", [], big)


def test_an_oversized_redeclaration_during_a_resync_keeps_what_the_pid_had() -> None:
    s = DeclaredStore(max_bytes=64 * KiB)
    s.declare(1, 0, b"", [("OTEL_SERVICE_NAME", b"kept")], b"", declarer="a")
    s.declare(2, 0, b"", [], b"", declarer="a")
    resync = s.begin_resync("a")
    with pytest.raises(DeclarationError):
        s.declare(1, 0, b"", [], many_attributes(4000), declarer="a")
    assert s.end_resync(resync) == 1  # pid 2, not re-declared; pid 1 kept its declaration
    d, ok = s.get(1, None)
    assert ok and d is not None and d.environment == {"OTEL_SERVICE_NAME": b"kept"}


def test_rejected_declarations_during_a_resync_hold_no_memory() -> None:
    # issue: 83,000 rejected events grew the resync's set of touched pids by 51 MB
    s = DeclaredStore()
    resync = s.begin_resync("agent")
    bad = [("NOT=VALID", b"x")]  # a name with "=" is never a variable name
    for pid in range(1, 1001):  # warm up allocator pools and caches
        with pytest.raises(DeclarationError):
            s.declare(pid, 0, b"", bad, b"", declarer="agent")
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for pid in range(1001, 51001):
        with pytest.raises(DeclarationError):
            s.declare(pid, 0, b"", bad, b"", declarer="agent")
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 256 * KiB, grown  # 50,000 pids in a set alone would be several MiB
    assert s.end_resync(resync) == 0 and s.stats().rejected == 51000
