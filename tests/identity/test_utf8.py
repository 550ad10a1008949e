"""Issue 27 item 2: the one rule for bytes that are not UTF-8 (gpumetrics.identity.utf8), checked
against the vectors the Go exporter's test reads too (collector/pkg/declarer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gpumetrics.identity.utf8 import to_valid_utf8
from hypothesis import given
from hypothesis import strategies as st

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).parents[1] / "testdata/identity/invalid_utf8_cases.json").read_text()
)["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_vector(case: dict[str, Any]) -> None:
    assert to_valid_utf8(bytes.fromhex(case["input"])) == (case["want"], case["replaced"])


@given(st.binary(max_size=64))
def test_output_is_utf8_and_valid_input_is_kept(raw: bytes) -> None:
    text, replaced = to_valid_utf8(raw)
    text.encode("utf-8")  # raises on a lone surrogate: none survives
    try:
        expected = raw.decode("utf-8")
    except UnicodeDecodeError:
        assert replaced and "\ufffd" in text
    else:
        assert (text, replaced) == (expected, False)


@given(st.binary(max_size=64))
def test_the_rule_is_idempotent(raw: bytes) -> None:
    text, _ = to_valid_utf8(raw)
    assert to_valid_utf8(text.encode("utf-8")) == (text, False)
