"""What a process's ``/proc/<pid>/cgroup`` says: its container id and its main cgroup path.

Both are pure functions over the file's text so they can be tested line by line.

* :func:`container_id` follows the OpenTelemetry eBPF profiler (``process/process.go``,
  ``parseContainerID``), whose ``container.id`` our resources must equal: lines are
  ``<id>:<controllers>:<path>``; ``0::/`` is skipped; the first line whose path *ends* with a
  64-hex id or an ECS task id (``<32 hex>-<digits>``), optionally followed by ``.scope`` and one
  lowercase path element (``/init``), gives the id. Lines longer than 8 192 bytes are skipped
  (the profiler's scanner limit).
* :func:`main_cgroup_path` follows parca-agent (``reporter/metadata/process.go``,
  ``findContainerGroup``) for ``__meta_process_cgroup``: the only line if there is one; otherwise
  the first line with the ``cpu`` controller, or a ``/system.slice/``/``/user.slice/`` path, or a
  controller containing ``systemd``.
"""

from __future__ import annotations

import re

_MAX_LINE = 8192
_LINE = re.compile(r"[0-9]+:[^:]*:(.+)\Z")
_CONTAINER_ID = re.compile(r"([0-9a-f]{64}|[0-9a-f]{32}-[0-9]+)(?:\.scope)?(?:/[a-z]+)?\Z")


def container_id(cgroup_text: str) -> str | None:
    """Return the container id found in ``/proc/<pid>/cgroup`` text, or None.

    Examples:
        >>> container_id("0::/system.slice/docker-" + "ab" * 32 + ".scope")[:8]
        'abababab'
        >>> container_id("0::/user.slice/user-1000.slice/session-3.scope") is None
        True

    """
    for line in cgroup_text.splitlines():
        if line == "0::/" or len(line) > _MAX_LINE:
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        found = _CONTAINER_ID.search(m.group(1))
        if found is not None:
            return found.group(1)
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
