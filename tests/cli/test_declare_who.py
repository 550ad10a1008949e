"""Who may declare, end to end: the CLI as uid nobody against the real sidecar (issue 23 item 2).

Before, ``gpumetrics declare 127.0.0.1:4319 --pid <victim> --start-time-ticks 0 --attr
host.name=x`` run as nobody was accepted on the default listener. Now the profiler service is on
its own unix socket, which knows each caller's uid, and no longer on the TCP listener.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpumetrics.cli import main

from .served import GPUMETRICS, Served, clean_env

AS_NOBODY = Path(__file__).with_name("as_nobody.py")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A short directory every user may enter (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="gm-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(AS_NOBODY), *argv], capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the CLI as another user")
def test_the_cli_as_nobody_cannot_declare_roots_process(open_dir: Path) -> None:
    served = Served(
        open_dir,
        "h100-sxm",
        config='server:\n  unix_socket_mode: "0666"\n',  # any user may connect: the subject
        args=["--profiler-listen", f"unix:{open_dir}/profiler.sock"],
    )
    try:
        done = _as_nobody(
            "declare", f"unix:{open_dir}/profiler.sock", "--pid", "1", "--start-time-ticks", "0",
            "--attr", "host.name=x", "--attr", "container.id=y",
        )  # fmt: skip
        assert done.returncode == 3, done.stderr  # EXIT_REJECTED
        assert done.stdout == (
            "accepted 0\n"
            "rejected pid 1: processes[0].pid: pid 1 belongs to uid 0, not to this peer "
            "(uid 65534); only root, the sidecar's own user and server.trusted_declarer_uids / "
            "server.trusted_declarer_gids may declare another user's process or observed "
            "attributes\n"
        )
        # the main TCP-or-unix listener does not serve the profiler service at all
        done = _as_nobody(
            "declare", served.address, "--pid", "1", "--start-time-ticks", "0",
            "--attr", "host.name=x",
        )  # fmt: skip
        assert done.returncode == 1 and "UNIMPLEMENTED" in done.stderr, done.stderr
        served.stop()
    finally:
        served.close()


def test_the_tcp_listener_serves_no_profiler_service(open_dir: Path, capsys) -> None:
    """The issue's command against the pull listener on loopback TCP, the profiler service being
    on its socket (the default; here in ``open_dir``: ``Served`` never uses the machine's)."""
    served = Served(open_dir, "h100-sxm", listen="127.0.0.1:0")
    try:
        code = main(
            ["declare", served.address, "--pid", str(os.getpid()), "--start-time-ticks", "0",
             "--attr", "host.name=x", "--attr", "container.id=y"]
        )  # fmt: skip
        err = capsys.readouterr().err
        assert code == 1
        assert f"declare to {served.address}: UNIMPLEMENTED" in err
        served.stop()
    finally:
        served.close()


def test_the_profiler_service_on_tcp_without_a_token_does_not_start() -> None:
    done = subprocess.run(
        [str(GPUMETRICS), "serve", "--simulate", "h100-sxm", "--listen", "127.0.0.1:0",
         "--profiler-listen", "127.0.0.1:0"],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (
        "gpumetrics: 'server.profiler_listen[0]' (from flag --profiler-listen): the profiler "
        "service on TCP 127.0.0.1:0 would let every local user declare any process's identity; "
        "serve it on a unix socket (server.profiler_listen, the default), set "
        "server.declare_token_file (--declare-token-file) or server.tls_client_ca_file (mTLS), "
        "or, on a single-user host you trust, set server.allow_unauthenticated_declare "
        "(--allow-unauthenticated-declare)\n"
    )


def test_allowing_it_explicitly_starts(open_dir: Path, capsys) -> None:
    served = Served(
        open_dir,
        "h100-sxm",
        listen="127.0.0.1:0",
        args=["--profiler-listen", "127.0.0.1:0", "--allow-unauthenticated-declare"],
    )
    try:
        assert (
            "declare: no token"
            in served.wait_record(lambda r: r.get("@message", "").startswith("ready:"))["@message"]
        )
        served.stop()
    finally:
        served.close()
