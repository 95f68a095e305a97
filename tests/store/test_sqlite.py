"""What only the SQLite backend promises: WAL on a real file, and its settings checked.

The behaviour both backends share lives in test_conformance.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sqlite3
import stat
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from sqlalchemy import Connection, event

from agio_grpc.domain import Role, Step
from agio_grpc.store import StoreError
from agio_grpc.store import database as database_module
from agio_grpc.store.database import SqliteDatabase, parse_url
from tests.roles import StoreRoles, open_roles


async def test_sqlite_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "agio.db"
    store = await open_roles(f"sqlite+aiosqlite:///{path}")
    try:
        session = await store.new_session()
        await store.append_one(Step(session_id=session.id, run_id="r", role=Role.USER))
    finally:
        await store.close()

    with sqlite3.connect(path) as conn:
        (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
    assert mode == "wal"


async def test_plain_sqlite_url_and_full_sync_are_accepted(tmp_path: Path) -> None:
    store = await open_roles(f"sqlite:///{tmp_path / 'agio.db'}", sqlite_synchronous="full")
    try:
        assert store.backend == "sqlite"
        assert (
            await store.append_one(
                Step(session_id=(await store.new_session()).id, run_id="r", role=Role.USER)
            )
        ).sequence == 1
    finally:
        await store.close()


async def test_unknown_synchronous_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sqlite_synchronous"):
        await open_roles(f"sqlite+aiosqlite:///{tmp_path / 'agio.db'}", sqlite_synchronous="OFTEN")


async def test_a_new_sqlite_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "private.db"
    store = await open_roles(f"sqlite+aiosqlite:///{path}")
    try:
        session = await store.new_session()
        await store.append_steps([Step(session.id, "run_1", Role.USER, content="secret")])
        modes = file_modes(tmp_path)  # with the -wal and -shm files there too
    finally:
        await store.close()
    assert modes["private.db"] == 0o600
    assert len(modes) == 3
    assert all(mode & 0o077 == 0 for mode in modes.values()), modes


def file_modes(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}


# -- brief writes: on the event loop's thread when the write lock is free ----------------


def sqlite_database(path: Path, synchronous: str = "NORMAL") -> SqliteDatabase:
    database = SqliteDatabase(parse_url(f"sqlite:///{path}"), synchronous)
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, body TEXT)")
    return database


def writing(body: str, threads: list[int]) -> Callable[[Connection], int]:
    def work(conn: Connection) -> int:
        threads.append(threading.get_ident())
        conn.exec_driver_sql("INSERT INTO notes (body) VALUES (?)", (body,))
        return int(conn.exec_driver_sql("SELECT count(*) FROM notes").scalar_one())

    return work


def notes(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [body for (body,) in conn.execute("SELECT body FROM notes ORDER BY id")]


async def test_a_brief_write_runs_on_the_event_loops_thread_when_the_lock_is_free(
    tmp_path: Path,
) -> None:
    database = sqlite_database(tmp_path / "agio.db")
    threads: list[int] = []
    try:
        assert await database.run(writing("brief", threads), write=True, brief=True) == 1
        assert await database.run(writing("long", threads), write=True) == 2
    finally:
        await database.dispose()

    assert threads[0] == threading.get_ident()
    assert threads[1] != threading.get_ident()  # the writer thread's
    assert notes(tmp_path / "agio.db") == ["brief", "long"]


async def test_a_brief_write_waits_on_the_writer_thread_while_another_process_writes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "agio.db"
    database = sqlite_database(path)
    threads: list[int] = []
    other = sqlite3.connect(path, isolation_level=None)
    try:
        await database.run(writing("first", []), write=True, brief=True)  # its connection open
        other.execute("BEGIN IMMEDIATE")  # the write lock, as another process would hold it
        other.execute("INSERT INTO notes (body) VALUES ('other')")
        write = asyncio.create_task(database.run(writing("brief", threads), write=True, brief=True))
        await asyncio.sleep(0)  # the brief write found the lock held: now it waits, queued
        assert not write.done()
        other.execute("COMMIT")
        assert await write == 3
        # The lock free again, the next one commits on the event loop's thread again.
        assert await database.run(writing("after", threads), write=True, brief=True) == 4
    finally:
        other.close()
        await database.dispose()

    assert threads[0] != threading.get_ident()
    assert threads[1] == threading.get_ident()
    assert notes(path) == ["first", "other", "brief", "after"]


async def test_brief_writes_keep_their_connection_until_one_fails(tmp_path: Path) -> None:
    database = sqlite_database(tmp_path / "agio.db")
    checkouts: list[int] = []
    assert database._brief is not None
    event.listen(database._brief._engine, "checkout", lambda *_: checkouts.append(1))

    def clash(conn: Connection) -> None:
        conn.exec_driver_sql("INSERT INTO notes (id, body) VALUES (1, 'again')")

    try:
        await database.run(writing("one", []), write=True, brief=True)
        opened = len(checkouts)
        for body in ("two", "three"):
            await database.run(writing(body, []), write=True, brief=True)
        assert len(checkouts) == opened
        with pytest.raises(StoreError, match="constraint violated"):
            await database.run(clash, write=True, brief=True)
        await database.run(writing("four", []), write=True, brief=True)  # opened again
        assert len(checkouts) == opened + 1
    finally:
        await database.dispose()
    assert notes(tmp_path / "agio.db") == ["one", "two", "three", "four"]


async def test_a_brief_write_that_fails_writes_nothing_and_says_why(tmp_path: Path) -> None:
    database = sqlite_database(tmp_path / "agio.db")

    def clash(conn: Connection) -> None:
        conn.exec_driver_sql("INSERT INTO notes (id, body) VALUES (1, 'first')")
        conn.exec_driver_sql("INSERT INTO notes (id, body) VALUES (1, 'again')")

    try:
        with pytest.raises(StoreError, match="constraint violated"):
            await database.run(clash, write=True, brief=True)
        assert await database.run(writing("after", []), write=True, brief=True) == 1
    finally:
        await database.dispose()
    assert notes(tmp_path / "agio.db") == ["after"]


async def test_brief_writes_under_full_sync_stay_on_the_writer_thread(tmp_path: Path) -> None:
    # FULL syncs every commit to the disk: never on the event loop's thread.
    database = sqlite_database(tmp_path / "agio.db", "FULL")
    threads: list[int] = []
    try:
        await database.run(writing("synced", threads), write=True, brief=True)
    finally:
        await database.dispose()
    assert threads[0] != threading.get_ident()


# -- reads: on the event loop's thread, on a reader thread when they would wait ------------


@contextlib.asynccontextmanager
async def session_of(path: Path, count: int) -> AsyncIterator[tuple[StoreRoles, str, list[int]]]:
    """A store on `path` with a session of `count` steps, and the threads its transactions
    on the threaded connections ran on (the writer's and the readers', not the event
    loop's own connections) from then on."""
    store = await open_roles(f"sqlite:///{path}")
    try:
        session = await store.new_session()
        await store.append_steps(
            [Step(session.id, "r", Role.USER, content=f"step {n}") for n in range(count)]
        )
        threads: list[int] = []
        engine = store.front._database._engine  # type: ignore[attr-defined]
        event.listen(engine, "checkout", lambda *_: threads.append(threading.get_ident()))
        yield store, session.id, threads
    finally:
        await store.close()


async def test_reads_run_on_the_event_loops_thread(tmp_path: Path) -> None:
    async with session_of(tmp_path / "agio.db", 5) as (store, session_id, threads):
        history = await store.get_history(session_id)
        steps = await store.get_steps(session_id)
        session = await store.get_session(session_id)
    assert [step.content for step in history] == [f"step {n}" for n in range(5)]
    assert [step.sequence for step in steps] == [1, 2, 3, 4, 5]
    assert session.step_count == 5
    assert threads == []  # no transaction on a threaded connection


async def test_a_read_of_more_steps_than_the_loop_may_wait_for_runs_on_a_reader_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database_module, "LOOP_READ_ROWS", 3)
    async with session_of(tmp_path / "agio.db", 7) as (store, session_id, threads):
        first = await store.get_history(session_id, 1, 3)
        last = await store.get_history(session_id, 5)
        page = await store.get_steps(session_id, limit=3)
        one = await store.get_step(session_id, 6)
        assert threads == []  # three steps at most each: on the loop's thread
        whole = await store.get_history(session_id)
        assert len(threads) == 1
        steps = await store.get_steps(session_id, 2)
    assert [step.sequence for step in first] == [1, 2, 3]
    assert [step.sequence for step in last] == [5, 6, 7]
    assert [step.sequence for step in page] == [1, 2, 3]
    assert one.content == "step 5"
    assert [step.content for step in whole] == [f"step {n}" for n in range(7)]
    assert [step.sequence for step in steps] == list(range(2, 8))
    assert len(threads) == 2
    assert threading.get_ident() not in threads


