"""Default limits of the declared-process store (``identity.declared``) and of the resource cache.

The cache is the resourcer's (``identity.resource_limits.cache_max_bytes``). Constants only, so
the configuration model can name the defaults without importing the store.
:class:`~gpumetrics.identity.declared.DeclaredStore` takes them as its parameter defaults.
"""

from __future__ import annotations

DEFAULT_MAX_PROCESSES = 100_000
"""Default ``max_processes``: processes held at once."""

DEFAULT_MAX_PROCESS_CONTEXT_BYTES = 65536
"""Default ``max_process_context_bytes``: the largest OTEP 4719 process-context payload (By)."""

DEFAULT_MAX_ENVIRONMENT_BYTES = 65536
"""Default ``max_environment_bytes``: the largest sum of captured names and values (By)."""

DEFAULT_MAX_PROFILER_RESOURCE_BYTES = 65536
"""Default ``max_profiler_resource_bytes``: the largest profiler-supplied resource (By)."""

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""Default ``max_bytes``: 64 MiB of decoded declarations (about 20,000 typical ones of ~3 KiB,
or 40 with every field at its 64 KiB limit)."""

DEFAULT_RESOURCE_CACHE_MAX_BYTES = 16 * 1024 * 1024
"""Default ``identity.resource_limits.cache_max_bytes``: the resources the resourcer keeps for
reuse across batches, estimated like declarations (about 1 000 resources at the 8 KiB resource
limit, far more typical ones of under 1 KiB)."""
