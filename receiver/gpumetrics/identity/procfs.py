"""Reading what ``/proc/<pid>`` says about a process, under a configurable root (``/host/proc``).

Missing or unreadable files are normal (the process exited, ``EACCES``, a kernel thread without
``exe``): every reader returns None then, never raises for them, and never invents a value.

PID namespaces (NVML field case F15, PID namespaces): NVML and the profilers report
host pids. If the procfs under ``proc_root`` belongs to another pid namespace (a container without
``hostPID``), a host pid there names an unrelated process, so this reader refuses to read any
pid (every per-pid method returns None). The decision is configuration (``host_pid_namespace``)
or, when that is None, detected once:

1. ``readlink(<proc_root>/1/ns/pid)`` is the namespace of that procfs's init process, hence of
   the procfs itself; it is the host's iff it is the initial pid namespace, whose inode is the
   kernel constant ``PROC_PID_INIT_INO`` = 0xEFFFFFFC (``include/linux/proc_ns.h``).
2. If that link is unreadable (``EACCES`` without ``CAP_SYS_PTRACE`` over pid 1), we read
   ``<proc_root>/self/ns/pid``: if *we* are in the initial namespace and that procfs shows us, it
   is the initial namespace's procfs.
3. Otherwise the answer is unknown: we assume a foreign namespace (no names rather than false
   names) and log one warning telling to set ``host_pid_namespace``.
"""

from __future__ import annotations

import logging
import os
import pwd
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpumetrics.identity.cgroup import container_id, main_cgroup_path
from gpumetrics.identity.utf8 import to_valid_utf8

log = logging.getLogger(__name__)

PROC_PID_INIT_INO = 0xEFFFFFFC
"""Inode of the initial (host) pid namespace, ``pid:[4026531836]`` (``include/linux/proc_ns.h``)."""

MAX_FILE_BYTES = 1 << 20
"""At most this many bytes are read from ``cmdline``/``environ``/``cgroup``/``maps`` (1 MiB, as
parca-agent's ``readFileNoStat``); a longer file is cut there."""

_INIT_NS = f"pid:[{PROC_PID_INIT_INO}]"
_DELETED = " (deleted)"


@dataclass(frozen=True, slots=True)
class ProcStat:
    """Fields of ``/proc/<pid>/stat`` (parsed after the last ``)``)."""

    ppid: int
    """Field 4: parent pid."""
    start_time_ticks: int
    """Field 22 (``starttime``): start time in clock ticks (``SC_CLK_TCK``) since boot."""


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """Everything read for one process; each field None when its file was missing/unreadable."""

    pid: int
    start_time_ticks: int
    ppid: int | None
    comm: str | None
    """``/proc/<pid>/comm`` trimmed (≤ 15 bytes, the main thread's name; invalid UTF-8 replaced)."""
    exe_target: str | None
    """Target of ``/proc/<pid>/exe`` exactly as ``readlink`` gives it (a replaced binary keeps
    its `` (deleted)`` suffix): the eBPF profiler's ``process.executable.path``."""
    cmdline: tuple[str, ...] | None
    uid: int | None
    """Real uid (``Uid:`` of ``/proc/<pid>/status``)."""
    owner: str | None
    """User name of ``uid`` via ``pwd`` (this host's/container's user database), None if unknown."""
    environ: dict[str, bytes] | None
    """``OTEL_*`` variables only, name → raw bytes (first occurrence of a name wins, as getenv)."""
    env_vars: dict[str, bytes] | None
    """The reader's ``include_env_vars``, name → raw bytes, as the eBPF profiler captures them
    (last occurrence of a name wins); None when ``environ`` is unreadable."""
    cgroup: str | None
    """``/proc/<pid>/cgroup`` text (invalid UTF-8 replaced)."""
    container_id: str | None
    """Container id from the raw ``cgroup`` bytes (:func:`gpumetrics.identity.cgroup.container_id`,
    the eBPF profiler's rule)."""

    @property
    def exe_path(self) -> str | None:
        """:attr:`exe_target` without a trailing `` (deleted)`` (parca-agent's executable)."""
        if self.exe_target is None:
            return None
        return _strip_deleted(self.exe_target)

    @property
    def exe_name(self) -> str | None:
        """Basename of :attr:`exe_path` (parca-agent's ``__meta_process_executable_name``)."""
        if not self.exe_path:
            return None
        return self.exe_path.rsplit("/", 1)[-1] or None

    @property
    def cgroup_path(self) -> str | None:
        """Main cgroup path (parca-agent's ``__meta_process_cgroup``)."""
        return main_cgroup_path(self.cgroup) if self.cgroup is not None else None


