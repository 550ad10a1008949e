"""Property tests: environment strings and OTEP 4719 process-context payloads.

* ``OTEL_RESOURCE_ATTRIBUTES``: arbitrary bytes give a ``dict[str, str]`` or a
  ``ResourceAttributesError`` naming the item (never another exception); a percent-encoded
  list of pairs round-trips (last duplicate wins); through ``ProcessResourcer`` a malformed value
  is discarded whole (none of its keys appear, ``env_discarded`` counts it) while
  ``OTEL_SERVICE_NAME`` still applies (the documented drop), and a parsed one never sets an
  observed key (enriched mode).
* Process-context payloads: arbitrary and mutated bytes decode or raise
  ``ProcessContextDecodeError``; encoded contexts round-trip; the ``OTEL_CTX`` reader, given a
  fake ``maps`` and ``mem`` with an arbitrary header and payload, answers the status the header
  calls for and never raises.
"""

from __future__ import annotations

import struct
import urllib.parse
from pathlib import Path

from gpumetrics.identity import (
    DeclaredStore,
    ProcessContextDecodeError,
    ProcessContextReader,
    ProcfsReader,
    ReadStatus,
    ResourceAttributesError,
    decode_process_context,
    encode_process_context,
    is_observed_key,
    new_process_resourcer,
    parse_resource_attributes,
)
from hypothesis import given
from hypothesis import strategies as st

from .conftest import hypothesis_settings

RA = "OTEL_RESOURCE_ATTRIBUTES"
_keys = st.text(min_size=1, max_size=10).filter(lambda k: k.strip() == k and k)


def _encode(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _mutate(data: bytes, ops: list[tuple[int, int, int]]) -> bytes:
    b = bytearray(data)
    for kind, pos, val in ops:
        if not b:
            break
        i = pos % len(b)
        if kind == 0:
            b[i] = val
        elif kind == 1:
            del b[i:]
        else:
            b.insert(i, val)
    return bytes(b)


mutations = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 2**16), st.integers(0, 255)), max_size=4
)


def test_resource_attributes_never_crash(form, figures) -> None:
    tried = 0

    @hypothesis_settings(form, scale=5)
    @given(
        raw=st.one_of(
            st.binary(max_size=80),
            st.text(alphabet=st.sampled_from("ab=,% \t\n%2C%3D%ZZé\x00"), max_size=40).map(
                str.encode
            ),
        )
    )
    def run(raw: bytes) -> None:
        nonlocal tried
        tried += 1
        try:
            out = parse_resource_attributes(raw)
        except ResourceAttributesError as exc:
            assert str(exc).startswith("item "), exc
            return
        assert all(isinstance(k, str) and k and isinstance(v, str) for k, v in out.items())

    run()
    figures.add("bad_input", "otel_resource_attributes.arbitrary", tried)


def test_resource_attributes_round_trip(form, figures) -> None:
    tried = 0

    @hypothesis_settings(form)
    @given(pairs=st.lists(st.tuples(_keys, st.text(max_size=10)), min_size=1, max_size=6))
    def run(pairs: list[tuple[str, str]]) -> None:
        nonlocal tried
        tried += 1
        raw = ",".join(f"{_encode(k)}={_encode(v)}" for k, v in pairs)
        assert parse_resource_attributes(raw.encode()) == dict(pairs)

    run()
    figures.add("bad_input", "otel_resource_attributes.round_trip", tried)


def test_malformed_resource_attributes_are_discarded_whole(tmp_path: Path, form, figures) -> None:
    (tmp_path / "proc").mkdir()
    procfs = ProcfsReader(str(tmp_path / "proc"), host_pid_namespace=True)
    store = DeclaredStore(start_time_reader=procfs.start_time_ticks)
    resourcer = new_process_resourcer(None, store, "node", False, procfs=procfs, mode="enriched")
    tried = {"discarded": 0, "applied": 0}
    pid = 0

    @hypothesis_settings(form, scale=2)
    @given(
        raw=st.one_of(
            st.binary(max_size=60).filter(lambda b: b"\0" not in b),
            st.text(alphabet=st.sampled_from("ab=,% %41%zz\t\xe9"), max_size=30).map(str.encode),
        )
    )
    def run(raw: bytes) -> None:
        nonlocal pid
        pid += 1
        env = [(RA, raw), ("OTEL_SERVICE_NAME", b"svc")]
        store.declare(pid, 0, b"", env, b"")
        before = resourcer.stats()["env_discarded"]
        res = resourcer.resource(pid)
        assert res is not None and res["service.name"] == "svc" and res["process.pid"] == pid
        try:
            parsed = parse_resource_attributes(raw)
        except ResourceAttributesError:
            assert resourcer.stats()["env_discarded"] == before + 1
            assert set(res) <= {"service.name", "process.pid", "host.name"}, res
            tried["discarded"] += 1
            return
        for k, v in parsed.items():
            if is_observed_key(k):  # never from the process: the sidecar's value or none
                assert res.get(k) == {"host.name": "node", "process.pid": pid}.get(k), (k, res)
            elif k != "service.name":
                assert res[k] == v
        tried["applied"] += 1

    run()
    for k, v in tried.items():
        figures.add("bad_input", f"otel_resource_attributes.resourcer_{k}", v)


