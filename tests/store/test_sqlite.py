"""What only the SQLite backend promises: WAL on a real file, and its settings checked.

The behaviour both backends share lives in test_conformance.py.
"""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from agio_grpc.domain import Role, Step
from tests.roles import open_roles


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
