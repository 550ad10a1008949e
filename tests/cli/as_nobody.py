"""Run ``gpumetrics ARGS...`` as uid/gid 65534 (nobody): a test helper, run as a script.

Started as root, it imports the CLI and makes one failing ``declare`` first (grpc and the CLI
import lazily; nobody may not read the interpreter's library under /root), then drops to 65534
with no supplementary groups and runs the command. Its exit status is the command's.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys

from gpumetrics.cli import client, main  # noqa: F401 - imported as root

NOBODY = 65534

with contextlib.redirect_stderr(io.StringIO()):
    main(["declare", "unix:/nonexistent/gpumetrics-warm.sock", "--pid", "1",
          "--start-time-ticks", "0", "--timeout", "1"])  # fmt: skip
os.setgroups([])
os.setgid(NOBODY)
os.setuid(NOBODY)
sys.exit(main(sys.argv[1:]))
