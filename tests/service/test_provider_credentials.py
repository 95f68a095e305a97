"""A provider that echoes the request's credentials in its errors, over the real server on
SQLite and PostgreSQL with tracing on: neither the configured key nor the bearer token
reaches the client's stop signal, the stored run, the journal's replay, the spans or the
log records, while the HTTP status and the provider's code do; the same for a summary call
that fails (its COMPACTION_FAILED notice) and for CompactSession's status."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf import text_format
from google.protobuf.message import Message
from opentelemetry.sdk.trace import ReadableSpan

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.config import AgentConfig, CompactionConfig
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.v1 import events_pb2, resources_pb2
from tests.service.conftest import make_settings
from tests.telemetry.conftest import Traced, make_traced

KEY = "proxy-key/7c1e0b5f2a9d"
"""The configured OPENAI_API_KEY: of no known shape, so only its value can find it."""
BEARER = "sk-proj-Zq3vN8xR2mK7pL4tW9yB6cD1fH5jG0sA"
ECHO = f"Incorrect API key provided: Bearer {BEARER}. Key on record: {KEY}."
REDACTED_ECHO = "Incorrect API key provided: Bearer [REDACTED]. Key on record: [REDACTED]."
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa "


def assert_no_credentials(text: str) -> None:
    assert KEY not in text
    assert BEARER not in text
    assert "7c1e0b5f" not in text
    assert "Zq3vN8xR" not in text


def text_of(messages: list[Message]) -> str:
    """The messages as text, and as their wire bytes decoded: what any client reads."""
    return "\n".join(
        text_format.MessageToString(m, as_utf8=True)
        + m.SerializeToString().decode(errors="replace")
        for m in messages
    )


def span_text(spans: list[ReadableSpan]) -> str:
    parts: list[str] = []
    for span in spans:
        parts.append(span.name)
        parts.extend(f"{k}={v!s}" for k, v in (span.attributes or {}).items())
        parts.append(span.status.description or "")
        for event in span.events:
            parts.append(event.name)
            parts.extend(f"{k}={v!s}" for k, v in (event.attributes or {}).items())
    return "\n".join(parts)


@pytest.fixture
def logged() -> Iterator[list[str]]:
    """Every log record of every logger, DEBUG included, formatted with its exception's
    message and traceback (as with content capture on: the most any line could hold)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield lines
    root.removeHandler(handler)
    root.setLevel(old_level)


@dataclass
class Served:
    client: AgioClient
    traced: Traced


@pytest.fixture(params=[False, True], ids=["content-off", "content-on"])
async def served(
    request: pytest.FixtureRequest, store_url: str, fake_model: FakeModelServer
) -> AsyncIterator[Served]:
    """The server with `KEY` configured, its one agent compacting above 500 of 1,000 tokens;
    tracing on, with content capture off and on (a failed call's exception is then recorded
    on its span, message and all)."""
    agent = AgentConfig(
        name="assistant",
        model="fake-model",
        instructions="You are a test assistant.",
        tools=["calculate"],
        context_window_tokens=1_000,
        compaction=CompactionConfig(trigger_ratio=0.5, keep_recent_steps=2),
    )
    settings = make_settings(store_url, fake_model.base_url, openai_api_key=KEY, agents=[agent])
    traced = make_traced(capture_content=request.param)
    app = await AgioApp.start(settings, traced.telemetry)
    try:
        async with AgioClient(app.address) as client:
            yield Served(client, traced)
    finally:
        await app.stop(grace=0)
        traced.tracer_provider.shutdown()


async def drain(events: AsyncIterator[events_pb2.StepEvent]) -> list[events_pb2.StepEvent]:
    return [event async for event in events]


