"""Fixtures of the engine tests: a real SQLite file store, the fake model over HTTP, and a
runtime on both (see harness.py); `backend_harness` is the runtime on each backend's store
(`store`, tests/conftest.py). Nothing is mocked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agio_grpc.testing import FakeModelServer
from tests.engine.harness import Gate, Harness, build_runtime
from tests.roles import StoreRoles, open_roles
from tests.sqlite import sqlite_at


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[StoreRoles]:
    store = await open_roles(sqlite_at(tmp_path / "engine.db"))
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def fake_model() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as server:
        yield server


@asynccontextmanager
async def running(store: StoreRoles, fake_model: FakeModelServer) -> AsyncIterator[Harness]:
    """A runtime on `store`, shut down afterwards (its gate released first)."""
    built = build_runtime(store, fake_model, Gate())
    try:
        yield built
    finally:
        built.gate.release.set()
        await built.runtime.shutdown(grace_s=0)
        await built.driver.close()


@pytest.fixture
async def harness(sqlite_store: StoreRoles, fake_model: FakeModelServer) -> AsyncIterator[Harness]:
    async with running(sqlite_store, fake_model) as built:
        yield built


@pytest.fixture
async def backend_harness(store: StoreRoles, fake_model: FakeModelServer) -> AsyncIterator[Harness]:
    """The runtime of `harness` on the backend under test (SQLite, then PostgreSQL)."""
    async with running(store, fake_model) as built:
        yield built