def parse_stat(text: str) -> ProcStat | None:
    """Parse ``/proc/<pid>/stat`` text; None if it is malformed.

    The command name (field 2) may contain spaces and parentheses, so fields are counted after
    the **last** ``)``.

    Examples:
        >>> st = parse_stat("42 (a) b) S 7 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0")
        >>> st.ppid, st.start_time_ticks
        (7, 12345)

    """
    _, sep, rest = text.rpartition(")")
    if not sep:
        return None
    fields = rest.split()
    # rest starts at field 3 (state): field n is fields[n - 3].
    if len(fields) < 20:
        return None
    try:
        return ProcStat(ppid=int(fields[1]), start_time_ticks=int(fields[19]))
    except ValueError:
        return None


class ProcfsReader:
    """Reads per-process facts from a procfs tree.

    Args:
        proc_root: procfs mount point (``/proc``, or ``/host/proc`` in a container).
        host_pid_namespace: True/False when configured; None to detect (module docstring).
        resolve_user_names: map uids to names with ``pwd`` (names come from the user database of
            the machine or container the sidecar runs in).
        user_name: uid → user name (default ``pwd``); tests inject a table.
        include_env_vars: environment variable names captured into
            :attr:`ProcessInfo.env_vars` (the eBPF profiler's ``include_env_vars``).

    Thread-safe: readers keep no per-pid state; the two small caches are lock-protected.

    """

    def __init__(
        self,
        proc_root: str = "/proc",
        host_pid_namespace: bool | None = None,
        resolve_user_names: bool = True,
        user_name: Callable[[int], str | None] | None = None,
        include_env_vars: Iterable[str] = (),
    ) -> None:
        self._root = proc_root.rstrip("/") or "/"
        self._env_names = frozenset(name.encode("utf-8") for name in include_env_vars)
        self._configured_ns = host_pid_namespace
        self._host_ns: bool | None = host_pid_namespace
        self._resolve_users = resolve_user_names
        self._user_name = user_name or _pwd_name
        self._users: dict[int, str | None] = {}
        self._boot_ns: int | None = None
        self._lock = threading.Lock()
        self._clk_tck = os.sysconf("SC_CLK_TCK")

    @property
    def proc_root(self) -> str:
        """The procfs root this reader reads."""
        return self._root

    @property
    def clock_ticks_per_second(self) -> int:
        """``SC_CLK_TCK``: the unit of :attr:`ProcStat.start_time_ticks` (usually 100 Hz)."""
        return self._clk_tck

    @property
    def in_host_pid_namespace(self) -> bool:
        """Whether ``proc_root`` shows the host pid namespace (configured or detected once)."""
        if self._host_ns is None:
            decided, how = self._detect_namespace()
            with self._lock:
                if self._host_ns is None:
                    self._host_ns = decided
                    level = logging.WARNING if how == "unknown" else logging.INFO
                    log.log(
                        level,
                        "procfs %s: host pid namespace=%s (%s)%s",
                        self._root,
                        decided,
                        how,
                        "; set host_pid_namespace to override" if how == "unknown" else "",
                    )
        return bool(self._host_ns)

    def _detect_namespace(self) -> tuple[bool, str]:
        link = _readlink(f"{self._root}/1/ns/pid")
        if link is not None:
            return link == _INIT_NS, f"{self._root}/1/ns/pid is {link}"
        link = _readlink(f"{self._root}/self/ns/pid")
        if link == _INIT_NS:
            return True, f"{self._root}/self/ns/pid is the initial namespace"
        return False, "unknown"

    def _path(self, pid: int, name: str) -> str | None:
        if pid <= 0 or not self.in_host_pid_namespace:
            return None
        return f"{self._root}/{pid}/{name}"

    def _read(self, pid: int, name: str) -> bytes | None:
        path = self._path(pid, name)
        return None if path is None else _read_file(path)

    def stat(self, pid: int) -> ProcStat | None:
        """Return ``ppid`` and start time from ``/proc/<pid>/stat``, or None."""
        data = self._read(pid, "stat")
        return None if data is None else parse_stat(data.decode("utf-8", "replace"))

    def start_time_ticks(self, pid: int) -> int | None:
        """Return field 22 of ``/proc/<pid>/stat`` (clock ticks since boot), or None."""
        st = self.stat(pid)
        return None if st is None else st.start_time_ticks

    def comm(self, pid: int) -> str | None:
        """Return ``/proc/<pid>/comm`` trimmed of whitespace, or None (also when empty)."""
        data = self._read(pid, "comm")
        if data is None:
            return None
        return data.decode("utf-8", "replace").strip() or None

    def exe_target(self, pid: int) -> str | None:
        """Return the target of ``/proc/<pid>/exe`` as ``readlink`` gives it, or None (also "").

        Bytes of the path that are not UTF-8 are replaced by
        :func:`~gpumetrics.identity.utf8.to_valid_utf8` (an OTLP string must be UTF-8; the
        profiles exporter applies the same rule to the profiler's path).
        """
        path = self._path(pid, "exe")
        target = None if path is None else _readlink_bytes(path)
        return to_valid_utf8(target)[0] if target else None

    def exe(self, pid: int) -> str | None:
        """Return the target of ``/proc/<pid>/exe`` without `` (deleted)``, or None."""
        target = self.exe_target(pid)
        return None if target is None else _strip_deleted(target)

    def cmdline(self, pid: int) -> list[str] | None:
        """Return the NUL-separated arguments of ``/proc/<pid>/cmdline`` ([] for kernel threads)."""
        data = self._read(pid, "cmdline")
        if data is None:
            return None
        data = data.rstrip(b"\x00")
        return data.decode("utf-8", "replace").split("\x00") if data else []

    def uid(self, pid: int) -> int | None:
        """Return the real uid from ``/proc/<pid>/status``, or None."""
        data = self._read(pid, "status")
        if data is None:
            return None
        for line in data.split(b"\n"):
            if line.startswith(b"Uid:"):
                fields = line.split()
                try:
                    return int(fields[1])
                except (IndexError, ValueError):
                    return None
        return None

    def user_name(self, uid: int) -> str | None:
        """Return the user name of ``uid`` (cached), or None when unresolvable or disabled."""
        if not self._resolve_users:
            return None
        with self._lock:
            if uid in self._users:
                return self._users[uid]
        name = self._user_name(uid)
        with self._lock:
            if len(self._users) < 4096:
                self._users[uid] = name
        return name

    def environ(self, pid: int) -> dict[str, bytes] | None:
        """Return the ``OTEL_*`` variables of ``/proc/<pid>/environ`` (raw bytes), or None."""
        data = self._read(pid, "environ")
        if data is None:
            return None
        return parse_environ(data)

    def cgroup(self, pid: int) -> str | None:
        """Return the text of ``/proc/<pid>/cgroup``, or None."""
        data = self._read(pid, "cgroup")
        return None if data is None else data.decode("utf-8", "replace")

    def read(self, pid: int) -> ProcessInfo | None:
        """Read everything about ``pid``; None when its ``stat`` is unreadable (gone, hidden)."""
        st = self.stat(pid)
        if st is None:
            return None
        uid = self.uid(pid)
        environ = self._read(pid, "environ")
        cgroup = self._read(pid, "cgroup")
        return ProcessInfo(
            pid=pid,
            start_time_ticks=st.start_time_ticks,
            ppid=st.ppid,
            comm=self.comm(pid),
            exe_target=self.exe_target(pid),
            cmdline=_tuple(self.cmdline(pid)),
            uid=uid,
            owner=None if uid is None else self.user_name(uid),
            environ=None if environ is None else parse_environ(environ),
            env_vars=None if environ is None else select_environ(environ, self._env_names),
            cgroup=None if cgroup is None else cgroup.decode("utf-8", "replace"),
            container_id=None if cgroup is None else container_id(cgroup),
        )

    def boot_time_ns(self) -> int | None:
        """Return the boot time (``btime`` of ``<proc_root>/stat``, whole seconds) in ns."""
        if self._boot_ns is None:
            data = _read_file(f"{self._root}/stat")
            for line in (data or b"").split(b"\n"):
                if line.startswith(b"btime "):
                    try:
                        self._boot_ns = int(line.split()[1]) * 1_000_000_000
                    except (IndexError, ValueError):
                        return None
                    break
        return self._boot_ns

    def creation_time_ns(self, start_time_ticks: int) -> int | None:
        """Return a process's start time in ns since the Unix epoch, or None without ``btime``.

        ``btime`` has whole-second resolution and ticks 1/``SC_CLK_TCK`` s, so the result is
        within about a second of the true start (psutil computes ``create_time`` the same way).
        """
        boot = self.boot_time_ns()
        if boot is None:
            return None
        return boot + start_time_ticks * 1_000_000_000 // self._clk_tck


