"""Limits of the :class:`~gpumetrics.store.BatchStore` and how the defaults were sized.

Sizing (measured with the real ``Producer`` and OTLP encoder and the catalogue as of this
commit; ``docs/protocol.md`` §Store limits): an 8-GPU node with 64 processes, each on one GPU,
with full device attributes and a typical per-process resource (service, container, Kubernetes
attributes), gives

* 512 data points and about 153 KiB per collection (24 device points per GPU, 5 per process), and
* 5,120 points and about 1.01 MiB per 10 s batch when the collectors sample every second
  (about 208 bytes per point once the resource and metric envelopes are shared).

The defaults keep 15 minutes of that node's worst case (1 s sampling, 10 s batches):
15 min = 90 batches = 460,800 points = about 91 MiB. ``max_age_s`` binds first on such a node;
``max_bytes`` (96 MiB, about 15.8 min) and ``max_data_points`` (500,000, about 16.3 min) are the
safety nets that cap memory on denser nodes (more processes per GPU, processes spread over
several GPUs), where they bind before the age does. With one sample per batch the same node
needs only about 13 MiB for 15 minutes.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_BYTES = 96 * 1024 * 1024
"""Default ``max_bytes``: 96 MiB of serialized OTLP (about 15.8 min of the sizing node)."""

DEFAULT_MAX_DATA_POINTS = 500_000
"""Default ``max_data_points`` (about 16.3 min of the sizing node at 1 s sampling)."""

DEFAULT_MAX_AGE_S = 15 * 60.0
"""Default ``max_age_s``: 15 minutes, in seconds."""

DEFAULT_CONSUMER_TTL_S = 5 * 60.0
"""Default ``consumer_ttl_s``: a consumer not seen for 5 minutes (30 pulls at a 10 s interval)
is forgotten and stops pinning data."""

DEFAULT_MAX_CONSUMERS = 16
"""Default ``max_consumers``: pull consumers plus the push exporter."""

DEFAULT_MAX_COLLECTION_BYTES = 16 * 1024 * 1024
"""Default ``store.max_collection_bytes``: 16 MiB of serialized OTLP per batch interval, 16 times
the sizing node's collection, and room for 1 000 processes whose resources are each at the
8 KiB default resource limit (``identity.resource_limits.max_bytes``) with their points."""

DEFAULT_MAX_BATCH_BYTES = 4 * 1024 * 1024 - 64 * 1024
"""Default ``BatchStore(max_batch_bytes=...)``: 4 MiB minus 64 KiB, so every batch fits, with its
Pull envelope, the 4 MiB default receive limit of gRPC clients (grpc-go, grpcio). The sizing
node's batch (about 1.01 MiB) is far below it; only denser nodes or longer batch intervals are
split."""


@dataclass(frozen=True)
class StoreLimits:
    """Bounds of one :class:`~gpumetrics.store.BatchStore`.

    Attributes:
        max_bytes: serialized bytes held (By); beyond it the oldest batches are dropped
            (drop reason ``max_bytes``).
        max_data_points: data points held; beyond it the oldest batches are dropped
            (drop reason ``max_data_points``).
        max_age_s: a batch older than this (s, measured on the store's monotonic clock from its
            append) is dropped (drop reason ``max_age``).
        consumer_ttl_s: a consumer that has not pulled for this long (s) is forgotten: it no
            longer pins batches; if it returns it is registered afresh from the oldest batch held.
        max_consumers: consumers registered at once; a new consumer beyond it is refused
            (:class:`~gpumetrics.store.TooManyConsumersError`) rather than evicting a live one.

    Raises:
        ValueError: naming the field (``'max_bytes': must be > 0``) when a limit is not positive.

    """

    max_bytes: int = DEFAULT_MAX_BYTES
    max_data_points: int = DEFAULT_MAX_DATA_POINTS
    max_age_s: float = DEFAULT_MAX_AGE_S
    consumer_ttl_s: float = DEFAULT_CONSUMER_TTL_S
    max_consumers: int = DEFAULT_MAX_CONSUMERS

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_data_points", "max_consumers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"'{name}': must be an int > 0, got {value!r}")
        for name in ("max_age_s", "consumer_ttl_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"'{name}': must be a number > 0 (seconds), got {value!r}")
