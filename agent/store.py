"""The agent's durable memory of its tasks (SQLite through aiosqlite).

Why it exists: assignments are redelivered (JetStream at-least-once) and
agents restart. Before a task starts, the agent records it here with
``insert_if_new``, keyed by (task_id, attempt): a redelivered assignment finds
its row and is not started again, and a restarted agent reads ``active()`` to
re-adopt still-running processes (pid + start time) and to re-send the events
the coordinator has not acknowledged (``reported`` lags ``state``).

The ``runs`` table is the node's reliability ledger (agent/ledger.py): one row per
process started, written at its start and closed at its end, never pruned with the
tasks. It has no unique key on purpose: a run started twice shows as two rows.

Every write is its own transaction in WAL mode with synchronous=FULL, so a
call that returned is on disk. Errors are not swallowed: a full disk
surfaces as ``sqlite3.OperationalError("database or disk is full")`` from the
call that needed the space, and a locked database as "database is locked";
neither is mistaken for corruption. Only a file SQLite reports as corrupt
(SQLITE_CORRUPT, SQLITE_NOTADB, or a failing ``PRAGMA quick_check``) is moved
aside to ``<path>.corrupt-<unix_ts>`` and replaced by a fresh store, with
``recovered_from`` saying where it went so the agent can report the loss.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import aiosqlite

from agent.ledger import Run

__all__ = ["TERMINAL_STATES", "LedgerError", "TaskRecord", "TaskStore", "read_ledger"]

TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "KILLED"})

_COLUMNS = (
    "task_id",
    "attempt",
    "job_id",
    "state",
    "assignment",
    "pid",
    "start_time",
    "exit_code",
    "reported",
    "updated",
)
_UPDATABLE = frozenset(_COLUMNS) - {"task_id", "attempt"}
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM tasks"
_TERMINAL_SQL = ", ".join(f"'{s}'" for s in sorted(TERMINAL_STATES))

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id    TEXT    NOT NULL,
    attempt    INTEGER NOT NULL,
    job_id     TEXT    NOT NULL,
    state      TEXT    NOT NULL,
    assignment BLOB    NOT NULL,
    pid        INTEGER,
    start_time REAL,
    exit_code  INTEGER,
    reported   TEXT,
    updated    REAL    NOT NULL,
    PRIMARY KEY (task_id, attempt)
);
CREATE INDEX IF NOT EXISTS tasks_updated ON tasks (updated);
CREATE TABLE IF NOT EXISTS runs (
    task_id    TEXT    NOT NULL,
    attempt    INTEGER NOT NULL,
    run        INTEGER NOT NULL,
    node_id    TEXT    NOT NULL,
    start      REAL    NOT NULL,
    end        REAL,
    outcome    TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS runs_task ON runs (task_id, attempt, run);
PRAGMA user_version = 1;
"""

# Primary result codes that mean "this file is damaged", not "try again later".
_CORRUPT_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


@dataclass(slots=True)
class TaskRecord:
    """One attempt of one task as this agent knows it."""

    task_id: str
    attempt: int
    job_id: str
    state: str  # agent-side state: "ACCEPTED", "STARTING", "RUNNING", "SUCCEEDED", ...
    assignment: bytes  # the opaque encoded assignment message, kept to re-run/inspect
    pid: int | None = None
    start_time: float | None = None
    exit_code: int | None = None
    reported: str | None = None  # last state whose event the coordinator's stream acknowledged
    updated: float = 0.0


class _Corrupt(Exception):
    pass


