"""The OTEL_* edge-case table as data (testdata/identity/otel_env_cases.yaml): one row, one case."""

from __future__ import annotations

import pytest
from gpumetrics.identity.envparse import (
    ResourceAttributesError,
    env_resource,
    parse_resource_attributes,
)

from .conftest import load_cases

CASES = load_cases("otel_env_cases.yaml")


def _env(case: dict) -> dict[str, bytes]:
    env: dict[str, bytes] = {}
    if "resource_attributes" in case:
        env["OTEL_RESOURCE_ATTRIBUTES"] = case["resource_attributes"].encode("utf-8")
    if "resource_attributes_hex" in case:
        env["OTEL_RESOURCE_ATTRIBUTES"] = bytes.fromhex(case["resource_attributes_hex"])
    if "service_name" in case:
        env["OTEL_SERVICE_NAME"] = case["service_name"].encode("utf-8")
    if "service_name_hex" in case:
        env["OTEL_SERVICE_NAME"] = bytes.fromhex(case["service_name_hex"])
    return env


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_edge_case_row(case: dict) -> None:
    got = env_resource(_env(case))
    assert got.attributes == case["expected"]
    assert len(got.errors) == case["discarded"], got.errors
    assert all(isinstance(v, str) for v in got.attributes.values())


def test_every_table_row_is_covered() -> None:
    rows = {c["id"].rstrip("ab") for c in CASES if c["id"][0].isdigit()}
    assert rows == {str(n) for n in range(1, 25)}


@pytest.mark.parametrize(
    "case", [c for c in CASES if "expected_profiler_quirk" in c], ids=lambda c: c["id"]
)
def test_profiler_quirk_for_empty_service_name(case: dict) -> None:
    got = env_resource(_env(case), empty_service_name_is_set=True)
    assert got.attributes == case["expected_profiler_quirk"]


def test_error_names_the_item_and_reason() -> None:
    with pytest.raises(ResourceAttributesError, match=r"^item 1: no '='$"):
        parse_resource_attributes(b"a=b,,c=d")
    with pytest.raises(ResourceAttributesError, match=r"item 1 value: invalid percent escape"):
        parse_resource_attributes("good=1,bad=%ZZ")
    with pytest.raises(ResourceAttributesError, match=r"item 0 key: not valid UTF-8"):
        parse_resource_attributes(b"%FF=1")


def test_discard_message_names_the_variable() -> None:
    got = env_resource({"OTEL_RESOURCE_ATTRIBUTES": b"good=1,bad"})
    assert got.errors == ("OTEL_RESOURCE_ATTRIBUTES: item 1: no '='",)


def test_str_and_bytes_inputs_agree() -> None:
    assert parse_resource_attributes("a=%C3%A9") == parse_resource_attributes(b"a=%C3%A9")
