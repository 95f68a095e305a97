"""The store's hot statements, compiled once by SQLAlchemy and run on the DBAPI cursor.

SQLAlchemy's per-execution layer (binding parameters against the compiled statement, the
execution events, the result object) cost more CPU than SQLite spent running the statements
of a run's start: that transaction took 0.58 ms p50 through `Connection.execute` and 0.38
ms this way, and it is on the path to every run's first token. A `Prepared` statement
keeps SQLAlchemy for what it is for: the statement is a Core construct, compiled for the
connection's dialect (its SQL and its parameter order), each parameter converted by its
column type's own bind processor, run on the connection SQLAlchemy checked out inside the
transaction SQLAlchemy began. Only the execution layer is skipped, so a driver error is
wrapped the way SQLAlchemy wraps it (`DBAPIError.instance`, the connection invalidated
when the driver says it is lost) and `database.as_store_error` maps it as before.

Used for the statements every run runs (taking a session, storing steps and runs, ending
a run) and for reading steps, whose rows are decoded from the driver's values anyway
(`rows.py`). Never begins, commits or rolls back, and never decodes a row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine.interfaces import DBAPIConnection, DBAPICursor, DBAPIModule, Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

__all__ = ["Prepared"]


# Marks a parameter the caller passes, unlike a literal of the statement's own.
_PASSED: Final = object()


@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    # The SQL's parameters in order: name, its column type's bind processor for the dialect
    # (None: the driver takes the value as it is), and `_PASSED` or the statement's own
    # value (a literal such as `status == "RUNNING"` or a LIMIT), already processed.
    binds: tuple[tuple[str, Callable[[Any], Any] | None, Any], ...]

    def arguments(self, params: Mapping[str, Any]) -> list[Any]:
        values: list[Any] = []
        for name, process, own in self.binds:
            if own is not _PASSED:
                values.append(own)
            elif process is None:
                values.append(params[name])
            else:
                values.append(process(params[name]))
        return values


class Prepared:
    """One Core statement, compiled on first use per dialect and set of parameter names.

    The parameter names choose the columns of an INSERT (or the SET of an UPDATE without
    `.values()`), as in `Connection.execute`; every call with the same names in the same
    order reuses one compilation.
    """

    __slots__ = ("_compiled", "statement")

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._compiled: dict[tuple[str, tuple[str, ...]], _Compiled] = {}

    def execute(self, conn: Connection, params: Mapping[str, Any]) -> int:
        """Run once; the number of rows it changed."""
        with self.cursor(conn, params) as cursor:
            return int(cursor.rowcount)

    def first(self, conn: Connection, params: Mapping[str, Any]) -> Sequence[Any] | None:
        """Run once; its first row (a query's, or a RETURNING's), as the driver gives it."""
        with self.cursor(conn, params) as cursor:
            row: Sequence[Any] | None = cursor.fetchone()
            return row

    def execute_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run once per row (`executemany`); every row has the same keys."""
        if not rows:
            return
        compiled = self._compile(conn.dialect, tuple(rows[0]))
        arguments = [compiled.arguments(row) for row in rows]
        dbapi = _dbapi_connection(conn)
        cursor = dbapi.cursor()
        try:
            cursor.executemany(compiled.sql, arguments)
        except conn.dialect.loaded_dbapi.Error as error:
            raise _wrapped(conn, dbapi, cursor, compiled.sql, arguments, error) from error
        finally:
            _close(conn, cursor)

    @contextmanager
    def cursor(self, conn: Connection, params: Mapping[str, Any]) -> Iterator[DBAPICursor]:
        """Run once and hand over the cursor (its rows, its rowcount); closed on exit."""
        compiled = self._compile(conn.dialect, tuple(params))
        arguments = compiled.arguments(params)
        dbapi = _dbapi_connection(conn)
        cursor = dbapi.cursor()
        try:
            try:
                cursor.execute(compiled.sql, arguments)
            except conn.dialect.loaded_dbapi.Error as error:
                raise _wrapped(conn, dbapi, cursor, compiled.sql, arguments, error) from error
            yield cursor
        finally:
            _close(conn, cursor)

    def _compile(self, dialect: Dialect, names: tuple[str, ...]) -> _Compiled:
        key = (dialect.name, names)
        compiled = self._compiled.get(key)
        if compiled is None:
            # Threads may race to fill a key; both build the same value.
            compiled = self._compiled[key] = _compile(self.statement, dialect, names)
        return compiled


def _compile(statement: ClauseElement, dialect: Dialect, names: tuple[str, ...]) -> _Compiled:
    compiled = statement.compile(dialect=dialect, column_keys=list(names))
    if not isinstance(compiled, SQLCompiler):  # DDL compiles to a DDLCompiler
        raise TypeError(f"not a SQL statement: {statement}")
    binds = compiled.binds
    if any(bind.expanding for bind in binds.values()):
        # An IN list is rendered per call from its values: not something to compile once.
        raise ValueError("a prepared statement cannot take an expanding (IN) parameter")
    order: list[tuple[str, Callable[[Any], Any] | None, Any]] = []
    for name in compiled.positiontup or ():
        bind = binds[name]
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if bind.required:
            order.append((name, process, _PASSED))
        else:
            value = bind.effective_value
            order.append((name, None, value if process is None else process(value)))
    return _Compiled(compiled.string, tuple(order))


def _dbapi_connection(conn: Connection) -> DBAPIConnection:
    dbapi = conn.connection.dbapi_connection
    if dbapi is None:  # only after the connection was closed or detached
        raise sa_exc.ResourceClosedError("the connection is closed")
    return dbapi


def _close(conn: Connection, cursor: DBAPICursor) -> None:
    # A cursor of a connection that was just lost may fail to close; the error that lost it
    # is the one to report.
    with contextlib.suppress(conn.dialect.loaded_dbapi.Error):
        cursor.close()


def _wrapped(
    conn: Connection,
    dbapi: DBAPIConnection,
    cursor: DBAPICursor,
    sql: str,
    arguments: Any,
    error: DBAPIModule.Error,
) -> sa_exc.StatementError:
    """`error` as `Connection.execute` would have raised it, with the connection invalidated
    when the driver lost it (so the pool replaces it rather than hand it out again)."""
    dialect = conn.dialect
    lost = dialect.is_disconnect(error, dbapi, cursor)
    if lost:
        conn.invalidate(error)
    return sa_exc.DBAPIError.instance(
        sql,
        arguments,
        error,
        dialect.loaded_dbapi.Error,
        hide_parameters=True,
        connection_invalidated=lost,
        dialect=dialect,
    )
