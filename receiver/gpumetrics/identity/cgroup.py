r"""What a process's ``/proc/<pid>/cgroup`` says: its container id and its main cgroup path.

Both are pure functions over the file's contents, so they can be tested on recorded strings.

* :func:`container_id` follows the OpenTelemetry eBPF profiler
  (``go.opentelemetry.io/ebpf-profiler`` v0.0.202633, ``process/process.go``,
  ``parseContainerID``), whose ``container.id`` our resources must equal byte for byte. The file
  is scanned as Go's ``bufio.Scanner`` with ``ScanLines`` and an 8 192-byte buffer does it: lines
  end at ``\n`` only, one trailing ``\r`` is dropped, and a line of 8 192 bytes or more **ends
  the scan** (nothing after it is read). ``0::/`` is skipped; the first line
  ``<digits>:<controllers>:<path>`` whose path *ends* with a 64-hex id or an ECS task id
  (``<32 hex>-<digits>``), optionally followed by ``.scope`` and one lowercase path element
  (``/init``), gives the id. ``tests/testdata/identity/ebpf_profiler_container_id_cases.yaml``
  holds the profiler's own test strings, ``cgroup_cases.yaml`` edge cases checked against its Go
  code.
* :func:`main_cgroup_path` follows parca-agent (``reporter/metadata/process.go``,
  ``findContainerGroup``) for ``__meta_process_cgroup``: the only line if there is one; otherwise
  the first line with the ``cpu`` controller, or a ``/system.slice/``/``/user.slice/`` path, or a
  controller containing ``systemd``.
"""

from __future__ import annotations

import re

_MAX_LINE = 8192
r"""``bufio.Scanner``'s buffer in ``parseContainerID``: a line (without its ``\n``) must be
shorter than this, or the scan stops with ``ErrTooLong``."""
_LINE = re.compile(rb"[0-9]+:[^:]*:(.+)\Z", re.S)
_CONTAINER_ID = re.compile(rb"([0-9a-f]{64}|[0-9a-f]{32}-[0-9]+)(?:\.scope)?(?:/[a-z]+)?\Z")


def container_id(cgroup: bytes | str) -> str | None:
    r"""Return the container id found in ``/proc/<pid>/cgroup`` contents, or None.

    Args:
        cgroup: the file's bytes (a ``str`` is encoded as UTF-8 first). Bytes matter: the
            profiler's 8 192-byte line limit counts bytes, and Go's regexps (``\d`` is ASCII
            only) see the raw bytes too.

    Examples:
        >>> container_id(b"0::/system.slice/docker-" + b"ab" * 32 + b".scope")[:8]
        'abababab'
        >>> container_id("0::/user.slice/user-1000.slice/session-3.scope") is None
        True

    """
    data = cgroup.encode("utf-8", "surrogateescape") if isinstance(cgroup, str) else cgroup
    for line in data.split(b"\n"):
        if line.endswith(b"\r"):
            line = line[:-1]  # ScanLines' dropCR
            raw_len = len(line) + 1
        else:
            raw_len = len(line)
        if raw_len >= _MAX_LINE:
            return None  # Scan() fails with ErrTooLong: the profiler reads no further
        if line == b"0::/":
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        found = _CONTAINER_ID.search(m.group(1))
        if found is not None:
            return found.group(1).decode("ascii")
    return None


def main_cgroup_path(cgroup_text: str) -> str | None:
    """Return the main cgroup path (parca-agent's ``__meta_process_cgroup``), or None.

    Examples:
        >>> main_cgroup_path("0::/kubepods/pod1/abc")
        '/kubepods/pod1/abc'

    """
    groups: list[tuple[list[str], str]] = []
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        groups.append((parts[1].split(","), parts[2]))
    if len(groups) == 1:
        return groups[0][1] or None
    for controllers, path in groups:
        if "cpu" in controllers:
            return path or None
        if path.startswith(("/system.slice/", "/user.slice/")):
            return path
        if any("systemd" in c for c in controllers):
            return path or None
    return None
