"""Process-wide memory settings of a serving sidecar: large buffers go back to the OS when freed.

A Pull answer and a batch's serialization are buffers of up to ``server.pull_max_bytes`` (16 MiB)
and ``server.pull_default_max_bytes`` (4 MiB). glibc serves allocations above its mmap threshold
with their own ``mmap`` and unmaps them on ``free``, but it raises that threshold (up to 32 MiB)
each time such a block is freed, after which large buffers come from its per-thread arenas and
stay resident when freed: eight concurrent 16 MiB Pulls left about 270 MB resident on top of the
store, although the answers in flight never exceeded ``server.pull_inflight_bytes`` (32 MiB);
with the threshold pinned, the peak stayed within about twice that budget
(``benchmarks/hardening_bench.py pulls``, figures in ``docs/performance.md``). Pinning it with
``mallopt(M_MMAP_THRESHOLD, ...)`` (glibc ``malloc(3)``: setting it disables the dynamic
adjustment) keeps the bound that ``docs/deployment.md`` states.
"""

from __future__ import annotations

import ctypes
import logging

__all__ = ["LARGE_BUFFER_BYTES", "return_large_buffers_to_the_os"]

log = logging.getLogger(__name__)

LARGE_BUFFER_BYTES = 1024 * 1024
"""Allocations of at least this many bytes (By) get their own mapping, unmapped when freed."""

_M_MMAP_THRESHOLD = -3  # <malloc.h>


def return_large_buffers_to_the_os(threshold: int = LARGE_BUFFER_BYTES) -> bool:
    """Pin glibc's mmap threshold at ``threshold`` bytes; return False where that is unavailable.

    Without glibc (``mallopt`` missing, or refusing as musl's does) nothing changes and the
    bound on answers in flight still holds; only freed memory may stay resident longer.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.debug("mallopt is not available: large buffers follow the allocator's defaults")
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, threshold))
    log.debug("malloc: allocations of %d bytes and more are mmapped: %s", threshold, done)
    return done
