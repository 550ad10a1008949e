"""The sidecar's real gRPC server in its own process, for the pull and profiler benchmarks.

``python -m benchmarks.server_fixture [--batches FILE] [--max-consumers N] [--no-procfs]
[--declared-max-bytes N]``

Builds what ``gpumetrics.runtime.sidecar.Sidecar`` builds for serving, minus collection (and,
as ``serve`` does, pins the allocator's mmap threshold, ``gpumetrics.runtime.memory``): the
real ``BatchStore`` (default limits; ``--max-consumers`` may raise the consumer count so a
benchmark can register one consumer per repetition), the real ``DeclaredStore`` with the default
limits, ``pid_max`` 4194304 and the real procfs start-time reader, and ``SidecarServer`` with
default ``ServerSettings`` on ``127.0.0.1:0``. ``--batches`` appends serialized batches first
(the file written by :func:`write_batches`). ``--no-procfs`` gives the declared store no
start-time reader, so declarations of pids that do not exist here are kept (a benchmark of the
store's own bounds). ``--declared-max-bytes`` raises the declared store's byte budget
(``identity.declared.max_bytes``) for a benchmark that must hold all it declares. It prints
``ADDR host:port`` and serves until its standard input closes, so a client in another process
measures the server without sharing its GIL; then ``DECLARED n``.
"""

from __future__ import annotations

import argparse
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpumetrics.identity import DeclaredStore, ProcfsReader
from gpumetrics.metrics import count_points
from gpumetrics.selftelemetry import Telemetry
from gpumetrics.service import ServerSettings, SidecarHealth, SidecarServer
from gpumetrics.store import BatchStore, StoreLimits

_HEADER = struct.Struct("<QQ")  # points, length


def write_batches(requests: Sequence[Any], path: Path) -> None:
    """Write ``requests`` serialized, each as (points, length, bytes)."""
    with open(path, "wb") as fh:
        for r in requests:
            data = r.SerializeToString()
            fh.write(_HEADER.pack(count_points(r), len(data)))
            fh.write(data)


def read_batches(path: Path) -> list[tuple[int, bytes]]:
    """Read what :func:`write_batches` wrote: ``[(points, serialized), ...]``."""
    out = []
    raw = path.read_bytes()
    at = 0
    while at < len(raw):
        points, size = _HEADER.unpack_from(raw, at)
        at += _HEADER.size
        out.append((points, raw[at : at + size]))
        at += size
    return out


def main() -> int:
    """Build, start, print the address, serve until stdin closes."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=Path)
    ap.add_argument("--max-consumers", type=int, default=StoreLimits().max_consumers)
    ap.add_argument("--no-procfs", action="store_true")
    ap.add_argument("--declared-max-bytes", type=int, default=None)
    args = ap.parse_args()
    try:  # what `gpumetrics serve` does first (absent from older checkouts)
        from gpumetrics.runtime.memory import return_large_buffers_to_the_os
    except ImportError:
        pass
    else:
        return_large_buffers_to_the_os()
    telemetry = Telemetry()
    store = BatchStore(StoreLimits(max_consumers=args.max_consumers), telemetry=telemetry)
    if args.batches:
        for points, data in read_batches(args.batches):
            store.append_serialized(data, points)
    procfs = ProcfsReader("/proc", host_pid_namespace=True)
    reader = None if args.no_procfs else procfs.start_time_ticks
    limits = {} if args.declared_max_bytes is None else {"max_bytes": args.declared_max_bytes}
    declared = DeclaredStore(pid_max=4_194_304, start_time_reader=reader, **limits)
    health = SidecarHealth()
    server = SidecarServer(
        ServerSettings(
            listen=["127.0.0.1:0"], profiler_listen=[], allow_unauthenticated_declare=True
        ),
        store,
        declared,
        health,
        telemetry,
    )
    server.start()
    health.mark_ready()
    print("ADDR", server.addresses.listen[0], flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop(grace=1.0)
    print("DECLARED", len(declared), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
