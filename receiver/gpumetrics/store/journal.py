"""The on-disk copy of one :class:`~gpumetrics.store.BatchStore`: an SQLite database in WAL mode.

Why SQLite (``docs/deployment.md``, "The durable store"): it ships with Python (``sqlite3``), it
is the most tested embedded engine there is, and its write-ahead log makes every commit atomic
and durable (a process killed in the middle of a write leaves the last committed state, torn
WAL frames are detected by their checksums and ignored: https://www.sqlite.org/wal.html,
https://www.sqlite.org/atomiccommit.html), so no file format of our own is needed.

One file per store (``<store.path>/metrics.sqlite``, ``<store.path>/logs.sqlite``):

* table ``batches(seq, points, wall_ns, crc, data)``: the batches held, each the bytes a Pull
  returns, its CRC-32 (``zlib.crc32``) and its append time (ns since the Unix epoch, so the
  ``max_age_s`` limit keeps counting across a restart);
* table ``meta(key, value)``: ``format`` (:data:`STORE_FORMAT`), ``signal``, ``node`` (the
  sidecar's node name), ``created_by`` (the gpumetrics version that created it) and ``state``
  (:class:`~gpumetrics.store.state.StoreState` as JSON: epoch, sequences, cursors, counters).

Settings (``PRAGMA``): ``locking_mode=EXCLUSIVE`` (one process at a time: a second sidecar on
the same path is refused the lock, and no ``-shm`` file is used), ``journal_mode=WAL``,
``synchronous=FULL`` (the WAL is fsynced at every commit, so a committed batch survives a power
loss), ``cache_size`` = 1 MiB (the page cache; :data:`CACHE_BYTES`), ``wal_autocheckpoint`` =
256 pages and ``journal_size_limit`` = 1 MiB (the WAL is copied into the file every 1 MiB and
truncated to 1 MiB after that), ``secure_delete=FAST``.

Every change is one transaction: the batches appended, the batches released or dropped since
(always the oldest: one ``DELETE ... WHERE seq < first held``) and the new state document. A
file is checked when it is opened: SQLite's ``quick_check``, every batch's CRC and that the
sequences are contiguous and end at the state's last sequence.
"""

from __future__ import annotations

import errno
import glob
import os
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from gpumetrics.store.records import Batch

__all__ = [
    "CACHE_BYTES",
    "FILE_NAMES",
    "STORE_FORMAT",
    "JournalError",
    "Loaded",
    "SqliteJournal",
    "StorePathError",
    "StoreRefusedError",
]

STORE_FORMAT = 1
"""The layout this code reads and writes (``meta.format``); another is refused, never mixed."""

CACHE_BYTES = 1024 * 1024
"""SQLite's page cache per file (``PRAGMA cache_size``), counted in ``docs/deployment.md``."""

WAL_CHECKPOINT_PAGES = 256
"""``PRAGMA wal_autocheckpoint``: the WAL is copied into the file once it holds this many pages
(1 MiB of 4 KiB pages), so it stays at about that plus the last transaction."""

WAL_LIMIT_BYTES = 1024 * 1024
"""``PRAGMA journal_size_limit``: what the WAL is truncated to after each checkpoint."""

FILE_NAMES = {"metrics": "metrics.sqlite", "logs": "logs.sqlite"}
"""The file of each store in the ``store.path`` directory, by signal name."""

LOCK_WAIT_S = 2.0
"""How long opening waits for another process to let go of the file (a sidecar still exiting)."""

KEEP_CORRUPT = 2
"""Corrupt files moved aside that are kept (the newest); older ones are deleted (disk bound)."""

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE batches (seq INTEGER PRIMARY KEY, points INTEGER NOT NULL, "
    "wall_ns INTEGER NOT NULL, crc INTEGER NOT NULL, data BLOB NOT NULL)",
)


class StoreRefusedError(Exception):
    """The file belongs to another node, another signal or another store format.

    Its message is one line naming the file and saying what to do; the runtime reports it as a
    configuration error of ``store.path``. The file is left as it is.
    """


class StorePathError(ValueError):
    """``store.path`` (or the file in it) exists and is not a directory (a regular file)."""


