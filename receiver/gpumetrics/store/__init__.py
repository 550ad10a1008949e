"""The batch store: bounded, sequenced batches of serialized OTLP metrics with per-consumer cursors.

See :mod:`gpumetrics.store.batchstore` for the semantics and ``docs/protocol.md`` for the
protocol built on it.
"""

from gpumetrics.store.batchstore import BatchStore, validate_consumer
from gpumetrics.store.limits import StoreLimits
from gpumetrics.store.results import (
    CONSUMER_NAME_RE,
    DEFAULT_CONSUMER,
    DROP_REASONS,
    ConsumerStats,
    Delivery,
    PullResult,
    StoreStats,
    TooManyConsumersError,
)

__all__ = [
    "CONSUMER_NAME_RE",
    "DEFAULT_CONSUMER",
    "DROP_REASONS",
    "BatchStore",
    "ConsumerStats",
    "Delivery",
    "PullResult",
    "StoreLimits",
    "StoreStats",
    "TooManyConsumersError",
    "validate_consumer",
]
