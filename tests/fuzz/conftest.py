"""Fixtures of the adversarial suite: one server per backend per test module, shared by every
example of its properties (each example makes fresh sessions). The tally of cases and status
codes they fill is printed at the end of the pytest session (tests/conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import pytest

from tests.conftest import BACKENDS, TALLY
from tests.fuzz.harness import FuzzService, Tally, serving
from tests.postgres import TestDatabases

T = TypeVar("T")


Serving = Callable[[str, str, Tally], AbstractAsyncContextManager[T]]


def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, serving: Serving[T]
) -> Iterator[T]:
    """What `serving` starts on the backend `request.param` names (a fresh SQLite file or
    PostgreSQL database), on an event loop of its own, for a module fixture to yield."""
    backend: str = request.param
    loop = asyncio.new_event_loop()
    databases: TestDatabases | None = None
    try:
        if backend == "sqlite":
            url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('fuzz') / 'agio.db'}"
        else:
            databases = request.getfixturevalue("postgres_databases")
            url = loop.run_until_complete(databases.create())
        service = serving(backend, url, request.config.stash[TALLY])
        started = loop.run_until_complete(service.__aenter__())
        try:
            yield started
        finally:
            loop.run_until_complete(service.__aexit__(None, None, None))
            if databases is not None:
                loop.run_until_complete(databases.drop(url))
    finally:
        loop.close()


@pytest.fixture(scope="module", params=BACKENDS)
def fuzz_service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FuzzService]:
    """The service on the backend under test, on an event loop of its own."""
    yield from served(request, tmp_path_factory, serving)