async def test_a_refused_key_echoed_by_the_provider_is_redacted_everywhere_it_goes(
    served: Served, fake_model: FakeModelServer, logged: list[str]
) -> None:
    client, traced = served.client, served.traced
    fake_model.enqueue(Turn.error(429, retry_after=0, message=ECHO), Turn.error(401, message=ECHO))
    live = await drain(client.run("hello"))

    terminal = live[-1].run_failed.run
    signal = terminal.stop_signal
    assert signal.reason == resources_pb2.STOP_REASON_MODEL_ERROR
    assert signal.message == f"HTTP 401: {REDACTED_ECHO}"
    assert dict(signal.context) == {
        "status_code": 401,
        "error_code": "invalid_api_key",
        "retries": 1,
    }
    (retry,) = [event.error for event in live if event.HasField("error")]
    assert retry.reason == "MODEL_RETRY"
    assert retry.message == f"retry 1 in 0.0s: HTTP 429: {REDACTED_ECHO}"

    stored = await client.get_run(terminal.id)
    assert stored.stop_signal.message == signal.message
    assert stored.stop_signal.context["status_code"] == 401
    replay = await drain(client.watch_run(terminal.id))
    assert [e.WhichOneof("event") for e in replay] == [e.WhichOneof("event") for e in live]
    assert [e.error for e in replay if e.HasField("error")] == [retry]
    assert replay[-1].run_failed.run.stop_signal.message == signal.message
    steps = await client.list_steps(terminal.session_id)
    for seen in (live, [stored], replay, steps):
        assert_no_credentials(text_of(list(seen)))

    await traced.open_spans.all_ended()
    spans = span_text(traced.spans())
    assert_no_credentials(spans)
    chat = next(s for s in traced.spans() if s.name == "chat fake-model")
    assert (chat.attributes or {})["error.type"] == "401"
    assert (chat.attributes or {})["agio.model.error_code"] == "invalid_api_key"
    run_span = next(s for s in traced.spans() if s.name == "invoke_agent assistant")
    assert run_span.status.description == signal.message

    assert_no_credentials("\n".join(logged))
    assert (
        "WARNING agio_grpc.engine.models.openai_chat model call failed: "
        "HTTP 401, code invalid_api_key, not retryable, after 1 retry"
    ) in logged


async def test_a_failed_summary_call_reports_compaction_failed_without_the_credentials(
    served: Served, fake_model: FakeModelServer, logged: list[str]
) -> None:
    client = served.client
    first = await client.run_to_end(WORDS * 10)
    await client.run_to_end(WORDS * 10, session_id=first.session_id)  # under 500 tokens
    fake_model.enqueue(Turn.error(401, message=ECHO))  # the summary call, before the model's
    live = await drain(client.run(WORDS * 20, session_id=first.session_id))  # past them

    assert live[-1].HasField("run_completed")  # the run goes on uncompacted
    (notice,) = [event.error for event in live if event.HasField("error")]
    assert (notice.reason, notice.message) == ("COMPACTION_FAILED", f"HTTP 401: {REDACTED_ECHO}")
    replay = await drain(client.watch_run(live[-1].run_completed.run.id))
    assert [event.error for event in replay if event.HasField("error")] == [notice]
    assert_no_credentials(text_of([*live, *replay]))
    await served.traced.open_spans.all_ended()
    assert_no_credentials(span_text(served.traced.spans()))
    assert_no_credentials("\n".join(logged))


async def test_compact_session_fails_with_the_status_and_code_and_without_the_credentials(
    served: Served, fake_model: FakeModelServer, logged: list[str]
) -> None:
    client = served.client
    first = await client.run_to_end(WORDS * 4)
    await client.run_to_end(WORDS * 4, session_id=first.session_id)
    fake_model.enqueue(Turn.error(401, message=ECHO))
    with pytest.raises(AgioError) as refused:
        await client.compact_session(first.session_id, keep_recent_steps=2)
    error = refused.value
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "COMPACTION_FAILED")
    assert error.message == f"the summary call failed: HTTP 401: {REDACTED_ECHO}"
    assert error.metadata == {"statusCode": "401", "errorCode": "invalid_api_key"}
    await served.traced.open_spans.all_ended()
    assert_no_credentials(span_text(served.traced.spans()))
    assert_no_credentials("\n".join(logged))