async def test_a_read_that_would_wait_for_a_lock_waits_on_a_reader_thread(
    tmp_path: Path,
) -> None:
    # In WAL mode a reader waits only while the log's read locks change hands (recovery,
    # a restart of the log): SQLite says SQLITE_BUSY to the loop's connection, which never
    # waits. Made here by the read itself, the first time it runs.
    database = sqlite_database(tmp_path / "agio.db")
    threads: list[int] = []

    def read(conn: Connection) -> int:
        threads.append(threading.get_ident())
        if len(threads) == 1:
            busy = sqlite3.OperationalError("database is locked")
            busy.sqlite_errorcode = sqlite3.SQLITE_BUSY
            raise busy
        return int(conn.exec_driver_sql("SELECT count(*) FROM notes").scalar_one())

    try:
        await database.run(writing("one", []), write=True, brief=True)
        assert await database.run(read, write=False) == 1
        assert await database.run(read, write=False) == 1  # its connection opened again
    finally:
        await database.dispose()
    assert threads[0] == threading.get_ident()
    assert threads[1] != threading.get_ident()  # a reader thread's
    assert threads[2] == threading.get_ident()


async def test_a_read_that_fails_says_why_and_the_next_one_runs(tmp_path: Path) -> None:
    database = sqlite_database(tmp_path / "agio.db")

    def broken(conn: Connection) -> None:
        conn.exec_driver_sql("SELECT nothing FROM notes")

    def count(conn: Connection) -> int:
        return int(conn.exec_driver_sql("SELECT count(*) FROM notes").scalar_one())

    try:
        with pytest.raises(StoreError):
            await database.run(broken, write=False)
        assert await database.run(count, write=False) == 0
    finally:
        await database.dispose()


