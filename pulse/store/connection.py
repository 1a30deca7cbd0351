"""Opening Pulse's SQLite stores: the busy timeout, migrations, and a store that cannot be used
said in one line naming the file and what to do.

synchronous levels, and why:
- events.db, NORMAL by default: in WAL mode a commit survives a crash of any
  process; only power loss can drop the last commits. The executor opens it
  FULL: the claim of a non-idempotent effect must survive power loss, or the
  effect could run twice.
- vitals.db, NORMAL: samples are replaced every few seconds; losing the last
  ones to power loss costs nothing.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from _thread import RLock  # threading's own (C) RLock; threading's import is ~1 ms of every pulsectl command
from pathlib import Path
from typing import Iterator, Sequence

# How long a statement waits for another process's write lock. A worker waiting on it does not
# heartbeat, so config requires hung_after_ms to exceed it (timings.sqlite_busy_timeout_ms; the
# harness sets it in each worker); a lock held by a frozen process stalls a writer this long at most.
BUSY_TIMEOUT_MS = 5_000


def busy_timeout_s() -> float:
    return BUSY_TIMEOUT_MS / 1000


class StoreError(sqlite3.DatabaseError):
    """A store that cannot be used as it is; the message names the file and what to do."""


SQLITE_MAGIC = b"SQLite format 3\x00"


def unusable(err: sqlite3.DatabaseError) -> str | None:
    """What a store error says when no retry can help (damaged, not a database, read-only), in one
    line; None for the errors that pass (locked, busy, a full disk)."""
    if isinstance(err, StoreError):
        return str(err)
    if type(err) is sqlite3.DatabaseError:          # SQLITE_CORRUPT, SQLITE_NOTADB
        return f"a store is damaged ({err}); `pulsectl store check` names it. Restore it from a backup"
    if isinstance(err, sqlite3.OperationalError) and "readonly" in str(err):
        return f"a store is read-only ({err}); pulsed must be able to write its home"
    return None


# Closing any descriptor of a file drops every fcntl lock the process holds on it (POSIX ties them to
# the process and the file, not to the descriptor), SQLite's own included. In WAL mode each open
# connection holds a shared lock on the database; a connection closing in another process that finds
# none takes itself for the last one, checkpoints, and deletes the -wal and -shm under the connections
# still open here. What they commit next (an executor's claim of a non-idempotent effect, synced or not)
# goes to a deleted file: no other process sees it, another executor claims the effect again, and a
# power cut takes the claim. So the header is read through a descriptor this process already has open
# on the file; one of its own is opened (and closed) only while there is none, under this lock, which
# connect() and open_readonly() also hold while SQLite opens the file.
_HEADER_LOCK = RLock()


def _open_here(st: os.stat_result) -> list[int]:
    """The descriptors this process has open on the file `st` describes (SQLite's, say)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    found = []
    for name in names:
        try:
            fd_st = os.stat(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if (fd_st.st_dev, fd_st.st_ino) == (st.st_dev, st.st_ino):
            found.append(int(name))
    return found


def _read_header(path: Path) -> bytes:
    with _HEADER_LOCK:
        st = os.stat(path)
        for fd in _open_here(st):
            try:
                header = os.pread(fd, len(SQLITE_MAGIC), 0)
                fd_st = os.fstat(fd)
            except OSError:
                continue                        # closed meanwhile, or opened write-only
            if (fd_st.st_dev, fd_st.st_ino) == (st.st_dev, st.st_ino):
                return header
        with open(path, "rb") as f:
            return f.read(len(SQLITE_MAGIC))


def header_problem(path: Path) -> str | None:
    """What its first bytes already say is wrong with the database at `path` (cheap: every open
    asks); None if it looks like SQLite or is not made yet."""
    try:
        header = _read_header(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot be read ({err.strerror}); give the user pulsed runs as access to it"
    if not header:
        return ("is an empty file: its history is gone. Restore it from a backup (see `pulsectl store "
                "backup`), or move it away to start a new history")
    if header != SQLITE_MAGIC:
        return "is not an SQLite database (its header is damaged). Restore it from a backup, or move it away"
    return None


# quick_check reads every page: 8 s on a 1 GiB events.db, at every start of pulsed. Past this size a
# start checks what is cheap and still catches what a crash, a full disk or a bad copy leaves (a
# damaged header or schema, a file cut short: its last pages unreadable); `pulsectl store check`
# still checks every page.
FULL_CHECK_MAX_BYTES = 64 * 1024 * 1024


def ends_readable(conn: sqlite3.Connection) -> list[str]:
    """["ok"] if every table's first and last rows read (the b-trees' edges down to their leaves),
    else what failed; a damaged page on the way raises sqlite3.DatabaseError."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                         "AND name NOT LIKE 'sqlite_%'")]
    for table in tables:
        for order in ("ASC", "DESC"):
            conn.execute(f'SELECT * FROM "{table}" ORDER BY rowid {order} LIMIT 1').fetchall()
    return ["ok"]


def store_problem(path: Path, latest: int | None = None) -> str | None:
    """What makes the database at `path` unusable, said so an operator can act on it; None if it
    is fine or not made yet. Reads only: a damaged file is never written, truncated or replaced."""
    if not path.exists():
        return None                              # not made yet: ensure_home makes it
    if problem := header_problem(path):
        return problem
    if not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
        return "is read-only (file or file system); pulsed must be able to write it and its directory"
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=busy_timeout_s())
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if path.stat().st_size <= FULL_CHECK_MAX_BYTES:
                found = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
            else:
                found = ends_readable(conn)
        finally:
            conn.close()
    except sqlite3.DatabaseError as err:
        return f"is damaged ({err}). Restore it from a backup, or move it away"
    if found != ["ok"]:
        return f"is damaged ({'; '.join(found)}). Restore it from a backup, or move it away"
    if latest is not None and version > latest:
        return f"has schema {version}, and this Pulse knows up to {latest}: a newer Pulse wrote it"
    return None


def connect(path: Path, synchronous: str) -> sqlite3.Connection:
    with _HEADER_LOCK:     # until SQLite holds a descriptor of its own on the file (see _HEADER_LOCK)
        if path.exists() and (problem := header_problem(path)):
            raise StoreError(f"{path} {problem}")
        conn = sqlite3.connect(path, timeout=busy_timeout_s(), isolation_level=None,
                               check_same_thread=True)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s() * 1000)}")
        # WAL is persistent: only a new file needs the switch, and pulse.store.provision.ensure_home makes every
        # store before the workers start. The switch takes a lock that SQLite refuses without waiting.
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
    except sqlite3.OperationalError:
        conn.close()
        raise                                   # locked, or busy: the caller may retry
    except sqlite3.DatabaseError as err:        # not a database, or damaged: no retry helps
        conn.close()
        raise StoreError(f"{path} {store_problem(path) or err}") from None
    return conn


def migrate(conn: sqlite3.Connection, path: Path, migrations: dict[int, Sequence[str]], latest: int) -> None:
    if conn.execute("PRAGMA user_version").fetchone()[0] == latest:
        return   # current: no write transaction, so a store opens even on a full disk
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if latest is not None and version > latest:
            raise StoreError(f"{path} has schema {version}; this Pulse knows up to {latest}")
        for step in range(version + 1, latest + 1):
            for statement in migrations[step]:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {latest}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def open_readonly(path: Path) -> sqlite3.Connection:
    """For pulsectl: never writes, never migrates, never creates."""
    if not path.exists():
        raise StoreError(f"{path} does not exist (has pulsed run on this home?)")
    with _HEADER_LOCK:     # as in connect()
        if problem := header_problem(path):
            raise StoreError(f"{path} {problem}")
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=busy_timeout_s())
        except sqlite3.DatabaseError as err:
            raise StoreError(f"{path} {store_problem(path) or err}") from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s() * 1000)}")
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")   # a damaged header shows here, not later
    except sqlite3.DatabaseError as err:
        raise StoreError(f"{path} {store_problem(path) or err}") from None
    return conn


@contextlib.contextmanager
def read_snapshot(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """`with read_snapshot(conn):` the reads inside see one state of the store (one read
    transaction), so what two of them read adds up (the error events, and what error_runs still counts)."""
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


class Transaction:
    """`with Transaction(conn):` BEGIN IMMEDIATE … COMMIT, ROLLBACK on any error."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.conn.execute("COMMIT")
        elif self.conn.in_transaction:   # SQLite may have rolled back itself (a full disk does)
            self.conn.execute("ROLLBACK")


class DurableTransaction(Transaction):
    """A Transaction whose commit is synced before it returns, whatever the connection's synchronous
    level: for a commit that must be on disk before the caller acts on what it records (a file
    unlinked once its row says so)."""

    def __enter__(self) -> sqlite3.Connection:
        self.level = self.conn.execute("PRAGMA synchronous").fetchone()[0]
        self.conn.execute("PRAGMA synchronous = FULL")
        return super().__enter__()

    def __exit__(self, kind, value, tb) -> None:
        try:
            super().__exit__(kind, value, tb)
        finally:
            self.conn.execute(f"PRAGMA synchronous = {int(self.level)}")


def transaction(conn: sqlite3.Connection) -> Transaction:
    """`with transaction(conn):` one BEGIN IMMEDIATE for a caller that reads, decides and writes."""
    return Transaction(conn)
