"""Trace context in from any client, content out only when asked, logs that carry the ids."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan

from agio_grpc.client import AgioClient
from agio_grpc.service.app import AgioApp
from agio_grpc.telemetry import Telemetry, TraceContextFilter
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at
from tests.telemetry.conftest import Traced, make_traced

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
PROMPT = "my secret prompt about zebra-quartz-91"
COMPLETION = "a private answer mentioning falcon-amber-27"
TOOL_TEXT = "tool-only text heron-slate-55"


async def test_a_raw_traceparent_puts_the_callers_trace_on_the_run_and_every_step(
    app: AgioApp, fake_model: FakeModelServer, traced: Traced
) -> None:
    # As a Go or TypeScript client would send it: plain W3C metadata, no OTel in the caller.
    traceparent = ("traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")
    fake_model.enqueue(
        Turn.tool_calls([ToolCallSpec("echo", '{"text": "hi"}')]), Turn.text("said hi")
    )
    async with AgioClient(app.address, metadata=[traceparent]) as client:
        result = await client.run_to_end("say hi")
        run = await client.get_run(result.run.id)
        steps = await client.list_steps(run.session_id)
    await traced.open_spans.all_ended()
    assert run.trace_id == CALLER_TRACE
    assert len(steps) == 4
    assert all(step.trace_id == CALLER_TRACE for step in steps)
    span_ids = {
        trace.format_span_id(span.context.span_id)
        for span in traced.spans()
        if span.context is not None
    }
    assert all(step.span_id in span_ids for step in steps)
    assert len({step.span_id for step in steps}) == 4  # user->run, 2x chat, tool
    server = next(s for s in traced.spans() if s.name == "agio.v1.AgentService/Run")
    assert server.parent is not None
    assert trace.format_span_id(server.parent.span_id) == CALLER_SPAN


async def test_with_tracing_off_runs_carry_the_callers_trace_id_or_none(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    # Nothing is recorded, but a run still joins its caller's trace by id (the client
    # conformance scenario checks this against servers with tracing off).
    settings = make_settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url)
    app = await AgioApp.start(settings, Telemetry())
    traceparent = ("traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")
    try:
        fake_model.enqueue(Turn.text("hello"), Turn.text("hello again"))
        async with AgioClient(app.address, metadata=[traceparent]) as client:
            joined = await client.get_run((await client.run_to_end("hi")).run.id)
            joined_steps = await client.list_steps(joined.session_id)
        async with AgioClient(app.address) as client:
            alone = await client.get_run((await client.run_to_end("hi")).run.id)
            alone_steps = await client.list_steps(alone.session_id)
    finally:
        await app.stop(grace=0)
    assert joined.trace_id == CALLER_TRACE
    assert [(step.trace_id, step.span_id) for step in joined_steps] == [
        (CALLER_TRACE, CALLER_SPAN)
    ] * 2
    assert alone.trace_id == ""
    assert [(step.trace_id, step.span_id) for step in alone_steps] == [("", "")] * 2


def _all_text(spans: list[ReadableSpan]) -> str:
    parts: list[str] = []
    for span in spans:
        parts.append(span.name)
        parts.extend(f"{k}={v!s}" for k, v in (span.attributes or {}).items())
        parts.append(span.status.description or "")
        for event in span.events:
            parts.append(event.name)
            parts.extend(f"{k}={v!s}" for k, v in (event.attributes or {}).items())
    return "\n".join(parts)


def _script(fake_model: FakeModelServer) -> None:
    fake_model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("echo", f'{{"text": "{TOOL_TEXT}"}}'),
                ToolCallSpec("explode", f'{{"message": "{TOOL_TEXT}"}}'),
            ]
        ),
        Turn.text(COMPLETION),
    )


@pytest.fixture
def captured_logs() -> Iterator[list[str]]:
    """Every log line at INFO and above, formatted as `agio-grpc serve` writes them."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect(logging.INFO)
    handler.addFilter(TraceContextFilter())
    handler.setFormatter(
        logging.Formatter(
            "%(levelname)s %(name)s trace_id=%(trace_id)s span_id=%(span_id)s %(message)s"
        )
    )
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield lines
    root.removeHandler(handler)
    root.setLevel(old_level)


async def test_with_content_capture_off_no_message_text_is_in_spans_or_logs(
    client: AgioClient, fake_model: FakeModelServer, traced: Traced, captured_logs: list[str]
) -> None:
    _script(fake_model)
    result = await client.run_to_end(PROMPT)
    assert result.text == COMPLETION
    await traced.open_spans.all_ended()
    exported = _all_text(traced.spans())
    assert "execute_tool explode" in exported  # the spans are there...
    for secret in (PROMPT, COMPLETION, TOOL_TEXT, "zebra", "falcon", "heron"):
        assert secret not in exported  # ...without the conversation
        assert not any(secret in line for line in captured_logs)
    assert "gen_ai.input.messages" not in exported
    # A log line written inside a tool call carries the run's trace and the call's span.
    explode = next(span for span in traced.spans() if span.name == "execute_tool explode")
    assert explode.context is not None
    line = next(line for line in captured_logs if "tool explode raised" in line)
    assert f"trace_id={result.run.trace_id}" in line
    assert f"span_id={trace.format_span_id(explode.context.span_id)}" in line
    assert line.endswith("tool explode raised RuntimeError")


async def test_with_content_capture_on_spans_carry_the_messages(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    traced = make_traced(capture_content=True)
    settings = make_settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url)
    app = await AgioApp.start(settings, traced.telemetry)
    try:
        _script(fake_model)
        async with AgioClient(app.address) as client:
            await client.run_to_end(PROMPT)
    finally:
        await app.stop(grace=0)
    spans = {span.name: span for span in traced.spans()}
    chats = [s for s in traced.spans() if s.name == "chat fake-model"]
    assert PROMPT in str((chats[0].attributes or {})["gen_ai.input.messages"])
    assert COMPLETION in str((chats[1].attributes or {})["gen_ai.output.messages"])
    echo = spans["execute_tool echo"].attributes or {}
    assert TOOL_TEXT in str(echo["gen_ai.tool.call.arguments"])
    assert echo["gen_ai.tool.call.result"] == TOOL_TEXT
    traced.tracer_provider.shutdown()
