"""The batcher: turns what the collectors recorded into store batches, on a fixed interval.

Runtime contract (``docs/architecture.md``): every ``interval_s`` the batcher calls
``producer.collect_parts(max_collection_bytes)`` and appends the parts to the
:class:`~gpumetrics.store.BatchStore` (``append_parts``); the points of processes the producer
left out for the budget are charged to the store as drop reason ``max_collection_bytes`` (logged
once). Then it runs its companions (the GPU events' ``EventProducer.flush_to(log_store)``);
health turns SERVING after the first batch that **follows** ``Collector.ready`` (the collector
had completed a whole cycle before that batch's ``collect``). Until then it checks readiness
every ``ready_poll_s`` so the first batch does not wait a whole interval.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

__all__ = ["Batcher"]

log = logging.getLogger(__name__)


class _Producer(Protocol):
    def collect_parts(self, max_bytes: int = 0) -> Any: ...


class _Store(Protocol):
    def append_parts(self, parts: Iterable[tuple[bytes, int]]) -> int: ...

    def charge_unstored(self, points: int, reason: str) -> None: ...


class Batcher:
    """Moves ``producer.collect_parts()`` into ``store`` every ``interval_s`` seconds.

    Args:
        producer: has ``collect_parts(max_bytes) -> CollectionParts``
            (:class:`gpumetrics.metrics.producer.CollectionParts`).
        store: has ``append_parts(parts) -> int`` and ``charge_unstored(points, reason)``.
        interval_s: seconds between batches.
        collector_ready: set by the collector after its first complete cycle.
        on_ready: called once, after the first batch that follows ``collector_ready``.
        wait: ``wait(seconds) -> bool`` (True = stop); default the batcher's stop event. Tests
            inject a controllable one so they never sleep.
        ready_poll_s: readiness check period (s) before the first ready batch.
        after_batch: called after every :meth:`run_once` (the NVML liveness gate).
        companions: more batches made with each one: ``companion(final)`` is called after the
            metric batch (``final`` is True for the last batch at shutdown); an exception is
            logged and does not stop the others.
        max_collection_bytes: the budget of one collection (By, serialized; 0 = none): the
            producer leaves out the processes beyond it (``store.max_collection_bytes``).

    """

    def __init__(
        self,
        producer: _Producer,
        store: _Store,
        interval_s: float,
        collector_ready: threading.Event,
        on_ready: Callable[[], None] = lambda: None,
        wait: Callable[[float], bool] | None = None,
        ready_poll_s: float = 0.05,
        after_batch: Callable[[], object] = lambda: None,
        companions: Sequence[Callable[[bool], object]] = (),
        max_collection_bytes: int = 0,
    ) -> None:
        self._producer = producer
        self._store = store
        self._interval_s = interval_s
        self._collector_ready = collector_ready
        self._on_ready = on_ready
        self._stop = threading.Event()
        self._wait = wait if wait is not None else self._stop.wait
        self._ready_poll_s = ready_poll_s
        self._after_batch = after_batch
        self._companions = tuple(companions)
        self._max_collection_bytes = max_collection_bytes
        self._over_budget_logged = False
        self._announced = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.batches = 0
        """Batches appended so far (for logs and tests)."""

    @property
    def announced(self) -> bool:
        """True once ``on_ready`` was called."""
        return self._announced

    def run_once(self, final: bool = False) -> int | None:
        """Collect and append one batch now; return its sequence (None when nothing was recorded).

        Then run the companions (``final``: this is the last batch, at shutdown). Serialised:
        concurrent calls (the thread and a final batch at shutdown) never interleave.
        """
        with self._lock:
            was_ready = self._collector_ready.is_set()
            collection = self._producer.collect_parts(self._max_collection_bytes)
            if collection.dropped_points:
                self._over_budget(collection)
            seq = None
            if collection.parts:
                seq = self._store.append_parts(collection.parts)
                self.batches += 1
            # stored: the collection's bytes go before the companions build theirs, so the two
            # batches under construction are never held at once (docs/deployment.md, "Memory")
            del collection
            if was_ready and not self._announced:
                self._announced = True
                log.debug("first collection stored: ready", extra={"sequence": seq})
                self._on_ready()
            for companion in self._companions:
                try:
                    companion(final)
                except Exception:  # noqa: BLE001 - a failed companion never stops metrics
                    log.exception("companion batch failed")
            self._after_batch()
            return seq

    def _over_budget(self, collection: Any) -> None:
        self._store.charge_unstored(collection.dropped_points, "max_collection_bytes")
        level = logging.DEBUG if self._over_budget_logged else logging.WARNING
        self._over_budget_logged = True
        log.log(
            level,
            "a collection exceeded store.max_collection_bytes (%d bytes): %d process "
            "resource(s) with %d data points left out, counted as drop reason "
            "max_collection_bytes (logged once)",
            self._max_collection_bytes,
            collection.dropped_resources,
            collection.dropped_points,
        )

    def _next_wait(self) -> float:
        if self._announced:
            return self._interval_s
        return min(self._interval_s, self._ready_poll_s)

    def _run(self) -> None:
        waited = 0.0
        while not self._stop.is_set():
            step = self._next_wait()
            if self._wait(step):
                return
            waited += step
            first_ready = not self._announced and self._collector_ready.is_set()
            if first_ready or waited >= self._interval_s:
                waited = 0.0
                try:
                    self.run_once()
                except Exception:  # noqa: BLE001 - one failed batch must not stop batching
                    log.exception("batch failed")

    def start(self) -> None:
        """Start the batching thread."""
        self._thread = threading.Thread(target=self._run, name="gpumetrics-batcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop and join the thread; return True when it ended within ``timeout_s``."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
