"""The suite-wide thread check (tests/conftest.py) fails a test that leaves a thread running
(issue 28 item 11): run on a throwaway test file with pytest's own pytester."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

LEAKY = """
import threading

release = threading.Event()

def test_leaves_a_thread():
    threading.Thread(target=release.wait, name="left-behind", daemon=True).start()

def test_joins_its_thread():
    done = threading.Event()
    t = threading.Thread(target=done.set, name="joined")
    t.start()
    t.join()

def test_after_the_leak():
    release.set()  # the thread of the first test ends here; this test is not blamed for it
"""


def test_a_leaked_thread_fails_its_test_and_only_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_leaky=LEAKY)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        ["*test_leaves_a_thread*", "*left thread(s) running*'left-behind' (daemon=True)*"]
    )
    assert "test_joins_its_thread - " not in result.stdout.str()
