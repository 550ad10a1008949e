"""A procfs tree that follows the simulated driver's processes (pid reuse included).

The sidecar's identity code (``DeclaredStore`` pid-reuse checks, ``ProcessResourcer``) reads
``<proc_root>/<pid>/stat`` field 22 and ``comm``. The simulated pids are not this machine's, so
the soak points ``identity.proc_root`` at this tree and rewrites it from
``SimDriver.live_processes()`` before each cycle. Files are replaced atomically (``os.replace``)
because server threads read them concurrently.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


class FakeProc:
    """``<root>/stat`` (btime) and ``<root>/<pid>/{stat,comm}`` for the live simulated processes.

    Args:
        root: an empty directory.
        boot_unix: the host boot time (s since the epoch) the start ticks count from.

    """

    def __init__(self, root: Path, boot_unix: int) -> None:
        self.root = root
        self.boot_unix = boot_unix
        self._pids: dict[int, int] = {}  # pid -> start ticks written
        self._write(root / "stat", f"cpu  1 2 3 4\nbtime {boot_unix}\n")

    def ticks(self, start_time_unix: float) -> int:
        """Start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
        return max(0, round((start_time_unix - self.boot_unix) * CLK_TCK))

    @staticmethod
    def comm(name: bytes | None, pid: int) -> str:
        """What the kernel would show as ``comm`` (basename, at most 15 bytes)."""
        base = os.path.basename((name or b"").decode("utf-8", "replace")) or f"proc{pid}"
        return base[:15]

    def _write(self, path: Path, text: str) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def sync(self, live: list[dict]) -> dict[int, tuple[int, str]]:
        """Make the tree show exactly ``live`` (``SimDriver.live_processes()`` entries).

        Returns:
            pid -> (start ticks, comm) of every live process.

        """
        now: dict[int, tuple[int, str]] = {}
        for p in live:
            now[p["pid"]] = (self.ticks(p["start_time_unix"]), self.comm(p["name"], p["pid"]))
        for pid in set(self._pids) - set(now):
            shutil.rmtree(self.root / str(pid), ignore_errors=True)
            del self._pids[pid]
        for pid, (ticks, comm) in now.items():
            if self._pids.get(pid) == ticks:
                continue
            d = self.root / str(pid)
            d.mkdir(exist_ok=True)
            rest = ["0"] * 17 + [str(ticks)] + ["0"] * 30
            self._write(d / "stat", f"{pid} ({comm}) S 1 {' '.join(rest)}\n")
            self._write(d / "comm", comm + "\n")
            self._pids[pid] = ticks
        return now