def log_frames(path: Path) -> int:
    """Frames in the WAL's log now: what was committed since it last started over."""
    with sqlite3.connect(path) as conn:
        _busy, frames, _copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(frames)


async def checkpointed(database: SqliteDatabase) -> None:
    while (checkpoint := database._checkpoint) is not None:
        await checkpoint


def blocked(database: SqliteDatabase) -> threading.Event:
    """The writer thread held until the event is set."""
    release = threading.Event()
    database._writer.submit(release.wait)
    return release


async def frames_after_a_checkpoint(database: SqliteDatabase, path: Path) -> int:
    """Five brief writes of 3 KB (CHECKPOINT_EVERY set to 5), their checkpoint, one more
    write, and the database disposed of: the frames in the log then."""
    try:
        for index in range(5):
            await database.run(writing("x" * 3000 + str(index), []), write=True, brief=True)
        await checkpointed(database)
        await database.run(writing("after", []), write=True, brief=True)
        return log_frames(path)
    finally:
        await database.dispose()


async def test_brief_writes_checkpoint_the_wal_on_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The brief writes' connection never checkpoints (a commit on the event loop's thread
    # would copy the log into the file); every CHECKPOINT_EVERY of them, the writer
    # thread does, so the log starts over instead of growing.
    monkeypatch.setattr(database_module, "CHECKPOINT_EVERY", 5)
    path = tmp_path / "agio.db"
    database = sqlite_database(path)
    frames = await frames_after_a_checkpoint(database, path)
    assert 0 < frames < 5  # the last commit's only, once the log started over


async def test_the_log_starts_over_after_a_commit_during_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A checkpoint copies what was committed when it began. Under a steady stream of
    # commits, one always lands during it: the log was never all copied, never started
    # over, and grew without end. Here a commit begun before the first checkpoint ends
    # after it (on another connection, as a brief write on the event loop would).
    monkeypatch.setattr(database_module, "CHECKPOINT_EVERY", 5)
    path = tmp_path / "agio.db"
    database = sqlite_database(path)
    copy = database._checkpoint_passive
    copies: list[int] = []

    def copy_during_a_commit() -> None:
        copies.append(len(copies))
        if len(copies) > 1:
            copy()
            return
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # begun before the copy, committed after it
            copy()
            other.execute("INSERT INTO notes (body) VALUES (?)", ("y" * 3000,))
            other.execute("COMMIT")
        finally:
            other.close()

    monkeypatch.setattr(database, "_checkpoint_passive", copy_during_a_commit)
    frames = await frames_after_a_checkpoint(database, path)
    assert 0 < frames < 5  # started over: six commits of 3 KB each would be 12 frames and more
    assert copies == [0, 1]
    assert len(notes(path)) == 7


