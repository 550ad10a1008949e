"""The batch store: bounded, sequenced batches of serialized OTLP metrics or logs, with cursors.

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
from gpumetrics.store.signals import LOGS, METRICS, Signal

__all__ = [
    "CONSUMER_NAME_RE",
    "DEFAULT_CONSUMER",
    "DROP_REASONS",
    "LOGS",
    "METRICS",
    "BatchStore",
    "ConsumerStats",
    "Delivery",
    "PullResult",
    "Signal",
    "StoreLimits",
    "StoreStats",
    "TooManyConsumersError",
    "validate_consumer",
]
