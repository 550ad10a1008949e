"""Summarise a pytest JUnit XML report for scripts/test.sh: skips and recorded figures.

Usage: ``python scripts/junit_outcome.py REPORT.xml SKIP_REASON_FILE``

Prints each test's recorded properties (``record_property``: the live-profiler stage's measured
latencies) and, when any test was skipped, writes ``N of M skipped: <reasons>`` to
SKIP_REASON_FILE and exits 77 (the exit status automake and scripts/test.sh give a skipped
test), so the stage is shown as skipped, not passed. Exit 0 when every test ran; 1 for an
unreadable report or one without tests (nothing ran: not a pass either).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET  # noqa: S405 - our own pytest's report

SKIPPED = 77


def main(argv: list[str]) -> int:
    """Run as described in the module docstring; return the exit status."""
    report, reason_file = argv[1], argv[2]
    try:
        root = ET.parse(report).getroot()  # noqa: S314 - written by pytest in this run
    except (OSError, ET.ParseError) as e:
        print(f"junit_outcome: {report}: {e}", file=sys.stderr)
        return 1
    cases = list(root.iter("testcase"))
    if not cases:
        print(f"junit_outcome: {report}: no test ran", file=sys.stderr)
        return 1
    reasons: list[str] = []
    for case in cases:
        for prop in case.iter("property"):
            print(f"{case.get('name')}: {prop.get('name')} = {prop.get('value')}")
        skipped = case.find("skipped")
        if skipped is not None:
            reason = (skipped.get("message") or "").removeprefix("Skipped: ")
            if reason not in reasons:
                reasons.append(reason)
    n = sum(case.find("skipped") is not None for case in cases)
    if not n:
        return 0
    with open(reason_file, "w", encoding="utf-8") as f:
        f.write(f"{n} of {len(cases)} skipped: {'; '.join(reasons)}")
    return SKIPPED


if __name__ == "__main__":
    sys.exit(main(sys.argv))