@contextlib.asynccontextmanager
async def second_checkpoint_held(
    path: Path, monkeypatch: pytest.MonkeyPatch, hold_s: float
) -> AsyncIterator[tuple[SqliteDatabase, threading.Event]]:
    """A database at `path` after brief writes "0" to "4" and a checkpoint after them, once
    the checkpoint that follows the first is under way, held until the event is set (at the
    latest when the block ends, which then waits for it and disposes of the database);
    brief writes wait for it `hold_s` at most."""
    monkeypatch.setattr(database_module, "CHECKPOINT_EVERY", 5)
    monkeypatch.setattr(database_module, "CHECKPOINT_HOLD_S", hold_s)
    database = sqlite_database(path)
    release = threading.Event()
    copy = database._checkpoint_passive
    calls: list[int] = []
    second = threading.Event()

    def hold_the_second() -> None:
        calls.append(len(calls))
        if len(calls) == 2:
            second.set()
            release.wait()
        copy()

    monkeypatch.setattr(database, "_checkpoint_passive", hold_the_second)
    try:
        for index in range(5):
            await database.run(writing(str(index), []), write=True, brief=True)
        await asyncio.to_thread(second.wait)
        assert database._held is not None
        yield database, release
    finally:
        release.set()
        await checkpointed(database)
        await database.dispose()


async def test_brief_writes_wait_for_the_checkpoint_on_the_event_loops_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # During the checkpoint that copies what came in during the first, brief writes wait,
    # then commit on the event loop's thread: sent to the writer thread instead, each would
    # find the one before it holding the lock, and all of them would go on going there.
    path = tmp_path / "agio.db"
    threads: list[int] = []
    async with second_checkpoint_held(path, monkeypatch, hold_s=60) as (database, release):
        held, gone = writing("held", threads), writing("gone", threads)
        waiting = asyncio.create_task(database.run(held, write=True, brief=True))
        leaving = asyncio.create_task(database.run(gone, write=True, brief=True))
        await asyncio.sleep(0)
        assert not waiting.done()
        assert not leaving.done()
        leaving.cancel()  # its caller went away while it waited: it writes nothing
        await asyncio.sleep(0)
        release.set()
        assert await waiting == 6
        with pytest.raises(asyncio.CancelledError):
            await leaving
        await checkpointed(database)
    assert threads == [threading.get_ident()]
    assert notes(path) == ["0", "1", "2", "3", "4", "held"]


async def test_a_checkpoint_that_stalls_holds_brief_writes_back_for_a_while_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A disk that stalls the checkpoint's syncs (or a checkpoint queued behind the writer
    # thread's work): a write waits CHECKPOINT_HOLD_S, then commits on the event loop's
    # thread beside it, and the writes after it do not wait for that checkpoint at all.
    path = tmp_path / "agio.db"
    threads: list[int] = []
    async with second_checkpoint_held(path, monkeypatch, hold_s=0.01) as (database, _):
        assert await database.run(writing("on", threads), write=True, brief=True) == 6
        assert database._checkpoint is not None  # still stalled,
        assert database._held is None  # and holding no write back any more
        monkeypatch.setattr(database_module, "CHECKPOINT_HOLD_S", 60)
        after = database.run(writing("after", threads), write=True, brief=True)
        assert await asyncio.wait_for(after, 30) == 7
        assert database._checkpoint is not None
    assert threads == [threading.get_ident()] * 2
    assert notes(path)[-2:] == ["on", "after"]


async def test_a_checkpoint_disposed_of_before_it_ran_leaves_no_unretrieved_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(database_module, "CHECKPOINT_EVERY", 5)
    database = sqlite_database(tmp_path / "agio.db")

    def fail() -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(database, "_checkpoint_passive", fail)
    for index in range(5):  # the last submits the first checkpoint; its task has not run
        await database.run(writing(str(index), []), write=True, brief=True)
    await database.dispose()  # cancels the task before its first step
    await asyncio.sleep(0)
    gc.collect()
    assert "never retrieved" not in caplog.text


async def test_disposing_during_a_checkpoint_ends_it_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(database_module, "CHECKPOINT_EVERY", 5)
    path = tmp_path / "agio.db"
    database = sqlite_database(path)
    await database.run(writing("0", []), write=True, brief=True)  # its connection open
    release = blocked(database)  # the checkpoint waits behind it
    for index in range(1, 5):
        await database.run(writing(str(index), []), write=True, brief=True)
    assert database._checkpoint is not None
    disposing = asyncio.create_task(database.dispose())
    await asyncio.sleep(0)
    release.set()
    await disposing
    assert "checkpoint failed" not in caplog.text
    assert notes(path) == ["0", "1", "2", "3", "4"]
