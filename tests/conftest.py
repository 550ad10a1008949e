"""Suite-wide fixtures: every test must end every thread it started (issue 28 item 11).

A test that leaves a thread running lets it act after the test: log into a stream pytest has
closed ("I/O operation on closed file"), hold a socket, or count into a later test's telemetry,
which made tests fail only on a loaded machine. :func:`no_leaked_threads` compares
``threading.enumerate()`` before the test's fixtures are set up and after they are torn down,
and fails the test that left a thread behind, naming it and where it was started.

Two kinds of thread are not the test's to join, and are identified by what they are, not by
name: threads started outside Python (``threading._DummyThread``: a thread of grpc's C core that
ran a Python callback is registered forever and cannot be joined), and grpc's own helper threads
(their target is a function of a ``grpc.`` module: the channel's connectivity "spin" thread and
the server's serving loop), which grpc ends by itself after ``Channel.close()`` or
``Server.stop()`` without a way to wait for them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest


def _grpc_owned(thread: threading.Thread) -> bool:
    target = getattr(thread, "_target", None)  # CPython keeps it until run() returns
    module = getattr(target, "__module__", None) or ""
    return module == "grpc" or module.startswith("grpc.")


def _describe(thread: threading.Thread) -> str:
    target = getattr(thread, "_target", None)
    name = getattr(target, "__qualname__", target)
    where = f" running {getattr(target, '__module__', '?')}.{name}" if target else ""
    return f"{thread.name!r} (daemon={thread.daemon}){where}"


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test after which a thread it started is still running."""
    before = set(threading.enumerate())
    yield
    leaked = [
        t
        for t in threading.enumerate()
        if t not in before
        and t.is_alive()
        and not isinstance(t, threading._DummyThread)  # noqa: SLF001 - see the module docstring
        and not _grpc_owned(t)
    ]
    if leaked:
        pytest.fail(
            "the test left thread(s) running; join what it starts: "
            + ", ".join(_describe(t) for t in leaked),
            pytrace=False,
        )