def test_process_context_payloads(form, figures) -> None:
    tried = {"decoded": 0, "rejected": 0}
    valid = st.dictionaries(
        _keys, st.one_of(st.text(max_size=8), st.integers(-5, 5), st.booleans()), max_size=4
    )

    @hypothesis_settings(form, scale=5)
    @given(
        payload=st.one_of(
            st.binary(max_size=128),
            st.builds(lambda d, m: _mutate(encode_process_context(d), m), valid, mutations),
        )
    )
    def run(payload: bytes) -> None:
        try:
            decoded = decode_process_context(payload)
        except ProcessContextDecodeError as exc:
            assert str(exc), "an empty message"
            tried["rejected"] += 1
            return
        assert isinstance(decoded.resource, dict) and isinstance(decoded.attributes, dict)
        tried["decoded"] += 1

    run()

    @hypothesis_settings(form)
    @given(resource=valid, attributes=valid)
    def round_trip(resource, attributes) -> None:
        decoded = decode_process_context(encode_process_context(resource, attributes))
        assert decoded.resource == resource and decoded.attributes == attributes

    round_trip()
    for k, v in tried.items():
        figures.add("bad_input", f"process_context_payload.{k}", v)


ADDR = 0x10000
_HEADER = struct.Struct("=8sIIQQ")


def _expected(header: tuple[bytes, int, int, int, int], mem: bytes) -> ReadStatus:
    """The status the reader's documented checks give for this header over this memory."""
    sig, version, size, ts, payload_at = header
    if sig != b"OTEL_CTX":
        return ReadStatus.BAD_SIGNATURE
    if version != 2:
        return ReadStatus.BAD_VERSION
    if ts == 0:
        return ReadStatus.IN_PROGRESS
    if not 0 < size <= 65536:
        return ReadStatus.BAD_SIZE
    if payload_at + size > len(mem):
        return ReadStatus.UNREADABLE
    try:
        decode_process_context(mem[payload_at : payload_at + size])
    except ProcessContextDecodeError:
        return ReadStatus.DECODE_ERROR
    return ReadStatus.OK


def test_otel_ctx_reader_with_arbitrary_headers(tmp_path: Path, form, figures) -> None:
    statuses: dict[str, int] = {}
    pid = 100

    @hypothesis_settings(form, scale=2)
    @given(
        sig=st.sampled_from([b"OTEL_CTX"] * 12 + [b"OTEL_CT\0", b"otel_ctx", bytes(8)]),
        version=st.sampled_from([2] * 10 + [1, 3, 2**32 - 1]),
        size=st.one_of(
            st.none(), st.none(), st.integers(1, 200), st.sampled_from([0, 65537, 2**32 - 1])
        ),
        ts=st.sampled_from([0, 1, 1_700_000_000_123_456_789, 2**64 - 1, 42]),
        gap=st.one_of(st.just(0), st.integers(0, 2**20), st.just(2**63)),
        payload=st.one_of(
            st.dictionaries(_keys, st.text(max_size=6), max_size=3).map(encode_process_context),
            st.binary(max_size=200),
            st.dictionaries(_keys, st.text(max_size=6), min_size=1, max_size=3).map(
                encode_process_context
            ),
        ),
    )
    def run(sig, version, size, ts, gap, payload) -> None:
        nonlocal pid
        pid += 1
        d = tmp_path / str(pid)
        d.mkdir()
        payload_at = ADDR + 32 + gap
        (d / "maps").write_bytes(
            b"00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/app\n"
            + f"{ADDR:x}-{ADDR + 4096:x} rw-s 0 00:01 1 /memfd:OTEL_CTX (deleted)\n".encode()
        )
        size = len(payload) if size is None else size
        header = (sig, version, size, ts, payload_at)
        mem = bytes(ADDR) + _HEADER.pack(*header)
        if gap < 2**20:
            mem += bytes(gap) + payload
        (d / "mem").write_bytes(mem)
        result = ProcessContextReader(str(tmp_path)).read(pid, 1)
        want = _expected(header, mem)
        assert result.status is want, (result.status, want)
        assert (result.context is not None) == (want is ReadStatus.OK)
        statuses[want.value] = statuses.get(want.value, 0) + 1

    run()
    for k, v in statuses.items():
        figures.add("bad_input", f"otel_ctx_reader.{k}", v)
