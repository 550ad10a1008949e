"""The batch store: bounded, sequenced batches of serialized OTLP metrics or logs, with cursors.

See :mod:`gpumetrics.store.batchstore` for the semantics, ``docs/protocol.md`` for the protocol
built on it, and :mod:`gpumetrics.store.journal` / :mod:`gpumetrics.store.durability` for the
durable copy on disk (``store.path``).
"""

from gpumetrics.store.batchstore import BatchStore, validate_consumer
from gpumetrics.store.durability import DURABLE_STATES
from gpumetrics.store.journal import (
    FILE_NAMES,
    JournalError,
    SqliteJournal,
    StorePathError,
    StoreRefusedError,
)
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
    "DURABLE_STATES",
    "FILE_NAMES",
    "LOGS",
    "METRICS",
    "BatchStore",
    "ConsumerStats",
    "Delivery",
    "JournalError",
    "PullResult",
    "Signal",
    "SqliteJournal",
    "StoreLimits",
    "StorePathError",
    "StoreRefusedError",
    "StoreStats",
    "TooManyConsumersError",
    "validate_consumer",
]
