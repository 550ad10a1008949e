"""The batcher: turns what the collectors recorded into store batches, on a fixed interval.

Runtime contract (``docs/architecture.md``): every ``interval_s`` the batcher calls
``producer.collect()`` and appends the result to the :class:`~gpumetrics.store.BatchStore`
(a producer with ``collect_batches(max_bytes)``, as ``gpumetrics.metrics.Producer`` has, gives
it serialized requests that already fit the store's ``max_batch_bytes``, stored with
``append_serialized`` without a parse),
then runs its companions (the GPU events' ``EventProducer.flush_to(log_store)``);
health turns SERVING after the first batch that **follows** ``Collector.ready`` (the collector
had completed a whole cycle before that batch's ``collect``). Until then it checks readiness
every ``ready_poll_s`` so the first batch does not wait a whole interval.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["Batcher"]

log = logging.getLogger(__name__)


class _Producer(Protocol):
    def collect(self) -> Any: ...


class _Store(Protocol):
    def append(self, request: Any) -> int: ...

    def append_serialized(self, data: bytes, points: int) -> int: ...

    @property
    def max_batch_bytes(self) -> int: ...


class Batcher:
    """Moves ``producer.collect()`` into ``store`` every ``interval_s`` seconds.

    Args:
        producer: has ``collect() -> ExportMetricsServiceRequest``, or
            ``collect_batches(max_bytes) -> [(bytes, points)]`` (preferred when present).
        store: has ``append(request) -> int``, ``append_serialized(data, points) -> int`` and
            ``max_batch_bytes``.
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
            seq = None
            batches = getattr(self._producer, "collect_batches", None)
            if batches is not None:
                for data, points in batches(self._store.max_batch_bytes):
                    seq = self._store.append_serialized(data, points)
            else:
                request = self._producer.collect()
                if len(request.resource_metrics):
                    seq = self._store.append(request)
            if seq is not None:
                self.batches += 1
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
