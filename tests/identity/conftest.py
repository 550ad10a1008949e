"""Shared helpers for the identity tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

TESTDATA = Path(__file__).resolve().parent.parent / "testdata"
PROC = TESTDATA / "proc"


def load_cases(name: str) -> list[dict[str, Any]]:
    """Load a YAML list of test vectors from tests/testdata/identity/."""
    with open(TESTDATA / "identity" / name, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    assert isinstance(data, list) and data, name
    return data
