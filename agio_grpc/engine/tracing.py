"""What the engine tells a tracer: a run segment started, a model call, a tool call, the end.

The engine says *what happened* with its own types (Run, ModelRequest, ModelReply,
ToolResult); an implementation (`agio_grpc.telemetry`) decides how that becomes spans,
attributes and metrics. Each handle exposes the hex `trace_id` and `span_id` of its span so
the loop can store them on the step that span produced. Parents are explicit (a model or
tool call is a child of its run's handle), so nothing depends on which asyncio task or
context the loop runs in. `NO_TRACER` does nothing and is the default.

Never imports OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Protocol

from agio_grpc.domain import ApprovalDecision, Run, ToolCall
from agio_grpc.engine.agents import RunSettings
from agio_grpc.engine.models import ModelReply, ModelRequest
from agio_grpc.engine.output import CheckedAnswer
from agio_grpc.engine.tools import ToolResult


class SpanIds(Protocol):
    """The ids a stored step keeps of the span that produced it ("" when not traced)."""

    @property
    def trace_id(self) -> str: ...

    @property
    def span_id(self) -> str: ...


class ModelCallTrace(SpanIds, Protocol):
    """One model call. An exception leaving its context marks it failed (or cancelled)."""

    def replied(self, reply: ModelReply) -> None:
        """The call returned a complete reply."""
        ...


class ToolCallTrace(SpanIds, Protocol):
    """One server tool call. An exception leaving its context marks it cancelled."""

    def finished(self, result: ToolResult) -> None:
        """The call produced a result (maybe an error result)."""
        ...

    def approved(self, decision: ApprovalDecision, waited_s: float) -> None:
        """The call runs because it was approved, `waited_s` after its run began to wait."""
        ...


class RunTrace(SpanIds, Protocol):
    """One run segment: the parent of its model and tool calls."""

    def activate(self) -> AbstractContextManager[None]:
        """Make the segment the current trace context of the code inside (the loop's task),
        so tools' own instrumentation and log lines join it."""
        ...

    def model_call(
        self, request: ModelRequest, step_id: str, sequence: int
    ) -> AbstractContextManager[ModelCallTrace]:
        """Trace a model call that will produce step `step_id` at `sequence`."""
        ...

    def tool_call(
        self, call: ToolCall, step_id: str, sequence: int
    ) -> AbstractContextManager[ToolCallTrace]:
        """Trace a tool call that will produce step `step_id` at `sequence`."""
        ...

    def step_stored(self, step_id: str, sequence: int) -> None:
        """A step of the segment's own (user input, tool outputs) was stored."""
        ...

    def history_loaded(self, kept_steps: int, read_steps: int) -> None:
        """The segment's history: `kept_steps` from what this process kept of the session
        (engine/history.py), then `read_steps` read from the store."""
        ...

    def context_built(self, seconds: float, message_count: int) -> None:
        """The messages for the next model call were built in `seconds`."""
        ...

    def rejected(self, call: ToolCall, decision: ApprovalDecision, waited_s: float) -> None:
        """A call that waited for approval was rejected (the segment stores its result)."""
        ...

    def compacted(self, trigger: str, tokens_before: int, tokens_after: int) -> None:
        """A compaction stored its summary step (engine/compaction.py; the summary call was
        traced by `model_call`): what set it off, the prompt estimates before and after."""
        ...

    def output_invalid(self, checked: CheckedAnswer, repairs: int) -> None:
        """A final answer failed its output schema (`repairs` asked for before it)."""
        ...

    def end(self, run: Run) -> None:
        """The segment ended with `run.stop_signal`. Idempotent; no call after it."""
        ...


class RunTracer(Protocol):
    """Starts a trace for each run segment."""

    def start_run(self, run: Run, settings: RunSettings, operation: str) -> RunTrace:
        """A segment of `run` starts, from the caller's current trace context.

        `operation` names what started it: `run`, `submit_tool_outputs` or `retry`.
        """
        ...

    def outside_run(self, run: Run, settings: RunSettings) -> RunTrace:
        """A trace for model calls made for a session outside any run (CompactSession):
        its calls are children of the caller's current span, which it never ends; `run`
        names the session, agent and tenant (its id is not a stored run's)."""
        ...


class _NoSpan:
    trace_id = ""
    span_id = ""

    def replied(self, reply: ModelReply) -> None:
        pass

    def finished(self, result: ToolResult) -> None:
        pass

    def approved(self, decision: ApprovalDecision, waited_s: float) -> None:
        pass


class _NoRunTrace(_NoSpan):
    def activate(self) -> AbstractContextManager[None]:
        return nullcontext()

    @contextmanager
    def model_call(self, request: ModelRequest, step_id: str, sequence: int) -> Iterator[_NoSpan]:
        yield NO_CALL_TRACE

    @contextmanager
    def tool_call(self, call: ToolCall, step_id: str, sequence: int) -> Iterator[_NoSpan]:
        yield NO_CALL_TRACE

    def step_stored(self, step_id: str, sequence: int) -> None:
        pass

    def history_loaded(self, kept_steps: int, read_steps: int) -> None:
        pass

    def context_built(self, seconds: float, message_count: int) -> None:
        pass

    def rejected(self, call: ToolCall, decision: ApprovalDecision, waited_s: float) -> None:
        pass

    def compacted(self, trigger: str, tokens_before: int, tokens_after: int) -> None:
        pass

    def output_invalid(self, checked: CheckedAnswer, repairs: int) -> None:
        pass

    def end(self, run: Run) -> None:
        pass


class _NoTracer:
    def start_run(self, run: Run, settings: RunSettings, operation: str) -> RunTrace:
        return NO_RUN_TRACE

    def outside_run(self, run: Run, settings: RunSettings) -> RunTrace:
        return NO_RUN_TRACE


NO_CALL_TRACE = _NoSpan()
"""A model or tool call trace that records nothing."""
NO_RUN_TRACE: RunTrace = _NoRunTrace()
"""A run trace that records nothing."""
NO_TRACER: RunTracer = _NoTracer()
"""A tracer that records nothing."""
