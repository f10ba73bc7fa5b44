"""TaskStore: idempotency, persistence, and recovery from a corrupt file (real SQLite)."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from agent.store import TaskRecord, TaskStore


def rec(task_id: str = "t1", attempt: int = 1, **kw) -> TaskRecord:
    kw.setdefault("assignment", b"\x00a")
    return TaskRecord(task_id=task_id, attempt=attempt, job_id="j1", state="ACCEPTED", **kw)


@pytest.fixture
async def store(tmp_path):
    s = await TaskStore.open(tmp_path / "sub" / "agent.db")
    yield s
    await s.close()


async def test_open_creates_dirs_and_wal(tmp_path):
    path = tmp_path / "a" / "b" / "agent.db"
    async with await TaskStore.open(path) as s:
        assert s.recovered_from is None
    assert path.exists()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


async def test_store_files_are_private_whatever_the_umask(tmp_path):
    path = tmp_path / "agent.db"
    path.write_bytes(b"")
    path.chmod(0o644)  # an older agent's file, made under a lax umask
    old = os.umask(0o022)
    try:
        async with await TaskStore.open(path) as s:
            await s.insert_if_new(rec())
            modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.glob("agent.db*")}
    finally:
        os.umask(old)
    assert modes and set(modes.values()) == {0o600}, modes


async def test_insert_if_new_is_idempotent(store):
    assert await store.insert_if_new(rec()) is True
    assert await store.insert_if_new(rec()) is False
    assert await store.insert_if_new(rec(attempt=2)) is True
    got = await store.get("t1", 1)
    assert got is not None and got.assignment == b"\x00a" and got.state == "ACCEPTED"
    assert got.updated > 0


async def test_update_get_latest(store):
    await store.insert_if_new(rec(attempt=1))
    await store.insert_if_new(rec(attempt=3))
    await store.insert_if_new(rec(attempt=2))
    await store.update("t1", 3, state="RUNNING", pid=1234, start_time=1.5)
    got = await store.get("t1", 3)
    assert (got.state, got.pid, got.start_time, got.exit_code) == ("RUNNING", 1234, 1.5, None)
    assert (await store.latest("t1")).attempt == 3
    assert await store.latest("nope") is None
    assert await store.get("t1", 9) is None
    with pytest.raises(ValueError):
        await store.update("t1", 1, bogus=1)
    with pytest.raises(ValueError):
        await store.update("t1", 1, **{"state = 'x'; DROP TABLE tasks; --": 1})
    with pytest.raises(KeyError):
        await store.update("t1", 9, state="RUNNING")


async def test_update_sets_updated(store):
    await store.insert_if_new(rec(updated=1.0))
    await store.update("t1", 1, state="STARTING")
    assert (await store.get("t1", 1)).updated > 1.0
    await store.update("t1", 1, updated=5.0)
    assert (await store.get("t1", 1)).updated == 5.0


async def test_active_includes_unreported(store):
    await store.insert_if_new(rec("running"))
    await store.update("running", 1, state="RUNNING", reported="RUNNING")
    await store.insert_if_new(rec("done-unreported"))
    await store.update("done-unreported", 1, state="SUCCEEDED", exit_code=0, reported="RUNNING")
    await store.insert_if_new(rec("done"))
    await store.update("done", 1, state="FAILED", exit_code=3, reported="FAILED")
    active = {r.task_id for r in await store.active()}
    assert active == {"running", "done-unreported"}


async def test_prune_keeps_what_is_owed(store):
    for tid, state, reported in [
        ("a", "SUCCEEDED", "SUCCEEDED"),
        ("b", "SUCCEEDED", "RUNNING"),
        ("c", "RUNNING", "RUNNING"),
        ("d", "KILLED", "KILLED"),
    ]:
        await store.insert_if_new(rec(tid))
        await store.update(tid, 1, state=state, reported=reported, updated=100.0)
    await store.insert_if_new(rec("e"))
    await store.update("e", 1, state="FAILED", reported="FAILED", updated=500.0)
    assert await store.prune(older_than=200.0) == 2
    remaining = {r.task_id for r in await store.active()} | {"e"}
    assert remaining == {"b", "c", "e"}
    assert await store.get("a", 1) is None and await store.get("e", 1) is not None


async def test_reopen_persists(tmp_path):
    path = tmp_path / "agent.db"
    s = await TaskStore.open(path)
    await s.insert_if_new(rec())
    await s.update("t1", 1, state="RUNNING", pid=42, start_time=123.25)
    await s.close()
    s = await TaskStore.open(path)
    try:
        got = await s.get("t1", 1)
        assert (got.state, got.pid, got.start_time) == ("RUNNING", 42, 123.25)
        assert await s.insert_if_new(rec()) is False  # a redelivery after restart
        assert s.recovered_from is None
    finally:
        await s.close()


async def _assert_recovered(path: Path) -> None:
    before = time.time()
    s = await TaskStore.open(path)
    try:
        assert s.recovered_from is not None
        moved = Path(s.recovered_from)
        assert moved.exists() and moved.name.startswith("agent.db.corrupt-")
        assert int(moved.name.split("corrupt-")[1].split(".")[0]) >= int(before)
        assert await s.active() == []
        assert await s.insert_if_new(rec()) is True
    finally:
        await s.close()
    s = await TaskStore.open(path)  # the fresh store is healthy
    try:
        assert s.recovered_from is None and await s.get("t1", 1) is not None
    finally:
        await s.close()


async def test_garbage_file_is_moved_aside(tmp_path):
    path = tmp_path / "agent.db"
    path.write_bytes(os.urandom(8192))
    await _assert_recovered(path)


async def test_truncated_db_is_moved_aside(tmp_path):
    path = tmp_path / "agent.db"
    s = await TaskStore.open(path)
    await s.insert_if_new(rec())
    await s.close()
    conn = sqlite3.connect(path)  # fill the real store in one transaction (fast)
    with conn:
        conn.executemany(
            "INSERT INTO tasks (task_id, attempt, job_id, state, assignment, updated)"
            " VALUES (?, 1, 'j', 'RUNNING', ?, 1.0)",
            [(f"task-{i}", os.urandom(600)) for i in range(300)],
        )
    conn.close()
    size = path.stat().st_size
    assert size > 64 * 1024
    os.truncate(path, size // 2)
    await _assert_recovered(path)


async def test_locked_db_is_not_taken_for_corrupt(tmp_path, monkeypatch):
    path = tmp_path / "agent.db"
    await (await TaskStore.open(path)).close()
    monkeypatch.setattr(TaskStore, "busy_timeout_s", 0.1)
    blocker = sqlite3.connect(path, isolation_level=None, timeout=0)
    blocker.execute("PRAGMA journal_mode = DELETE")
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(sqlite3.OperationalError):
            s = await TaskStore.open(path)
            await s.close()
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert not list(tmp_path.glob("*.corrupt-*"))


async def test_full_database_surfaces(store):
    """SQLITE_FULL (as from a full disk) reaches the caller; the store stays usable."""
    await store.insert_if_new(rec("small"))
    pages = (await store._conn.execute_fetchall("PRAGMA page_count"))[0][0]
    await store._conn.execute(f"PRAGMA max_page_count = {pages + 1}")
    with pytest.raises(sqlite3.OperationalError, match="full"):
        for i in range(50):
            await store.insert_if_new(rec(f"big-{i}", assignment=b"x" * 100_000))
    assert await store.get("small", 1) is not None


async def test_runs_ledger_is_durable_and_read_beside_the_agent(tmp_path):
    from agent.ledger import Run
    from agent.store import LedgerError, read_ledger

    path = tmp_path / "agent.db"
    async with await TaskStore.open(path) as s:
        await s.run_started(Run("t1", 1, 1, "n1", 10.0))
        await s.run_started(Run("t2", 1, 1, "n1", 11.0))
        assert await s.run_ended("t1", 1, 1, 12.0, "FAILED")
        assert not await s.run_ended("t1", 1, 1, 13.0, "SUCCEEDED")  # closed already
        await s.run_started(Run("t1", 1, 2, "n1", 14.0))
        assert (await s.last_run("t1", 1)) == Run("t1", 1, 2, "n1", 14.0, None, "")
        assert read_ledger(path)[0] == Run("t1", 1, 1, "n1", 10.0, 12.0, "FAILED")  # while open
        await s.run_started(Run("t2", 1, 1, "n1", 15.0))  # the same run twice: two rows
    async with await TaskStore.open(path) as s:  # reopened: all of it still there
        assert [(r.task_id, r.run, r.start) for r in await s.runs()] == [
            ("t1", 1, 10.0),
            ("t2", 1, 11.0),
            ("t1", 2, 14.0),
            ("t2", 1, 15.0),
        ]
        assert len(await s.runs("t2")) == 2
    with pytest.raises(LedgerError, match="no agent store"):
        read_ledger(tmp_path / "none.db")
    (tmp_path / "junk.db").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(LedgerError, match="cannot read its ledger"):
        read_ledger(tmp_path / "junk.db")
