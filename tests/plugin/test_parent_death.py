"""When the go-plugin host dies without calling Shutdown, the sidecar notices and exits 0.

Process tree: pytest → helper (a child subreaper, so the orphan is re-parented to it and can be
reaped with waitpid) → host stand-in → ``gpumetrics serve`` in plugin mode. The helper kills the
host with SIGKILL and reports how the orphaned sidecar ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gpumetrics.service.plugin import COOKIE_KEY, COOKIE_VALUE

GPUMETRICS = Path(sys.executable).with_name("gpumetrics")

HELPER = textwrap.dedent(
    """
    import ctypes, os, signal, subprocess, sys, threading
    PR_SET_CHILD_SUBREAPER = 36
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    host = subprocess.Popen(
        [sys.executable, "-c", sys.argv[2]], stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, GPUMETRICS_BIN=sys.argv[1]),
    )
    pid = int(host.stdout.readline())        # the sidecar wrote its handshake: it is serving
    host.kill()
    host.wait()
    result = {}
    def reap():
        result["status"] = os.waitpid(pid, 0)[1]
    waiter = threading.Thread(target=reap, daemon=True)
    waiter.start()
    waiter.join(20)
    if "status" not in result:
        os.kill(pid, signal.SIGKILL)
        print("still running")
    else:
        print("exit", os.waitstatus_to_exitcode(result["status"]))
    """
)

HOST = textwrap.dedent(
    """
    import os, subprocess, sys
    child = subprocess.Popen(
        [os.environ["GPUMETRICS_BIN"], "serve", "--simulate"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    child.stdout.readline()                  # the handshake line
    print(child.pid, flush=True)
    child.stdout.close()
    import threading; threading.Event().wait()   # until killed
    """
)


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux-only"
)
def test_sidecar_exits_when_the_host_dies(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMETRICS_", "PLUGIN_"))}
    env.update(
        {
            COOKIE_KEY: COOKIE_VALUE,
            "PLUGIN_PROTOCOL_VERSIONS": "1",
            "PLUGIN_UNIX_SOCKET_DIR": str(tmp_path),
            "GPUMETRICS_PROFILER_LISTEN": f"unix:{tmp_path / 'profiler.sock'}",  # not the default
        }
    )
    result = subprocess.run(
        [sys.executable, "-c", HELPER, str(GPUMETRICS), HOST],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "exit 0", result.stdout + result.stderr
    assert os.listdir(tmp_path) == []  # the private socket directory was removed
