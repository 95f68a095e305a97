"""Decoding step rows from each driver's own values (no SQLAlchemy type processing).

The conformance suite checks the round trip through both real databases; these pin the
driver value shapes the decoder must accept, including ones a live round trip rarely hits.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from agio_grpc.domain import Role, Run, Step, StepMetrics, ToolCall
from agio_grpc.store.rows import (
    RUN_MUTABLE_COLUMNS,
    STEP_READ_COLUMNS,
    run_mutable_values,
    steps_from_rows,
    utc_from_database,
)
from agio_grpc.store.tables import steps as step_table

MOMENT = datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize(
    "value",
    [
        "2025-06-01 12:00:00.123456",  # SQLite: naive UTC text as SQLAlchemy writes it
        MOMENT,  # asyncpg: aware UTC
        MOMENT.astimezone(timezone(timedelta(hours=5, minutes=30))),
        MOMENT.replace(tzinfo=None),
    ],
)
def test_times_decode_to_the_same_aware_utc_instant(value: datetime | str) -> None:
    decoded = utc_from_database(value)
    assert decoded == MOMENT
    assert decoded.tzinfo is UTC


def test_sqlite_text_without_a_fraction_decodes() -> None:
    assert utc_from_database("2025-06-01 12:00:00") == MOMENT.replace(microsecond=0)


def test_every_step_column_is_read_but_the_ones_a_reader_knows_or_derives() -> None:
    read = {column.name for column in STEP_READ_COLUMNS}
    assert read | {"session_id", "tool_call_count"} == set(step_table.columns.keys())


def row(**values: Any) -> tuple[Any, ...]:
    """A driver row of `STEP_READ_COLUMNS`: a plain user step unless `values` say otherwise."""
    defaults: dict[str, Any] = {
        "id": "step_1",
        "run_id": "run_1",
        "sequence": 1,
        "role": "user",
        "tool_calls": "[]",
        "is_error": 0,
        "create_time": "2025-06-01 12:00:00.123456",
    }
    text_columns = {column.name for column in STEP_READ_COLUMNS if column.type.python_type is str}
    merged = {**{name: "" for name in text_columns}, **defaults, **values}
    return tuple(merged.get(column.name, 0) for column in STEP_READ_COLUMNS)


def test_sqlite_and_postgres_shaped_rows_decode_alike() -> None:
    calls = '[{"id": "c1", "name": "f", "arguments": "{}"}]'
    shared = {"role": "assistant", "tool_calls": calls, "model_name": "m", "provider": "p"}
    sqlite_row = row(**shared, is_error=1)
    postgres_row = row(**shared, is_error=True, create_time=MOMENT)

    from_sqlite = steps_from_rows("sess_1", [sqlite_row])[0]
    from_postgres = steps_from_rows("sess_1", [postgres_row])[0]

    expected = Step(
        "sess_1",
        "run_1",
        Role.ASSISTANT,
        tool_calls=[ToolCall("c1", "f", "{}")],
        is_error=True,
        metrics=StepMetrics(model_name="m", provider="p"),
        id="step_1",
        sequence=1,
        create_time=MOMENT,
    )
    assert from_sqlite == expected
    assert from_postgres == expected
    assert type(from_sqlite.is_error) is bool


def test_an_empty_tool_call_text_means_no_calls() -> None:
    assert steps_from_rows("sess_1", [row(tool_calls="")])[0].tool_calls == []


def test_the_prepared_run_update_writes_every_mutable_column() -> None:
    run = Run(session_id="sess_1", agent="default")
    assert tuple(run_mutable_values(run)) == RUN_MUTABLE_COLUMNS
