"""Shared fixtures: a fresh StoreRoles on each backend, a real SQLite file and a real PostgreSQL.

`store` (and the URL behind it, `store_url`) is parametrized over `sqlite` and `postgres`, so a
test written once runs on both. PostgreSQL comes from `AGIO_TEST_POSTGRES_URL` or a throwaway
cluster started once per test session (see tests/postgres.py); when neither is possible the
postgres cases skip, or fail when `AGIO_REQUIRE_POSTGRES=1`. Either backend's database comes
at the head revision: PostgreSQL's cloned from a migrated template, SQLite's a copy of a file
the store migrated once per process (`sqlite_url`, tests/sqlite.py). Fixtures here never mock
the database.

The tally of the adversarial suite (tests/fuzz) is printed at the end of the session; under
pytest-xdist (`make test` runs several workers) each worker sends its tally to the main
process, which prints the sum.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from agio_grpc.domain import StepMetrics
from agio_grpc.engine.context_window import LEARNED_WINDOWS
from agio_grpc.store.keys import KeyStore
from agio_grpc.store.rows import HISTORY_METRICS
from tests.fuzz.harness import Tally
from tests.fuzz.profiles import BUDGET
from tests.postgres import (
    PostgresUnavailableError,
    TestDatabases,
    postgres_required,
    start_postgres,
)
from tests.roles import StoreRoles, open_roles
from tests.sqlite import sqlite_at

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


TALLY = pytest.StashKey[Tally]()
_TALLY_OUTPUT = "agio_fuzz_tally"


def pytest_configure(config: pytest.Config) -> None:
    config.stash[TALLY] = Tally()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a pytest-xdist worker: hand the tally to the main process."""
    output: dict[str, Any] | None = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[_TALLY_OUTPUT] = session.config.stash[TALLY].to_plain()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """On the pytest-xdist main process: add a finished worker's tally."""
    plain = getattr(node, "workeroutput", {}).get(_TALLY_OUTPUT)
    if plain is not None:
        node.config.stash[TALLY].add_plain(plain)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    tally = terminalreporter.config.stash.get(TALLY, None)
    if tally is None or not tally.cases:
        return
    terminalreporter.write_sep("=", f"fuzz summary (profile {BUDGET.name})")
    for line in tally.lines():
        terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def history_metrics_untouched() -> Iterator[None]:
    """Steps read as history share one empty StepMetrics (store/rows.py): no test's path
    may change it."""
    yield
    assert StepMetrics() == HISTORY_METRICS, "something changed the shared history metrics"


@pytest.fixture(autouse=True)
def no_learned_windows() -> Iterator[None]:
    """A context window one test's provider stated must not shrink the next test's: the
    process keeps what it learns for its life (engine/context_window.py)."""
    yield
    LEARNED_WINDOWS.forget()


def _no_postgres(reason: str) -> NoReturn:
    if postgres_required():
        pytest.fail(f"PostgreSQL is required (AGIO_REQUIRE_POSTGRES=1) but {reason}")
    pytest.skip(f"no PostgreSQL for the tests: {reason}")


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    """An admin URL on a PostgreSQL server for this test session."""
    try:
        url, cluster = start_postgres()
    except PostgresUnavailableError as error:
        _no_postgres(str(error))
    try:
        yield url
    finally:
        if cluster is not None:
            cluster.stop()


@pytest.fixture(scope="session")
def postgres_databases(postgres_admin_url: str) -> Iterator[TestDatabases]:
    """Hands out fresh databases cloned from a migrated template."""
    databases = TestDatabases(postgres_admin_url)
    try:
        databases.prepare()
    except PostgresUnavailableError as error:
        _no_postgres(f"cannot prepare a template database: {error}")
    try:
        yield databases
    finally:
        databases.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """The URL of a new SQLite file at head, tmp_path / "agio.db", with nothing in it
    (a copy of a file migrated once per process: tests/sqlite.py)."""
    return sqlite_at(tmp_path / "agio.db")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test: `sqlite` or `postgres`."""
    name: str = request.param
    return name


@pytest.fixture
async def store_url(backend: str, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """The URL of an empty database of the backend under test at head, removed afterwards."""
    if backend == "sqlite":
        yield request.getfixturevalue("sqlite_url")
        return
    databases: TestDatabases = request.getfixturevalue("postgres_databases")
    url = await databases.create()
    try:
        yield url
    finally:
        await databases.drop(url)


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[StoreRoles]:
    """A fresh store, migrated, on the backend under test."""
    opened = await open_roles(store_url)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def keys(store_url: str) -> AsyncIterator[KeyStore]:
    """The API keys of the backend under test's database, as `agio-grpc keys` opens them."""
    opened = await open_roles(store_url)
    try:
        yield opened.keys()
    finally:
        await opened.close()
