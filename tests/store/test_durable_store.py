"""The durable store (``store.path``, issue 25): what a restart keeps, what the disk holds, and
what a fault does. Every test runs for the metric store and the log store of GPU events.

A restart is simulated as a ``kill -9`` is: the live store's files are copied as they are on
disk (:func:`crash_copy`, without closing it) and a new store opens the copy.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from gpumetrics.selftelemetry import Telemetry
from gpumetrics.store import (
    FILE_NAMES,
    BatchStore,
    Signal,
    SqliteJournal,
    StoreLimits,
    StorePathError,
    StoreRefusedError,
)
from gpumetrics.store.journal import (
    CACHE_BYTES,
    STORE_FORMAT,
    WAL_CHECKPOINT_PAGES,
    WAL_LIMIT_BYTES,
)

from .conftest import Clock, build_request, crash_copy, journal, same_state, tags

LIMITS = StoreLimits(max_bytes=10_000, max_data_points=1_000, max_age_s=100, consumer_ttl_s=1000)


_OPENED: list[BatchStore] = []


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    """Every store a test opened is closed when it ends (its file, and the file's lock)."""
    yield
    while _OPENED:
        _OPENED.pop().close()


def durable(tmp_path: Path, signal: Signal, clock: Clock, **kwargs: Any) -> BatchStore:
    limits = kwargs.pop("limits", LIMITS)
    jr = kwargs.pop("journal", None) or journal(tmp_path, signal, clock=clock)
    store = BatchStore(limits, clock=clock, signal=signal, journal=jr, **kwargs)
    _OPENED.append(store)
    return store


def restart(store_dir: Path, to: Path, signal: Signal, clock: Clock, **kwargs: Any) -> BatchStore:
    """The store a sidecar killed now and started again on the same store.path would have."""
    return durable(crash_copy(store_dir, to), signal, clock, **kwargs)


def rows(directory: Path, signal: Signal) -> list[int]:
    """Sequences of the batches a store's file holds (a copy is read: the store holds a lock)."""
    copy = crash_copy(directory, directory.parent / f"{directory.name}-read-{os.urandom(4).hex()}")
    with closing(sqlite3.connect(copy / FILE_NAMES[signal.name])) as conn:
        return [r[0] for r in conn.execute("SELECT seq FROM batches ORDER BY seq")]


def edit(path: Path, *statements: str) -> None:
    """Change a closed store's file behind its back (as another program would)."""
    with closing(sqlite3.connect(path)) as conn, conn:
        for statement in statements:
            conn.execute(statement)


# -- epoch, sequences, cursors and counters survive -----------------------------------------------


def test_restart_keeps_epoch_sequences_cursors_and_counters(
    tmp_path: Path, signal: Signal, clock: Clock
) -> None:
    d = tmp_path / "store"
    store = durable(d, signal, clock)
    for i in range(6):
        store.append(build_request(5, f"b{i + 1}", signal))
    a = store.pull("a", max_points=10)  # batches 1-2
    b = store.pull("b", max_points=15)  # b was sent 1-3, acknowledged nothing
    store.pull("a", a.last_sequence, a.epoch, ack_only=True)  # a acknowledged 1-2
    store.charge_unstored(4, "max_collection_bytes")  # a drop report both still owe
    before = store.stats()

    again = restart(d, tmp_path / "run2", signal, clock)
    after = again.stats()
    assert after.epoch == before.epoch == a.epoch  # no epoch reset
    assert same_state(before, after), (before, after)
    ra = again.pull("a", a.last_sequence, a.epoch, read_after_sequence=a.last_sequence)
    assert (ra.epoch, ra.first_sequence, ra.last_sequence) == (a.epoch, 3, 6)
    assert (ra.dropped_data_points, ra.drop_reasons) == (4, ("max_collection_bytes",))
    assert tags(signal, signal.parse(ra.data)) == ["b3", "b4", "b5", "b6"]
    # b resumes from its cursor with its delivered sequence: its acknowledgement of what it
    # was sent before the restart is applied, nothing it was not sent is released
    rb = again.pull("b", ack_sequence=6, ack_epoch=b.epoch)
    assert rb.first_sequence == 4 and again.stats().consumers[1].acked_sequence == 3
    assert again.append(build_request(1, "b7", signal)) == 7  # numbering goes on
    s = again.stats()
    assert s.appended_points == s.released_points + sum(s.dropped_points.values()) + s.held_points
    for c in s.consumers:
        assert c.offered_points == c.acked_points + c.dropped_points_total + c.unacked_held_points


def test_a_batch_is_on_disk_before_a_pull_can_see_it(
    tmp_path: Path, signal: Signal, clock: Clock
) -> None:
    seen: list[tuple[list[int], bool]] = []

    class Spy(SqliteJournal):
        def write(self, added: Any, first_held: int, state: str, now: float) -> None:
            super().write(added, first_held, state, now)
            seen.append(([b.seq for b in added], store._lock.locked()))

    d = tmp_path / "store"
    spy = Spy(str(d / FILE_NAMES[signal.name]), signal=signal.name, node="node-a", written_by="t")
    store = durable(d, signal, clock, journal=spy)
    seq = store.append(build_request(3, "x", signal))
    # committed inside the append, under the store's lock (no pull can run meanwhile)
    assert seen == [([seq], True)]
    assert rows(d, signal) == [seq]  # on disk when append returns, before any pull


def test_delivered_sequence_is_on_disk_before_the_answer_leaves(
    tmp_path: Path, signal: Signal, clock: Clock
) -> None:
    d = tmp_path / "store"
    store = durable(d, signal, clock)
    for i in range(4):
        store.append(build_request(2, f"b{i + 1}", signal))
    r = store.pull("collector", max_points=6)  # 1-3; the sidecar dies before the ack arrives
    again = restart(d, tmp_path / "run2", signal, clock)
    # the collector's receiver resumes with its own ack: applied (it was sent 1-3), released
    res = again.pull("collector", r.last_sequence, r.epoch, read_after_sequence=r.last_sequence)
    assert (res.first_sequence, res.last_sequence) == (4, 4)
    assert again.stats().released_batches == 3
    # old code: the restarted store had a new epoch and ignored the ack (the data came again)


def test_an_acknowledgement_releases_the_batch_on_disk(
    tmp_path: Path, signal: Signal, clock: Clock
) -> None:
    d = tmp_path / "store"
    store = durable(d, signal, clock)
    for i in range(3):
        store.append(build_request(2, f"b{i + 1}", signal))
    a, b = store.pull("a"), store.pull("b")
    store.pull("a", a.last_sequence, a.epoch, ack_only=True)
    assert rows(d, signal) == [1, 2, 3]  # b has not acknowledged: kept
    store.pull("b", 2, b.epoch, ack_only=True)
    assert rows(d, signal) == [3]
    store.pull("b", 3, b.epoch, ack_only=True)
    assert rows(d, signal) == []


def test_limits_bound_the_disk_and_count_drops_as_in_memory(
    tmp_path: Path, signal: Signal, clock: Clock
) -> None:
    d = tmp_path / "store"
    limits = StoreLimits(max_bytes=200_000, max_data_points=50_000, max_age_s=25)
    disk = durable(d, signal, clock, epoch="E", limits=limits)
    memory = BatchStore(limits, clock=clock, signal=signal, epoch="E")
    memory.pull("slow")
    disk.pull("slow")  # never acknowledges: the limits force the oldest batches out
    biggest = largest_batch = 0
    for i in range(400):
        request = build_request(20 + (i * 37) % 180, f"b{i}", signal)  # 1 to 20 KB
        largest_batch = max(largest_batch, request.ByteSize())
        for s in (disk, memory):
            s.append(request)
        clock.advance(1.0 if i < 200 else 0.1)  # age binds first, then the bytes
        biggest = max(biggest, sum(f.stat().st_size for f in d.iterdir()))
    assert same_state(disk.stats(), memory.stats())  # drops counted exactly as in memory
    dropped = disk.stats().dropped_points
    assert dropped["max_age"] > 0 and dropped["max_bytes"] > 0
    held = disk.stats()
    last = held.last_sequence
    assert rows(d, signal) == list(range(last - held.held_batches + 1, last + 1))
    # the documented ceiling (docs/deployment.md, "The durable store"): at most twice the held
    # bytes plus one batch (a batch rounds up to pages), a few fixed pages, and the WAL: its
    # checkpoint size plus one transaction
    page = 4096
    database = 2 * (limits.max_bytes + largest_batch) + 16 * page
    wal = WAL_CHECKPOINT_PAGES * page + largest_batch + 16 * page
    assert biggest <= database + wal, (biggest, database, wal)
    assert CACHE_BYTES == 1024 * 1024 and WAL_LIMIT_BYTES <= WAL_CHECKPOINT_PAGES * page


def test_batches_keep_their_age_across_a_restart(
    tmp_path: Path, signal: Signal, clock: Clock
) -> None:
    d = tmp_path / "store"
    store = durable(d, signal, clock)
    store.pull("c")
    store.append(build_request(3, "old", signal))
    clock.advance(60)
    store.append(build_request(2, "new", signal))
    clock.advance(50)  # the sidecar was down: the first batch is now 110 s old (> max_age 100)
    again = restart(d, tmp_path / "run2", signal, clock)
    s = again.stats()
    assert s.dropped_points["max_age"] == 3 and s.held_batches == 1
    r = again.pull("c")
    assert (r.dropped_data_points, r.drop_reasons) == (3, ("max_age",))
    assert tags(signal, signal.parse(r.data)) == ["new"]


def test_lower_limits_at_restart_drop_the_oldest_as_they_load(
    tmp_path: Path, signal: Signal, clock: Clock
) -> None:
    d = tmp_path / "store"
    store = durable(d, signal, clock)
    store.pull("c")
    for i in range(10):
        store.append(build_request(10, f"b{i}", signal))
    small = StoreLimits(max_data_points=35)
    again = restart(d, tmp_path / "run2", signal, clock, limits=small)
    s = again.stats()
    assert (s.held_points, s.dropped_points["max_data_points"]) == (30, 70)
    assert again.pull("c").dropped_data_points == 70
    assert rows(tmp_path / "run2", signal) == [8, 9, 10]


# -- never mixed ------------------------------------------------------------------------------


def _other(tmp_path: Path, signal: Signal, clock: Clock, **kw: Any) -> Path:
    d = tmp_path / "store"
    store = durable(d, signal, clock, journal=journal(d, signal, clock=clock, **kw))
    store.append(build_request(1, "x", signal))
    store.close()
    return d


def test_a_store_of_another_node_is_refused_untouched(
    tmp_path: Path, signal: Signal, clock: Clock
) -> None:
    d = _other(tmp_path, signal, clock, node="node-b")
    before = (d / FILE_NAMES[signal.name]).read_bytes()
    with pytest.raises(StoreRefusedError) as err:
        durable(d, signal, clock, journal=journal(d, signal, node="node-a"))
    message = str(err.value)
    assert "\n" not in message and str(d / FILE_NAMES[signal.name]) in message
    assert "'node-b'" in message and "'node-a'" in message
    assert (d / FILE_NAMES[signal.name]).read_bytes() == before


def test_a_store_of_another_format_or_signal_is_refused(
    tmp_path: Path, signal: Signal, clock: Clock
) -> None:
    d = _other(tmp_path, signal, clock)
    path = d / FILE_NAMES[signal.name]
    edit(path, f"UPDATE meta SET value = '{STORE_FORMAT + 1}' WHERE key = 'format'")
    with pytest.raises(StoreRefusedError, match=f"store format '{STORE_FORMAT + 1}'"):
        durable(d, signal, clock)
    edit(
        path,
        f"UPDATE meta SET value = '{STORE_FORMAT}' WHERE key = 'format'",
        "UPDATE meta SET value = 'traces' WHERE key = 'signal'",
    )
    with pytest.raises(StoreRefusedError, match="holds 'traces'"):
        durable(d, signal, clock)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    edit(foreign / FILE_NAMES[signal.name], "CREATE TABLE mine (x)")
    with pytest.raises(StoreRefusedError, match="not a gpumetrics store"):
        durable(foreign, signal, clock)


def test_a_path_that_is_a_file_is_a_path_error(
    tmp_path: Path, signal: Signal, clock: Clock
) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorePathError, match="is not a directory"):
        durable(tmp_path / "file", signal, clock)