def _is_corruption(exc: sqlite3.DatabaseError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _CORRUPT_CODES
    message = str(exc)
    return "malformed" in message or "not a database" in message


def _move_aside(path: Path) -> Path:
    """Rename a corrupt database and its WAL/SHM/journal sidecars out of the way."""
    base = f"{path}.corrupt-{int(time.time())}"
    target = Path(base)
    n = 0
    while target.exists():
        n += 1
        target = Path(f"{base}.{n}")
    os.replace(path, target)
    for suffix in ("-wal", "-shm", "-journal"):
        sidecar = Path(f"{path}{suffix}")
        if sidecar.exists():
            os.replace(sidecar, Path(f"{target}{suffix}"))
    return target


class TaskStore:
    """(task_id, attempt) -> TaskRecord, durable before the call returns."""

    busy_timeout_s = 5.0  # how long a call waits for another connection's lock

    def __init__(self, conn: aiosqlite.Connection, path: Path, recovered_from: str | None):
        self._conn = conn
        self.path = path
        self.recovered_from = recovered_from

    @classmethod
    async def open(cls, path: str | os.PathLike[str]) -> TaskStore:
        """Open (or create) the store; a corrupt file is moved aside and replaced."""
        db = Path(path)
        db.parent.mkdir(parents=True, exist_ok=True)
        _private(db)
        recovered_from: str | None = None
        try:
            conn = await cls._connect(db)
        except _Corrupt:
            recovered_from = str(_move_aside(db))
            _private(db)
            conn = await cls._connect(db)
        return cls(conn, db, recovered_from)

    @classmethod
    async def _connect(cls, db: Path) -> aiosqlite.Connection:
        # autocommit: every statement is its own durable transaction
        conn = await aiosqlite.connect(db, isolation_level=None, timeout=cls.busy_timeout_s)
        try:
            try:
                rows = await conn.execute_fetchall("PRAGMA quick_check")
                if [tuple(r) for r in rows] != [("ok",)]:
                    raise _Corrupt(str([tuple(r) for r in rows][:5]))
                await conn.execute("PRAGMA journal_mode = WAL")
                await conn.execute("PRAGMA synchronous = FULL")
                await conn.executescript(_SCHEMA)
            except sqlite3.DatabaseError as exc:
                if isinstance(exc, sqlite3.OperationalError) or not _is_corruption(exc):
                    raise
                raise _Corrupt(str(exc)) from exc
        except BaseException:
            await conn.close()
            raise
        return conn

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def insert_if_new(self, rec: TaskRecord) -> bool:
        """Record a new attempt; False if (task_id, attempt) exists (a redelivery)."""
        values = {c: getattr(rec, c) for c in _COLUMNS}
        values["updated"] = rec.updated or time.time()
        cursor = await self._conn.execute(
            f"INSERT INTO tasks ({', '.join(_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(_COLUMNS))}) "
            "ON CONFLICT (task_id, attempt) DO NOTHING",
            tuple(values[c] for c in _COLUMNS),
        )
        inserted = cursor.rowcount == 1
        await cursor.close()
        return inserted

    async def update(self, task_id: str, attempt: int, **fields: Any) -> None:
        """Set some columns (``updated`` defaults to now).

        ValueError for an unknown or key column; KeyError if there is no such record.
        """
        unknown = set(fields) - _UPDATABLE
        if unknown:
            raise ValueError(f"cannot update {sorted(unknown)}; updatable: {sorted(_UPDATABLE)}")
        fields.setdefault("updated", time.time())
        names = sorted(fields)
        cursor = await self._conn.execute(
            f"UPDATE tasks SET {', '.join(f'{n} = ?' for n in names)} "
            "WHERE task_id = ? AND attempt = ?",
            (*(fields[n] for n in names), task_id, attempt),
        )
        changed = cursor.rowcount
        await cursor.close()
        if changed == 0:
            raise KeyError((task_id, attempt))

    async def get(self, task_id: str, attempt: int) -> TaskRecord | None:
        rows = await self._conn.execute_fetchall(
            f"{_SELECT} WHERE task_id = ? AND attempt = ?", (task_id, attempt)
        )
        return _record(rows[0]) if rows else None

    async def latest(self, task_id: str) -> TaskRecord | None:
        """The highest attempt of a task."""
        rows = await self._conn.execute_fetchall(
            f"{_SELECT} WHERE task_id = ? ORDER BY attempt DESC LIMIT 1", (task_id,)
        )
        return _record(rows[0]) if rows else None

    async def active(self) -> list[TaskRecord]:
        """Records still running or still owing the coordinator a report."""
        rows = await self._conn.execute_fetchall(
            f"{_SELECT} WHERE state NOT IN ({_TERMINAL_SQL}) OR reported IS NOT state "
            "ORDER BY task_id, attempt"
        )
        return [_record(r) for r in rows]

    async def prune(self, older_than: float) -> int:
        """Delete finished and reported records last updated before ``older_than``."""
        cursor = await self._conn.execute(
            f"DELETE FROM tasks WHERE state IN ({_TERMINAL_SQL}) AND reported = state "
            "AND updated < ?",
            (older_than,),
        )
        deleted = cursor.rowcount
        await cursor.close()
        return deleted

    # ------------------------------------------------------------ the ledger

    async def run_started(self, run: Run) -> None:
        """Record a run as it starts (its `end` and `outcome` are written by run_ended)."""
        await self._conn.execute(
            "INSERT INTO runs (task_id, attempt, run, node_id, start, end, outcome) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (run.task_id, run.attempt, run.run, run.node_id, run.start, run.end, run.outcome),
        )

    async def run_ended(
        self, task_id: str, attempt: int, run: int, end: float, outcome: str
    ) -> bool:
        """Close the open row of that run; False when none is open."""
        cursor = await self._conn.execute(
            "UPDATE runs SET end = ?, outcome = ? WHERE task_id = ? AND attempt = ? "
            "AND run = ? AND end IS NULL",
            (end, outcome, task_id, attempt, run),
        )
        changed = cursor.rowcount
        await cursor.close()
        return changed > 0

    async def runs(self, task_id: str | None = None) -> list[Run]:
        """The ledger (of one task, or all), in the order the runs started."""
        sql = "SELECT task_id, attempt, run, node_id, start, end, outcome FROM runs"
        args: tuple = ()
        if task_id is not None:
            sql, args = sql + " WHERE task_id = ?", (task_id,)
        rows = await self._conn.execute_fetchall(sql + " ORDER BY start, rowid", args)
        return [Run(*tuple(r)) for r in rows]

    async def last_run(self, task_id: str, attempt: int) -> Run | None:
        """The latest run of an attempt (the one a re-adopted process continues)."""
        rows = await self._conn.execute_fetchall(
            "SELECT task_id, attempt, run, node_id, start, end, outcome FROM runs "
            "WHERE task_id = ? AND attempt = ? ORDER BY run DESC, rowid DESC LIMIT 1",
            (task_id, attempt),
        )
        return Run(*tuple(rows[0])) if rows else None


class LedgerError(Exception):
    """The ledger cannot be read (no store there, or not a store)."""


def read_ledger(path: str | os.PathLike[str]) -> list[Run]:
    """A node's ledger read from its store file, read-only (beside a running agent, and
    without creating, migrating or moving aside anything, unlike `TaskStore.open`)."""
    db = Path(path)
    if not db.is_file():
        raise LedgerError(f"no agent store at {db}")
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=TaskStore.busy_timeout_s)
        try:
            rows = conn.execute(
                "SELECT task_id, attempt, run, node_id, start, end, outcome FROM runs "
                "ORDER BY start, rowid"
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise LedgerError(f"{db}: cannot read its ledger ({exc})") from exc
    return [Run(*r) for r in rows]


def _record(row: Any) -> TaskRecord:
    return TaskRecord(**dict(zip(_COLUMNS, tuple(row), strict=True)))


def _private(db: Path) -> None:
    """The store holds assignments, env secrets included: readable by the agent's user
    only, whatever the umask (SQLite gives its -wal and -shm files the same mode)."""
    os.close(os.open(db, os.O_CREAT | os.O_RDWR, 0o600))
    os.chmod(db, 0o600)
