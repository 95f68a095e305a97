"""A write the database refuses during a run leaves no user or model content in the log, at
any level, on both backends: the engines hide a statement's parameters (`hide_parameters`,
store/database.py), so not even an exception's own text quotes what was written. A refusal
whose own text quotes the row (PostgreSQL's `DETAIL: Failing row contains`) is written, as
every traceback is, without the exceptions' messages (telemetry/logs.py)."""

from __future__ import annotations

import io
import logging
from collections.abc import AsyncIterator

import grpc
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.service.app import AgioApp
from agio_grpc.telemetry import trace_log_handler
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.v1 import resources_pb2
from tests.service.conftest import make_settings

USER_TEXT = "the user's secret heron"
MODEL_TEXT = "the model's secret osprey"

REFUSING_TRIGGERS = {
    "sqlite": [
        """CREATE TRIGGER refuse_secrets BEFORE INSERT ON steps
        WHEN NEW.content LIKE '%secret%'
        BEGIN SELECT RAISE(ABORT, 'this database refuses the step'); END""",
    ],
    "postgres": [
        """CREATE FUNCTION refuse_secrets() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'this database refuses the step'; END $$""",
        """CREATE TRIGGER refuse_secrets BEFORE INSERT ON steps FOR EACH ROW
        WHEN (NEW.content LIKE '%secret%') EXECUTE FUNCTION refuse_secrets()""",
    ],
}
"""A trigger that refuses every step whose content holds `secret` (the steps of the tests)."""
REMOVALS = {
    "sqlite": ["DROP TRIGGER refuse_secrets"],
    "postgres": ["DROP TRIGGER refuse_secrets ON steps", "DROP FUNCTION refuse_secrets()"],
}
"""The trigger removed again (a PostgreSQL test database is emptied and used again)."""


async def execute(store_url: str, statements: list[str]) -> None:
    engine = create_async_engine(store_url)
    try:
        async with engine.begin() as conn:
            for statement in statements:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


@pytest.fixture
async def refusing_app(
    backend: str, store_url: str, fake_model: FakeModelServer
) -> AsyncIterator[AgioApp]:
    """The service on the backend under test (migrated by its start), its database then
    refusing the steps the tests write."""
    started = await AgioApp.start(make_settings(store_url, fake_model.base_url))
    try:
        await execute(store_url, REFUSING_TRIGGERS[backend])
        try:
            yield started
        finally:
            await execute(store_url, REMOVALS[backend])
    finally:
        await started.stop(grace=0)


@pytest.fixture
def every_record(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


def assert_no_content(caplog: pytest.LogCaptureFixture, *secrets: str) -> None:
    """No record, its message or its exception's text (as a plain formatter writes it, with
    the exceptions' messages), quotes any of `secrets`."""
    plain = logging.Formatter("%(name)s %(levelname)s %(message)s")
    lines = [plain.format(record) for record in caplog.records]
    assert lines, "the failure was logged"
    for secret in secrets:
        assert not any(secret in line for line in lines), secret


async def test_a_refused_user_step_logs_no_user_content(
    refusing_app: AgioApp, every_record: pytest.LogCaptureFixture
) -> None:
    async with AgioClient(refusing_app.address) as client:
        with pytest.raises(AgioError) as refused:
            await client.run_to_end(USER_TEXT)
    assert refused.value.code == grpc.StatusCode.INTERNAL
    assert USER_TEXT not in refused.value.message
    assert "refuses the step" in every_record.text  # the database's refusal is in the log
    assert_no_content(every_record, USER_TEXT)


async def test_a_refused_model_reply_ends_the_run_and_logs_no_content(
    refusing_app: AgioApp, fake_model: FakeModelServer, every_record: pytest.LogCaptureFixture
) -> None:
    fake_model.enqueue(Turn.text(MODEL_TEXT))
    async with AgioClient(refusing_app.address) as client:
        ended = await client.run_to_end("tell me about herons")
    signal = ended.run.stop_signal
    assert signal.reason == resources_pb2.STOP_REASON_INTERNAL_ERROR
    assert "refuses the step" in signal.message
    assert MODEL_TEXT not in signal.message
    assert "refuses the step" in every_record.text
    assert_no_content(every_record, MODEL_TEXT, "tell me about herons")


async def test_a_refusal_quoting_the_row_is_written_without_it(
    backend: str,
    store_url: str,
    fake_model: FakeModelServer,
    every_record: pytest.LogCaptureFixture,
) -> None:
    if backend == "sqlite":
        pytest.skip("SQLite's refusals quote no row")
    app = await AgioApp.start(make_settings(store_url, fake_model.base_url))
    check = "ALTER TABLE steps ADD CONSTRAINT refuse_secrets CHECK (content NOT LIKE '%secret%')"
    await execute(store_url, [check])
    try:
        fake_model.enqueue(Turn.text(MODEL_TEXT))
        async with AgioClient(app.address) as client:
            ended = await client.run_to_end("tell me about herons")
    finally:
        await execute(store_url, ["ALTER TABLE steps DROP CONSTRAINT refuse_secrets"])
        await app.stop(grace=0)
    assert "violates check constraint" in ended.run.stop_signal.message
    assert MODEL_TEXT not in ended.run.stop_signal.message
    assert "Failing row contains" in every_record.text  # in an exception's text...
    handler = trace_log_handler(logging.StreamHandler(io.StringIO()))
    served = [handler.format(r) for r in every_record.records if handler.filter(r)]
    assert any("run stopped by a storage error" in line for line in served)
    assert not any(MODEL_TEXT in line for line in served)  # ...never in a line written
    assert not any(MODEL_TEXT in r.getMessage() for r in every_record.records)
