"""The reference model of ``test_batchstore_properties`` against a durable store that is killed.

The same rules and invariants, with one more rule: ``crash``, a ``kill -9`` at that point (the
store's files copied as they are on disk, the live store abandoned) and a restart on the copy.
Every answer and counter after any number of crashes must still be what the model, which never
restarts, says: the epoch and the sequences go on, every consumer keeps its cursor, delivered
sequence and drop report, and nothing is lost or sent twice beyond the protocol's rules. The one
thing a restart changes is documented: consumers' idle time starts again (their TTL counts from
the restart), which the model applies too.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from gpumetrics.store import LOGS, BatchStore
from hypothesis import HealthCheck, settings
from hypothesis.stateful import initialize, rule

from .conftest import Clock, crash_copy, journal
from .test_batchstore_properties import LIMITS, StoreModel


class DurableStoreModel(StoreModel):
    @initialize()
    def setup(self) -> None:
        super().setup()
        self.root = Path(tempfile.mkdtemp(prefix="gpumetrics-durable-"))
        self.runs = 0
        self.dir = self.root / "run0"
        self.store = self._open(self.dir, self.clock)
        self.crashes = 0

    def _open(self, directory: Path, clock: Clock) -> BatchStore:
        jr = journal(directory, self.SIGNAL, clock=clock)
        return BatchStore(LIMITS, clock=clock, epoch="E", signal=self.SIGNAL, journal=jr)

    @rule()
    def crash(self) -> None:
        self.runs += 1
        copy = crash_copy(self.dir, self.root / f"run{self.runs}")
        self.store.close()  # the killed process's file is never touched again
        self.dir, self.store = copy, self._open(copy, self.clock)
        assert self.store.durable_state == "ok" and self.store.epoch == "E"
        for c in self.consumers.values():
            c.last_seen = self.clock.now  # idle time starts again at a restart (documented)
        self.m_expire(self.clock.now)  # the limits apply as the batches load
        self.crashes += 1

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)


class DurableLogStoreModel(DurableStoreModel):
    SIGNAL = LOGS


_SETTINGS = settings(
    derandomize=True,
    max_examples=25,  # every step commits (an fsync): fewer examples than the in-memory model
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
DurableStoreModel.TestCase.settings = _SETTINGS
DurableLogStoreModel.TestCase.settings = _SETTINGS
TestDurableStoreModel = DurableStoreModel.TestCase
TestDurableLogStoreModel = DurableLogStoreModel.TestCase