def test_a_second_process_on_the_same_path_is_refused_the_file(
    tmp_path: Path, signal: Signal, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "store"
    first = durable(d, signal, clock)
    first.append(build_request(1, "x", signal))
    telemetry = Telemetry()
    with caplog.at_level(logging.WARNING, "gpumetrics.store"):
        second = durable(
            d, signal, clock, journal=journal(d, signal, lock_wait_s=0.05), telemetry=telemetry
        )
    assert second.durable_state == "failed" and first.durable_state == "ok"
    assert second.stats().held_batches == 0  # nothing of the other's file is mixed in
    assert "another process holds it" in caplog.text
    second.append(build_request(1, "mine", signal))  # the gauges are set with each append
    assert telemetry.value("gpumetrics.store.durable", {"state": "failed"}) == 1
    first.append(build_request(1, "y", signal))
    assert rows(d, signal) == [1, 2]  # the first keeps its file


# -- corrupt files ------------------------------------------------------------------------------


def _truncate(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def _garbage_header(path: Path) -> None:
    with open(path, "r+b") as f:
        f.write(b"\x5a" * 100)


def _torn_batch_page(path: Path) -> None:
    """Half of the last page of the newest batch's data overwritten (a torn write)."""
    with closing(sqlite3.connect(path)) as conn:
        pageno = conn.execute(
            "SELECT max(pageno) FROM dbstat WHERE name = 'batches' AND pagetype = 'overflow'"
        ).fetchone()[0]
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    assert pageno, "the batches are large enough to have overflow pages"
    with open(path, "r+b") as f:
        f.seek((pageno - 1) * page + page // 2)
        f.write(os.urandom(page // 2))


def _damaged_state(path: Path) -> None:
    edit(path, "UPDATE meta SET value = '{\"epoch\": 1' WHERE key = 'state'")


@pytest.mark.parametrize(
    "damage",
    [_truncate, _garbage_header, _torn_batch_page, _damaged_state],
    ids=lambda f: f.__name__,
)
def test_a_corrupt_file_is_moved_aside_and_a_fresh_store_begins(
    tmp_path: Path, signal: Signal, clock: Clock, caplog: pytest.LogCaptureFixture, damage: Any
) -> None:
    d = tmp_path / "store"
    store = durable(d, signal, clock)
    for i in range(30):
        store.append(build_request(400, f"b{i}", signal))  # several pages per batch
    old_epoch = store.epoch
    store.close()  # checkpointed: the damage is not undone by a WAL
    path = d / FILE_NAMES[signal.name]
    damage(path)
    telemetry = Telemetry()
    with caplog.at_level(logging.WARNING, "gpumetrics.store"):
        fresh = durable(d, signal, clock, telemetry=telemetry)
    moved = fresh.moved_aside
    assert moved is not None and Path(moved).exists() and not Path(moved + "-wal").exists()
    assert Path(moved).name.startswith(FILE_NAMES[signal.name] + ".corrupt-")
    stamp = Path(moved).name.rsplit(".corrupt-", 1)[1]
    assert len(stamp) == 16 and stamp.endswith("Z") and stamp[8] == "T", stamp  # UTC time
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "corrupt" in warnings[0].getMessage()
    assert moved in warnings[0].getMessage()
    assert fresh.durable_state == "ok" and fresh.epoch != old_epoch
    assert fresh.stats().held_batches == 0 and fresh.last_sequence == 0
    fresh.append(build_request(1, "new", signal))
    assert telemetry.value("gpumetrics.store.durable", {"state": "ok"}) == 1
    assert rows(d, signal) == [1]  # the fresh file is written


def test_only_the_newest_corrupt_files_are_kept(tmp_path: Path, signal: Signal) -> None:
    d = tmp_path / "store"
    d.mkdir()
    path = d / FILE_NAMES[signal.name]
    clock = Clock()
    for _ in range(4):
        path.write_bytes(b"not a database" * 100)
        clock.advance(1.0)
        durable(d, signal, clock).close()
    kept = sorted(p.name for p in d.iterdir() if ".corrupt-" in p.name)
    assert len(kept) == 2, kept


# -- faults: serve from memory, one WARNING, a new epoch, durable again later ---------------------


def test_a_full_disk_leaves_the_store_serving_from_memory_then_durable_again(
    tmp_path: Path, signal: Signal, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "store"
    telemetry = Telemetry()
    store = durable(d, signal, clock, telemetry=telemetry, limits=StoreLimits(), retry_s=30)
    store.pull("c")
    store.append(build_request(5, "b1", signal))
    r = store.pull("c")
    conn = store._durability._journal._conn  # type: ignore[union-attr]
    assert conn is not None
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages + 2}")  # SQLite's own SQLITE_FULL
    old_epoch = store.epoch
    with caplog.at_level(logging.INFO, "gpumetrics.store"):
        for i in range(2, 8):
            store.append(build_request(2000, f"b{i}", signal))
        assert store.durable_state == "failed"
        assert "disk is full" in (store._durability.reason or "")
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "serves from memory only" in warnings[0].getMessage()
        assert telemetry.value("gpumetrics.store.durable", {"state": "failed"}) == 1
        assert telemetry.value("gpumetrics.store.durable", {"state": "ok"}) == 0
        # a new epoch: the consumer's acknowledgement of the old one is ignored, and it is sent
        # everything after its cursor again (at least once, nothing skipped)
        assert store.epoch != old_epoch
        again = store.pull("c", r.last_sequence, r.epoch, read_after_sequence=r.last_sequence)
        assert again.epoch == store.epoch and again.first_sequence == 1
        assert tags(signal, signal.parse(again.data)) == [f"b{i}" for i in range(1, 8)]
        on_disk = rows(d, signal)
        assert on_disk == [1], on_disk  # the file keeps its last good state
        # room again (max_page_count is the failed connection's; the retry opens a new one):
        # the first append after retry_s writes everything held
        clock.advance(29)
        store.append(build_request(1, "b8", signal))
        assert store.durable_state == "failed"  # not yet due
        clock.advance(2)
        store.append(build_request(1, "b9", signal))
    assert store.durable_state == "ok"
    assert "can be written again" in caplog.text
    assert telemetry.value("gpumetrics.store.durable", {"state": "ok"}) == 1
    assert rows(d, signal) == list(range(1, 10))
    resumed = restart(d, tmp_path / "run2", signal, clock, limits=StoreLimits())
    assert same_state(resumed.stats(), store.stats()) and resumed.epoch == store.epoch


def test_a_read_only_filesystem_leaves_the_store_in_memory(
    tmp_path: Path, signal: Signal, clock: Clock, read_only_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    telemetry = Telemetry()
    with caplog.at_level(logging.WARNING, "gpumetrics.store"):
        store = durable(read_only_dir / "store", signal, clock, telemetry=telemetry)
    assert store.durable_state == "failed"
    assert "read-only" in (store._durability.reason or "")
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    store.append(build_request(3, "x", signal))
    assert telemetry.value("gpumetrics.store.durable", {"state": "failed"}) == 1
    assert store.pull("c").data_points == 3  # serving from memory


@pytest.mark.parametrize("below", [False, True], ids=["the directory", "a directory below it"])
def test_a_path_that_cannot_be_written_leaves_the_store_in_memory(
    signal: Signal, clock: Clock, unwritable_dir: Path, below: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    target = unwritable_dir / "store" if below else unwritable_dir
    telemetry = Telemetry()
    with caplog.at_level(logging.WARNING, "gpumetrics.store"):
        store = durable(target, signal, clock, telemetry=telemetry)
    assert store.durable_state == "failed"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot be created or written" in warnings[0], warnings
    store.append(build_request(2, "x", signal))
    assert telemetry.value("gpumetrics.store.durable", {"state": "failed"}) == 1
    assert store.pull("c").data_points == 2


def test_memory_only_reports_disabled(signal: Signal, clock: Clock) -> None:
    telemetry = Telemetry()
    store = BatchStore(LIMITS, clock=clock, signal=signal, telemetry=telemetry)
    assert store.durable_state == "disabled" and store.durable_path is None
    assert telemetry.value("gpumetrics.store.durable", {"state": "disabled"}) is None
    store.append(build_request(1, "x", signal))  # set with the store's other gauges
    assert telemetry.value("gpumetrics.store.durable", {"state": "disabled"}) == 1
    assert telemetry.value("gpumetrics.store.durable", {"state": "ok"}) == 0
