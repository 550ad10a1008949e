"""Resource limits (issue 23, item 1): one per-process resource is bounded in value length,
attribute count and encoded bytes, with the OpenTelemetry SDK's attribute-limit semantics
(https://opentelemetry.io/docs/specs/otel/common/#attribute-limits); what is cut is counted and
logged once. The encoded size is checked against protobuf itself."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from gpumetrics.identity.attrs import to_key_values
from gpumetrics.identity.declared import DeclaredStore
from gpumetrics.identity.procfs import ProcfsReader
from gpumetrics.identity.resource_limits import ResourceLimits, limit_resource
from gpumetrics.identity.resourcer import LIMITED, ProcessResourcer
from gpumetrics.selftelemetry import Telemetry
from opentelemetry.proto.resource.v1 import resource_pb2

from .fakeproc import make_proc, resource_bytes


def encoded(attrs: dict[str, Any]) -> int:
    """What protobuf makes of ``attrs`` as ``Resource.attributes`` (the producer's encoding)."""
    res = resource_pb2.Resource()
    to_key_values(res.attributes, attrs)
    return res.ByteSize()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("é" * 10, "é" * 4),  # characters (code points), not bytes
        (b"\x00\xff" * 5, b"\x00\xff\x00\xff"),  # a byte array: bytes
        (["abcdef", "ab", 123456789, True], ["abcd", "ab", 123456789, True]),  # each element
        ({"k": "abcdef", "n": {"deep": "abcdefgh"}}, {"k": "abcd", "n": {"deep": "abcd"}}),
        (123456789012, 123456789012),  # other values are never truncated
        (3.25, 3.25),
        (True, True),
    ],
)
def test_values_are_truncated_as_the_specification_says(value: Any, expected: Any) -> None:
    out = limit_resource({"k": value}, ResourceLimits(attribute_value_length_limit=4))
    assert out.attributes == {"k": expected}
    assert out.cut == ((("k", "value_length"),) if expected != value else ())


def test_a_resource_within_the_limits_is_returned_as_it_is() -> None:
    attrs: dict[str, Any] = {"service.name": "trainer", "process.pid": 7, "k8s.pod.name": "p"}
    out = limit_resource(attrs, ResourceLimits())
    assert out.attributes is attrs and out.cut == ()
    assert out.encoded_bytes == encoded(attrs)


def test_the_count_limit_discards_top_level_attributes_beyond_it() -> None:
    attrs: dict[str, Any] = {f"a{i:03d}": i for i in range(130)}
    attrs["nested"] = {f"k{i}": i for i in range(200)}  # nested pairs do not count
    out = limit_resource(attrs, ResourceLimits(attribute_count_limit=128, max_bytes=1 << 20))
    assert list(out.attributes) == [f"a{i:03d}" for i in range(128)]
    assert out.cut == (("a128", "count"), ("a129", "count"), ("nested", "count"))
    small = limit_resource({"nested": attrs["nested"]}, ResourceLimits(attribute_count_limit=1))
    assert small.cut == ()


def test_the_byte_limit_bounds_the_encoded_resource() -> None:
    attrs: dict[str, Any] = {f"attr.{i}": "v" * 100 for i in range(60)}
    limits = ResourceLimits(max_bytes=2048)
    out = limit_resource(attrs, limits)
    assert 0 < len(out.attributes) < 60
    assert out.encoded_bytes == encoded(out.attributes) <= limits.max_bytes
    assert encoded(out.attributes) + encoded({"attr.59": "v" * 100}) > limits.max_bytes
    assert {reason for _, reason in out.cut} == {"max_bytes"}
    assert len(out.cut) == 60 - len(out.attributes)
    # a later, smaller attribute still fits what is left
    out = limit_resource({"big": "x" * 3000, "small": "y"}, limits)
    assert out.attributes == {"small": "y"} and out.cut == (("big", "max_bytes"),)


