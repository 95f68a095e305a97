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

Only where `database.executes_directly` says the dialect does nothing per execution that
this skips (SQLite). Elsewhere (asyncpg: its statement cache kept in step with DDL, a
cancelled statement taken as a lost connection) the same calls go through
`Connection.execute`. Used for the statements every run runs (taking a session, storing
steps and runs, ending a run) and for reading steps, whose rows are decoded from the
driver's values anyway (`rows.py`). Never begins, commits or rolls back, and never decodes
a row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine.interfaces import DBAPICursor, DBAPIModule, Dialect
from sqlalchemy.sql import Select
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import UpdateBase

from agio_grpc.store.database import executes_directly

__all__ = ["Prepared"]

# What can be prepared: INSERT, UPDATE, DELETE and SELECT constructs.
Statement = UpdateBase | Select[Any]


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


# What `_compile` gives for a dialect whose statements go through `Connection.execute`.
_THROUGH_SQLALCHEMY: Final = None


class Prepared:
    """One Core statement, compiled on first use per dialect and set of parameter names.

    The parameter names choose the columns of an INSERT (or the SET of an UPDATE without
    `.values()`), as in `Connection.execute`; every call with the same names in the same
    order reuses one compilation. A literal of the statement's own (`status == "RUNNING"`,
    a LIMIT) is bound when compiled; a bind parameter with a callable value is refused.
    """

    __slots__ = ("_compiled", "statement")

    def __init__(self, statement: Statement) -> None:
        self.statement = statement
        self._compiled: dict[tuple[str, tuple[str, ...]], _Compiled | None] = {}

    def execute(self, conn: Connection, params: Mapping[str, Any]) -> int:
        """Run once; the number of rows it changed."""
        compiled = self._compile(conn.dialect, tuple(params))
        if compiled is _THROUGH_SQLALCHEMY:
            return conn.execute(self.statement, params).rowcount
        with _run(conn, compiled, [params]) as cursor:
            return int(cursor.rowcount)

    def first(self, conn: Connection, params: Mapping[str, Any]) -> Sequence[Any] | None:
        """Run once; its first row (a query's, or a RETURNING's)."""
        compiled = self._compile(conn.dialect, tuple(params))
        if compiled is _THROUGH_SQLALCHEMY:
            row: Sequence[Any] | None = conn.execute(self.statement, params).first()
            return row
        with _run(conn, compiled, [params]) as cursor:
            fetched: Sequence[Any] | None = cursor.fetchone()
            return fetched

    def execute_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run once per row (`executemany`); every row has the same keys."""
        if not rows:
            return
        compiled = self._compile(conn.dialect, tuple(rows[0]))
        if compiled is _THROUGH_SQLALCHEMY:
            conn.execute(self.statement, list(rows))
            return
        with _run(conn, compiled, rows):
            pass

    @contextmanager
    def cursor(self, conn: Connection, params: Mapping[str, Any]) -> Iterator[DBAPICursor]:
        """Run a query once and hand over the DBAPI cursor, to iterate its rows; closed on
        exit."""
        compiled = self._compile(conn.dialect, tuple(params))
        if compiled is _THROUGH_SQLALCHEMY:
            result = conn.execute(self.statement, params)
            try:
                yield result.cursor
            finally:
                result.close()
            return
        with _run(conn, compiled, [params]) as cursor:
            yield cursor

    def _compile(self, dialect: Dialect, names: tuple[str, ...]) -> _Compiled | None:
        key = (dialect.name, names)
        try:
            return self._compiled[key]
        except KeyError:
            # Threads may race to fill a key; both build the same value.
            compiled = self._compiled[key] = (
                _compile(self.statement, dialect, names)
                if executes_directly(dialect)
                else _THROUGH_SQLALCHEMY
            )
            return compiled


def _compile(statement: Statement, dialect: Dialect, names: tuple[str, ...]) -> _Compiled:
    compiled = statement.compile(dialect=dialect, column_keys=list(names))
    if not isinstance(compiled, SQLCompiler) or not compiled.positional:
        raise TypeError(f"not a statement with positional parameters: {statement}")
    binds = compiled.binds
    # Parameters rendered per call from their values (IN lists, literal_execute) or computed
    # per call (a callable) are not something to compile once.
    if compiled.literal_execute_params or compiled.post_compile_params:
        raise ValueError("a prepared statement cannot take a parameter rendered per call")
    order: list[tuple[str, Callable[[Any], Any] | None, Any]] = []
    for name in compiled.positiontup or ():
        bind = binds[name]
        if bind.expanding or bind.callable is not None:
            raise ValueError(f"a prepared statement cannot take parameter {name!r}")
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if bind.required:
            order.append((name, process, _PASSED))
        else:
            order.append((name, None, bind.value if process is None else process(bind.value)))
    return _Compiled(compiled.string, tuple(order))


@contextmanager
def _run(
    conn: Connection, compiled: _Compiled, rows: Sequence[Mapping[str, Any]]
) -> Iterator[DBAPICursor]:
    """`compiled` run on the connection's DBAPI cursor, once per row of parameters."""
    try:
        arguments = [compiled.arguments(row) for row in rows]
    except Exception as error:
        # As SQLAlchemy reports a value its bind processor refused (a naive datetime).
        raise sa_exc.StatementError(
            str(error), compiled.sql, rows, error, hide_parameters=True
        ) from error
    dbapi = conn.connection.dbapi_connection
    if dbapi is None:  # only after the connection was closed or detached
        raise sa_exc.ResourceClosedError("the connection is closed")
    cursor: DBAPICursor | None = None
    try:
        try:
            cursor = dbapi.cursor()
            if len(arguments) == 1:
                cursor.execute(compiled.sql, arguments[0])
            else:
                cursor.executemany(compiled.sql, arguments)
        except conn.dialect.loaded_dbapi.Error as error:
            raise _wrapped(conn, cursor, compiled.sql, arguments, error) from error
        yield cursor
    finally:
        if cursor is not None:
            # A cursor of a connection that was just lost may fail to close; the error that
            # lost it is the one to report.
            with contextlib.suppress(conn.dialect.loaded_dbapi.Error):
                cursor.close()


def _wrapped(
    conn: Connection,
    cursor: DBAPICursor | None,
    sql: str,
    arguments: Any,
    error: DBAPIModule.Error,
) -> sa_exc.StatementError:
    """`error` as `Connection.execute` would have raised it, with the connection invalidated
    when the driver lost it (so the pool replaces it rather than hand it out again)."""
    dialect = conn.dialect
    lost = dialect.is_disconnect(error, conn.connection.dbapi_connection, cursor)
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
