"""Parent-death detection for go-plugin mode: the host died without calling Shutdown.

go-plugin does not make the child die with its parent (hashicorp/go-plugin ``client.go``: the host
kills the plugin only from ``Client.Kill``):
a SIGKILLed collector would leave the sidecar orphaned, so the sidecar watches its parent pid.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

__all__ = ["ParentWatcher"]

log = logging.getLogger(__name__)


class ParentWatcher:
    """Calls ``on_parent_death`` once when ``getppid()`` changes (the host died, we were adopted).

    Polling is used instead of ``prctl(PR_SET_PDEATHSIG)`` because that signal fires when the
    *thread* that forked us exits (prctl(2)), and the Go runtime retires threads.

    Args:
        on_parent_death: called from the watcher thread.
        interval_s: polling interval in seconds.
        getppid: injectable for tests.
        wait: ``threading.Event.wait``-like; returns True to stop (injectable for tests).

    """

    def __init__(
        self,
        on_parent_death: Callable[[], None],
        interval_s: float = 1.0,
        getppid: Callable[[], int] = os.getppid,
        stop: threading.Event | None = None,
    ) -> None:
        self._on_parent_death = on_parent_death
        self._interval_s = interval_s
        self._getppid = getppid
        self._stop = stop if stop is not None else threading.Event()
        self._parent = getppid()
        self._thread: threading.Thread | None = None

    def check(self) -> bool:
        """Poll once; return True (and call the callback) if the parent changed."""
        current = self._getppid()
        if current != self._parent:
            log.warning("parent process %d is gone (now %d): shutting down", self._parent, current)
            self._on_parent_death()
            return True
        return False

    def start(self) -> None:
        """Start the daemon polling thread; it ends after the first detection or :meth:`stop`."""
        self._thread = threading.Thread(
            target=self._run, name="gpumetrics-parent-watcher", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            if self.check():
                return

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop polling and join the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