def test_observed_keys_and_service_name_are_admitted_first_and_the_order_is_kept() -> None:
    attrs: dict[str, Any] = {f"app.{i}": "x" * 200 for i in range(40)}
    attrs |= {"service.name": "trainer", "host.name": "node-1", "process.pid": 42}
    attrs["container.id"] = "c" * 64
    out = limit_resource(attrs, ResourceLimits(max_bytes=1024, attribute_count_limit=6))
    kept = list(out.attributes)
    for key in ("service.name", "host.name", "process.pid", "container.id"):
        assert key in kept
    assert kept == [k for k in attrs if k in out.attributes]  # the resource's own order


def test_a_value_protobuf_cannot_hold_is_discarded_not_left_to_fail_the_batch() -> None:
    out = limit_resource({"big.int": 2**70, "ok": 1}, ResourceLimits())
    assert out.attributes == {"ok": 1} and out.cut == (("big.int", "unencodable"),)


@pytest.mark.parametrize(
    "field", ["attribute_value_length_limit", "attribute_count_limit", "max_bytes"]
)
def test_bad_limits_name_the_field(field: str) -> None:
    with pytest.raises(ValueError, match=f"^'{field}':"):
        ResourceLimits(**{field: 0})


def _resourcer(tmp_path: Path, **kw: Any) -> tuple[ProcessResourcer, DeclaredStore, Telemetry]:
    make_proc(tmp_path, None)
    procfs = ProcfsReader(str(tmp_path))
    store = DeclaredStore(start_time_reader=procfs.start_time_ticks)
    tel = Telemetry()
    return ProcessResourcer(procfs=procfs, declared=store, telemetry=tel, **kw), store, tel


def test_a_declared_64_kib_value_reaches_the_gpu_resource_cut_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's attack: every process declares a ~64 KiB value; each batch carried it whole."""
    r, store, tel = _resourcer(tmp_path)
    caplog.set_level(logging.DEBUG, logger="gpumetrics.identity.resourcer")
    for pid in (1001, 1002):
        blob = f"{pid:08d}" * 8000  # 64,000 characters
        store.declare(pid, 0, b"", [], resource_bytes({"service.name": "t", "app.blob": blob}))
        res = r.resource(pid)
        assert res is not None
        assert res["app.blob"] == blob[:4096] and res["service.name"] == "t"
        assert encoded(res) <= ResourceLimits().max_bytes
    assert tel.value(LIMITED, {"reason": "value_length"}) == 2
    assert r.stats()["attributes_truncated"] == 2
    warned = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warned) == 1
    message = warned[0].getMessage()
    assert "attribute_value_length_limit" in message and "'app.blob'" in message
    assert r.resource(1001) is not None  # from the cache: nothing counted again
    assert tel.value(LIMITED, {"reason": "value_length"}) == 2


def test_an_unlimited_declaration_is_still_the_profile_resource_verbatim(tmp_path: Path) -> None:
    r, store, tel = _resourcer(tmp_path)
    attrs = {"service.name": "t", "container.id": "c" * 64, "k8s.pod.name": "p-0"}
    store.declare(7, 0, b"", [], resource_bytes(attrs))
    assert r.resource(7) == {**attrs, "process.pid": 7}
    assert tel.total(LIMITED) == 0


def test_the_resource_cache_is_bounded_in_bytes(tmp_path: Path) -> None:
    r, store, _ = _resourcer(tmp_path, cache_max_bytes=64 * 1024)
    for pid in range(1, 101):
        store.declare(pid, 0, b"", [], resource_bytes({"app.blob": "x" * 4000, "i": pid}))
        assert r.resource(pid) is not None
    stats = r.stats()
    assert stats["cached_bytes"] <= 64 * 1024
    assert 0 < stats["cached"] < 100  # the least recently used went first
    assert r.resource(100) is not None and r.stats()["cache_hits"] == 1  # the newest stayed
