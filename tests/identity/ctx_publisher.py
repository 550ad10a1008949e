"""A real OTEP 4719 publisher in a child process, driven over pipes (test helper).

Run as a script, the child reads one JSON command per line on stdin and answers one JSON line on
stdout; it exits on ``{"op": "exit"}`` or when stdin closes (so it never outlives the test). It
publishes the way sig-profiling's C publisher does (OTEP 4719's publication and update
protocols; open-telemetry/sig-profiling ``process-context/c-and-cpp/otel_process_ctx.c``): a
``memfd_create("OTEL_CTX")`` mapping (``MAP_PRIVATE``, ``MADV_DONTFORK``) or an anonymous mapping
named with ``prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, ..., "OTEL_CTX")``, the 32-byte header at the
mapping's start and the payload in a separate heap buffer; updates follow the seqlock protocol
(timestamp 0, pointer/size, new later timestamp).

Imported, it provides :class:`Publisher`, the parent side.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
import subprocess
import sys
import time
from typing import Any

HEADER = struct.Struct("=8sIIQQ")
PR_SET_VMA = 0x53564D41
PR_SET_VMA_ANON_NAME = 0
MFD_NOEXEC_SEAL = 8


class _Child:
    def __init__(self) -> None:
        self.map: mmap.mmap | None = None
        self.addr = 0
        self.buffers: list[Any] = []  # keep payload buffers alive (old ones too: readers may race)
        self.ts = 0
        self.libc = ctypes.CDLL(None, use_errno=True)

    def _map(self, mode: str) -> dict[str, Any]:
        named = False
        err = 0
        if mode == "memfd":
            flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
            try:
                fd = os.memfd_create("OTEL_CTX", flags | MFD_NOEXEC_SEAL)
            except OSError:  # kernels before 6.3 lack MFD_NOEXEC_SEAL
                fd = os.memfd_create("OTEL_CTX", flags)
            os.ftruncate(fd, HEADER.size)
            prot = mmap.PROT_READ | mmap.PROT_WRITE
            self.map = mmap.mmap(fd, HEADER.size, mmap.MAP_PRIVATE, prot)
            os.close(fd)
        else:
            self.map = mmap.mmap(-1, mmap.PAGESIZE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.map.madvise(mmap.MADV_DONTFORK)
        view = ctypes.c_char.from_buffer(self.map)
        self.addr = ctypes.addressof(view)
        del view  # release the buffer export so the mapping can be closed later
        if mode == "anon_named":
            rc = self.libc.prctl(
                PR_SET_VMA,
                PR_SET_VMA_ANON_NAME,
                ctypes.c_ulong(self.addr),
                ctypes.c_ulong(mmap.PAGESIZE),
                ctypes.c_char_p(b"OTEL_CTX"),
            )
            named, err = rc == 0, (0 if rc == 0 else ctypes.get_errno())
        return {"named": named, "errno": err}

    def _next_ts(self) -> int:
        ts = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        self.ts = ts if ts > self.ts else self.ts + 1
        return self.ts

    def _payload(self, hexdata: str, size: int | None) -> tuple[int, int]:
        data = bytes.fromhex(hexdata)
        buf = ctypes.create_string_buffer(data, max(len(data), 1))
        self.buffers.append(buf)
        return ctypes.addressof(buf), len(data) if size is None else size

    def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["op"]
        out: dict[str, Any] = {}
        if op == "publish":
            out = self._map(cmd.get("mode", "memfd"))
            ptr, size = self._payload(cmd["payload"], cmd.get("size"))
            assert self.map is not None
            HEADER.pack_into(self.map, 0, b"OTEL_CTX", cmd.get("version", 2), size, 0, ptr)
            struct.pack_into("=Q", self.map, 16, self._next_ts())
        elif op == "update":
            assert self.map is not None
            ptr, size = self._payload(cmd["payload"], cmd.get("size"))
            struct.pack_into("=Q", self.map, 16, 0)
            struct.pack_into("=I", self.map, 12, size)
            struct.pack_into("=Q", self.map, 24, ptr)
            struct.pack_into("=Q", self.map, 16, self._next_ts())
        elif op == "set":
            assert self.map is not None
            fmt, offset = {"version": ("=I", 8), "size": ("=I", 12), "ts": ("=Q", 16)}[cmd["field"]]
            struct.pack_into(fmt, self.map, offset, cmd["value"])
        elif op == "unmap":
            assert self.map is not None
            self.map.close()
            self.map = None
        out.update({"header": self.addr, "ts": self.ts})
        return out


def _child_main() -> None:
    child = _Child()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            return
        sys.stdout.write(json.dumps(child.handle(cmd)) + "\n")
        sys.stdout.flush()


class Publisher:
    """Parent side: starts the child and sends it commands (each answered before returning)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        """Send one command and return the child's answer."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"publisher child exited (rc={self.proc.poll()})")
        return json.loads(line)

    def publish(self, payload: bytes, **kw: Any) -> dict[str, Any]:
        """Publish ``payload`` (a serialized ProcessContext) as a new context."""
        return self.call("publish", payload=payload.hex(), **kw)

    def update(self, payload: bytes, **kw: Any) -> dict[str, Any]:
        """Replace the published payload with the seqlock update protocol."""
        return self.call("update", payload=payload.hex(), **kw)

    def exit(self) -> None:
        """Make the child exit and wait for it (bounded)."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            self.proc.wait(timeout=30)

    def close(self) -> None:
        """Kill the child if it is still running and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


if __name__ == "__main__":
    _child_main()