class JournalError(Exception):
    """The file cannot be used now; the store serves from memory (see ``kind``).

    Attributes:
        kind: ``corrupt`` (moved aside and started afresh), ``full`` (disk full),
            ``read_only`` (read-only filesystem or file), ``unwritable`` (no permission, cannot
            be created), ``locked`` (another process holds it), ``io`` (any other I/O error).
        path: the file.
        detail: what SQLite or the OS said.

    """

    def __init__(self, kind: str, path: str, detail: str) -> None:
        self.kind, self.path, self.detail = kind, path, detail
        super().__init__(f"{path}: {detail}")


@dataclass(frozen=True)
class Loaded:
    """What an existing, verified file holds.

    Attributes:
        state: the ``meta.state`` document (:class:`~gpumetrics.store.state.StoreState` JSON).
        rows: yields ``(seq, data, points, age_s)`` of every batch, oldest first, reading one
            at a time (the file is not loaded into memory at once); ``age_s`` is the seconds
            since it was written, by the wall clock (0 if the clock went back).

    """

    state: str
    rows: Callable[[], Iterator[tuple[int, bytes, int, float]]]


class SqliteJournal:
    """One store's database file (see the module docstring).

    Args:
        path: the database file (its directory is created, mode 0700, if missing).
        signal: ``metrics`` or ``logs``, recorded and checked.
        node: the sidecar's node name, recorded and checked: a file of another node is refused.
        written_by: the gpumetrics version, recorded in a new file.
        clock_ns: wall clock, ns since the Unix epoch (batch times, names of moved files).
        lock_wait_s: how long opening waits for another process holding the file (s).

    Not thread-safe: its store calls it under the store's lock.

    """

    def __init__(
        self,
        path: str,
        *,
        signal: str,
        node: str,
        written_by: str,
        clock_ns: Callable[[], int] = time.time_ns,
        lock_wait_s: float = LOCK_WAIT_S,
    ) -> None:
        self.path = path
        self._lock_wait_s = lock_wait_s
        self.signal, self.node, self.written_by = signal, node, written_by
        self._clock_ns = clock_ns
        self._conn: sqlite3.Connection | None = None
        self._disk_first = 0  # the oldest sequence the file may still hold

    @classmethod
    def in_directory(
        cls, directory: str, *, signal: str, node: str, written_by: str
    ) -> SqliteJournal:
        """Return the journal of a store: its :data:`FILE_NAMES` file in ``directory``."""
        return cls(
            os.path.join(directory, FILE_NAMES[signal]),
            signal=signal,
            node=node,
            written_by=written_by,
        )

    # -- opening -------------------------------------------------------------------------------

    def open(self) -> Loaded | None:
        """Open (or create) the file and verify it; return what it holds (None: a new file).

        Raises:
            StorePathError: the directory or the file exists as something else.
            StoreRefusedError: the file is another node's, signal's or format's.
            JournalError: the file cannot be used (``kind`` says why; ``corrupt``: see
                :meth:`move_aside`).

        """
        self.close()
        conn = self._connect()
        try:
            if self._create_if_new(conn):
                self._conn = conn
                return None
            state = self._check(conn)
        except (sqlite3.Error, JournalError, StoreRefusedError) as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise _journal_error(self.path, exc) from None
            raise
        self._conn = conn
        return Loaded(state, self._rows)

    def _connect(self) -> sqlite3.Connection:
        """Open a connection that holds the file's exclusive lock, with the pragmas set."""
        directory = os.path.dirname(self.path) or "."
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StorePathError(f"{directory} exists and is not a directory") from None
        except OSError as exc:
            raise JournalError(_os_kind(exc), self.path, _os_detail(exc)) from None
        if not os.path.isdir(directory):
            raise StorePathError(f"{directory} exists and is not a directory")
        if os.path.lexists(self.path) and not os.path.isfile(self.path):
            raise StorePathError(f"{self.path} exists and is not a regular file")
        try:  # owner-only: resources may carry environment values (SQLite gives its WAL the same)
            os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            pass
        except OSError as exc:
            raise JournalError(_os_kind(exc), self.path, _os_detail(exc)) from None
        conn = None
        try:
            conn = sqlite3.connect(
                self.path, timeout=self._lock_wait_s, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise JournalError("read_only", self.path, f"no WAL possible (journal mode {mode})")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA cache_size=-{CACHE_BYTES // 1024}")
            conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
            conn.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
            conn.execute("PRAGMA secure_delete=FAST")
            conn.execute("BEGIN IMMEDIATE")  # takes the exclusive lock and keeps it
            conn.execute("COMMIT")
        except (sqlite3.Error, JournalError) as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, JournalError):
                raise
            raise _journal_error(self.path, exc) from None
        return conn

    def _create_if_new(self, conn: sqlite3.Connection) -> bool:
        """Create the tables in a file that has none; False when it already has tables."""
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables:
            return False
        meta = {
            "format": str(STORE_FORMAT),
            "signal": self.signal,
            "node": self.node,
            "created_by": self.written_by,
            "state": "",
        }
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
            conn.execute("COMMIT")
        except sqlite3.Error:
            _rollback(conn)
            raise
        self._disk_first = 0
        return True

    def _check(self, conn: sqlite3.Connection) -> str:
        """Verify an existing file; return its state document."""
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"meta", "batches"} <= tables:
            raise StoreRefusedError(
                f"{self.path} is an SQLite database but not a gpumetrics store (tables: "
                f"{', '.join(sorted(tables))}); point store.path at a directory of its own"
            )
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        made = meta.get("created_by", "an unknown version")
        if meta.get("format") != str(STORE_FORMAT):
            raise StoreRefusedError(
                f"{self.path} is in store format {meta.get('format')!r} (written by gpumetrics "
                f"{made}); this gpumetrics ({self.written_by}) reads format {STORE_FORMAT} only: "
                "move the file away or point store.path elsewhere"
            )
        if meta.get("signal") != self.signal:
            raise StoreRefusedError(
                f"{self.path} holds {meta.get('signal')!r}, not {self.signal}: a store is never "
                "mixed; move the file away"
            )
        if meta.get("node") != self.node:
            raise StoreRefusedError(
                f"{self.path} was written on node {meta.get('node')!r}, and this sidecar is node "
                f"{self.node!r} (identity.node_name): a store is never mixed; point store.path at "
                "this node's own directory, or move the file away"
            )
        state = meta.get("state", "")
        problems = [r[0] for r in conn.execute("PRAGMA quick_check(5)")]
        if problems != ["ok"]:
            raise JournalError("corrupt", self.path, "quick_check: " + "; ".join(problems))
        self._verify_batches(conn, state)
        return state

    def _verify_batches(self, conn: sqlite3.Connection, state: str) -> None:
        """Every batch's CRC, and contiguous sequences; raise JournalError("corrupt")."""
        previous = None
        first = 0
        for seq, points, crc, data in conn.execute(
            "SELECT seq, points, crc, data FROM batches ORDER BY seq"
        ):
            if not isinstance(data, bytes) or zlib.crc32(data) != crc or points < 0:
                raise JournalError("corrupt", self.path, f"batch {seq} fails its CRC-32 check")
            if previous is not None and seq != previous + 1:
                raise JournalError("corrupt", self.path, f"batch {previous + 1} is missing")
            first = first or seq
            previous = seq
        if previous is not None and not state:
            raise JournalError("corrupt", self.path, "batches without a state")
        self._disk_first = first

    def _rows(self) -> Iterator[tuple[int, bytes, int, float]]:
        conn = self._conn
        if conn is None:
            return
        now = self._clock_ns()
        try:
            for seq, data, points, wall_ns in conn.execute(
                "SELECT seq, data, points, wall_ns FROM batches ORDER BY seq"
            ):
                yield seq, data, points, max(0.0, (now - wall_ns) / 1e9)
        except sqlite3.Error as exc:
            raise _journal_error(self.path, exc) from None

    # -- writing -------------------------------------------------------------------------------

    def write(self, added: Sequence[Batch], first_held: int, state: str, now: float) -> None:
        """Commit one change: batches ``added``, those before ``first_held`` removed, ``state``.

        Args:
            added: batches appended since the last write (those before ``first_held``, dropped
                at once by a limit, are not written).
            first_held: the oldest sequence still held (the next sequence when none is).
            state: the store's state document.
            now: the store's monotonic clock now (s): a batch's ``t`` becomes its wall time.

        Raises:
            JournalError: nothing of this change was committed (``kind`` says why).

        """
        conn = self._conn
        if conn is None:
            raise JournalError("io", self.path, "the file is closed")
        rows = self._rows_of(added, now)
        try:
            conn.execute("BEGIN IMMEDIATE")
            if first_held > self._disk_first:
                conn.execute("DELETE FROM batches WHERE seq < ?", (first_held,))
            kept = [r for r in rows if r[0] >= first_held]
            conn.executemany("INSERT INTO batches VALUES (?, ?, ?, ?, ?)", kept)
            conn.execute("UPDATE meta SET value = ? WHERE key = 'state'", (state,))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback(conn)
            raise _journal_error(self.path, exc) from None
        self._disk_first = max(self._disk_first, first_held)

    def rewrite(self, batches: Sequence[Batch], state: str, now: float) -> None:
        """Replace the file's whole content with ``batches`` and ``state`` (one transaction).

        For a store that served from memory after a fault: it reopens the file (creating it if
        it was removed), so a connection broken by the fault is not reused. ``now`` is as for
        :meth:`write`: the batches keep their age.

        Raises:
            JournalError: the file still cannot be written (nothing changed in it).
            StoreRefusedError: the file was replaced by another node's, signal's or format's.

        """
        self.close()
        conn = self._connect()
        try:
            if not self._create_if_new(conn):
                meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
                if (meta.get("format"), meta.get("signal"), meta.get("node")) != (
                    str(STORE_FORMAT),
                    self.signal,
                    self.node,
                ):
                    raise StoreRefusedError(f"{self.path} was replaced by another store")
            rows = self._rows_of(batches, now)
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DELETE FROM batches")
            conn.executemany("INSERT INTO batches VALUES (?, ?, ?, ?, ?)", rows)
            conn.execute("UPDATE meta SET value = ? WHERE key = 'state'", (state,))
            conn.execute("COMMIT")
        except (sqlite3.Error, StoreRefusedError) as exc:
            _rollback(conn)
            conn.close()
            if isinstance(exc, StoreRefusedError):
                raise
            raise _journal_error(self.path, exc) from None
        self._conn = conn
        self._disk_first = batches[0].seq if batches else 0

    def _rows_of(
        self, batches: Sequence[Batch], now: float
    ) -> list[tuple[int, int, int, int, bytes]]:
        wall = self._clock_ns()
        return [
            (b.seq, b.points, wall - round((now - b.t) * 1e9), zlib.crc32(b.data), b.data)
            for b in batches
        ]

    # -- corrupt files and closing -------------------------------------------------------------

    def move_aside(self) -> str:
        """Rename the file (and its WAL) to ``<file>.corrupt-<UTC time>``; return the new name.

        Only the :data:`KEEP_CORRUPT` newest moved files are kept; older ones are deleted.

        Raises:
            JournalError: the file could not be renamed (``kind`` says why).

        """
        self.close()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock_ns() / 1e9))
        target = f"{self.path}.corrupt-{stamp}"
        n = 1
        while os.path.lexists(target):
            n += 1
            target = f"{self.path}.corrupt-{stamp}-{n}"
        try:
            os.rename(self.path, target)
            for suffix in ("-wal", "-journal", "-shm"):
                if os.path.lexists(self.path + suffix):
                    os.rename(self.path + suffix, target + suffix)
        except OSError as exc:
            raise JournalError(_os_kind(exc), self.path, _os_detail(exc)) from None
        moved = sorted(
            p for p in glob.glob(glob.escape(self.path) + ".corrupt-*") if not p.endswith("-wal")
        )
        for old in moved[:-KEEP_CORRUPT]:
            for name in (old, old + "-wal"):
                try:
                    os.remove(name)
                except OSError:
                    pass
        return target

    def close(self) -> None:
        """Close the file (SQLite checkpoints the WAL into it and removes the WAL)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error:
                pass


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def _journal_error(path: str, exc: sqlite3.Error) -> JournalError:
    name = getattr(exc, "sqlite_errorname", "") or ""
    kinds = (
        (("SQLITE_CORRUPT", "SQLITE_NOTADB"), "corrupt"),
        (("SQLITE_FULL",), "full"),
        (("SQLITE_READONLY",), "read_only"),
        (("SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH"), "unwritable"),
        (("SQLITE_BUSY", "SQLITE_LOCKED"), "locked"),
    )
    kind = next((k for prefixes, k in kinds if name.startswith(prefixes)), "io")
    return JournalError(kind, path, f"{exc} ({name})" if name else str(exc))


def _os_kind(exc: OSError) -> str:
    return {
        errno.EROFS: "read_only",
        errno.EACCES: "unwritable",
        errno.EPERM: "unwritable",
        errno.ENOSPC: "full",
        errno.EDQUOT: "full",
    }.get(exc.errno or 0, "io")


def _os_detail(exc: OSError) -> str:
    return f"{exc.strerror or exc} ({errno.errorcode.get(exc.errno or 0, exc.errno)})"
