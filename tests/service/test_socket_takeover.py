"""A second server on a live unix socket path is refused; a stale socket file is reused."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
from gpumetrics.identity.declared import DeclaredStore
from gpumetrics.service import ListenError, ServerSettings, SidecarHealth, SidecarServer
from gpumetrics.store import BatchStore


def make(path: str) -> SidecarServer:
    settings = ServerSettings(listen=[f"unix:{path}"], profiler_listen=[])
    return SidecarServer(settings, BatchStore(), DeclaredStore(), SidecarHealth())


def test_a_live_socket_is_not_taken_over_and_keeps_its_file(tmp_path: Path) -> None:
    path = str(tmp_path / "gm.sock")
    first = make(path)
    first.start()
    try:
        inode = os.stat(path).st_ino
        second = make(path)
        with pytest.raises(ListenError, match=r"'listen\[0\]': unix socket .* is in use"):
            second.start()
        second.stop(0)
        assert os.stat(path).st_ino == inode  # the failed server removed nothing of the first
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(path)  # the first server still answers on its path
        probe.close()
    finally:
        first.stop(0)
    assert not os.path.exists(path)


def test_a_stale_socket_file_is_removed_and_the_path_reused(tmp_path: Path) -> None:
    path = str(tmp_path / "gm.sock")
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)  # bound but never listening, then closed: a killed server's leftover
    dead.close()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    server = make(path)
    server.start()
    try:
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(path)
        probe.close()
    finally:
        server.stop(0)


def test_a_regular_file_at_the_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gm.sock"
    path.write_text("not a socket")
    server = make(str(path))
    with pytest.raises(ValueError, match="not a unix socket"):
        server.start()
    server.stop(0)
    assert path.read_text() == "not a socket"


def test_an_unquoted_octal_mode_is_explained() -> None:
    with pytest.raises(ValueError, match=r'quoted string, e.g. "0660"'):
        ServerSettings(unix_socket_mode=660)
    # a number whose digits are not octal gets no impossible hint ("099999"), newcomer F7
    with pytest.raises(ValueError, match=r"99999 is not a file mode; a mode is 0 to 0777 in octal"):
        ServerSettings(unix_socket_mode=99999)
    # a string from YAML or a flag, converted by the field validator
    assert ServerSettings(unix_socket_mode="0660").unix_socket_mode == 0o660  # type: ignore[arg-type]