def parse_environ(data: bytes) -> dict[str, bytes]:
    r"""Return the ``OTEL_*`` variables of NUL-separated ``environ`` bytes; first occurrence wins.

    Examples:
        >>> parse_environ(b"PATH=/bin\x00OTEL_SERVICE_NAME=svc\x00OTEL_SERVICE_NAME=x\x00")
        {'OTEL_SERVICE_NAME': b'svc'}

    """
    out: dict[str, bytes] = {}
    for entry in data.split(b"\x00"):
        if not entry.startswith(b"OTEL_"):
            continue
        name, sep, value = entry.partition(b"=")
        if not sep:
            continue
        try:
            key = name.decode("ascii")
        except UnicodeDecodeError:
            continue
        out.setdefault(key, value)
    return out


def select_environ(data: bytes, names: frozenset[bytes]) -> dict[str, bytes]:
    r"""Return the variables named in ``names`` from NUL-separated ``environ`` bytes.

    The eBPF profiler's rule (``process/process.go``, ``NewEnvVarsEnricher``): each entry is
    split on its first ``=``; an entry without ``=`` is skipped; the name must equal a configured
    one exactly; the value is kept verbatim (raw bytes, possibly empty); a repeated name keeps
    its **last** value (the profiler fills a map in order). Names are decoded as UTF-8 (a
    configured name always is).

    Examples:
        >>> select_environ(b"A=1\x00B=x=y\x00A=2\x00C\x00", frozenset({b"A", b"B", b"C"}))
        {'A': b'2', 'B': b'x=y'}

    """
    out: dict[str, bytes] = {}
    if not names:
        return out
    for entry in data.split(b"\x00"):
        name, sep, value = entry.partition(b"=")
        if sep and name in names:
            out[name.decode("utf-8")] = value
    return out


def _strip_deleted(target: str) -> str | None:
    if target.endswith(_DELETED):
        target = target[: -len(_DELETED)]
    return target or None


def _tuple(items: list[str] | None) -> tuple[str, ...] | None:
    return None if items is None else tuple(items)


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb", buffering=0) as fh:
            chunks = []
            total = 0
            while total < MAX_FILE_BYTES:
                chunk = fh.read(min(65536, MAX_FILE_BYTES - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            return b"".join(chunks)
    except OSError:  # ENOENT, ESRCH, EACCES, EIO: the process exited or is not ours to read
        return None


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _readlink_bytes(path: str) -> bytes | None:
    try:
        return os.readlink(os.fsencode(path))
    except OSError:
        return None


def _pwd_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None
