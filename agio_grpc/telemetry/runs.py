"""The engine's `RunTracer` on OpenTelemetry: GenAI spans and metrics for runs, model and tools.

    invoke_agent {agent}          INTERNAL, child of the caller's current span (the gRPC span)
      chat {model}                CLIENT, one per model call
      execute_tool {tool}         INTERNAL, one per server tool call

Attribute names come from the semantic-conventions package (`gen_ai.*`, `error.type`,
`server.*`) and `attributes.py` (`agio.*`). Message content (prompts, completions, tool
arguments and results) goes in spans only when `capture_content` is set; otherwise no span,
status message or event carries it. Every span ends on every path: a context manager ends
the call spans, `end` (idempotent) the run span.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.attributes import mcp_attributes as mcp
from opentelemetry.semconv._incubating.attributes import server_attributes as server
from opentelemetry.semconv.attributes import error_attributes, network_attributes
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from agio_grpc.domain import ApprovalDecision, Role, Run, ToolCall
from agio_grpc.engine.agents import RunSettings
from agio_grpc.engine.approvals import SERVER_DECIDER
from agio_grpc.engine.control import StopRequested
from agio_grpc.engine.models import ModelError, ModelReply, ModelRequest
from agio_grpc.engine.output import CheckedAnswer
from agio_grpc.engine.tools import ToolOrigin, ToolResult
from agio_grpc.telemetry import attributes as agio
from agio_grpc.telemetry.instruments import INSTRUMENTATION_NAME, Instruments
from agio_grpc.telemetry.logs import with_log_tenant
from agio_grpc.telemetry.setup import Telemetry

_INVOKE_AGENT = gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value
_CHAT = gen_ai.GenAiOperationNameValues.CHAT.value
_EXECUTE_TOOL = gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value
_STOPS = (asyncio.CancelledError, StopRequested)


def _hex_ids(span: Span) -> tuple[str, str]:
    context = span.get_span_context()
    if not context.is_valid:
        return "", ""
    return trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)


class _CallSpan:
    """A model or tool call span; records what the engine reports about it."""

    def __init__(self, span: Span, run: OtelRunTrace) -> None:
        self.span = span
        self.run = run
        self.trace_id, self.span_id = _hex_ids(span)
        self.started = time.perf_counter()

    def replied(self, reply: ModelReply) -> None:
        self.run.tracer.model_replied(self, reply)

    def finished(self, result: ToolResult) -> None:
        self.run.tracer.tool_finished(self, result)

    def approved(self, decision: ApprovalDecision, waited_s: float) -> None:
        self.run.tracer.approval_decided(self.span, decision, waited_s, agent=self.run.agent)


class OtelRunTrace:
    """One run segment's `invoke_agent` span and its children."""

    def __init__(self, tracer: OtelRunTracer, span: Span, run: Run, settings: RunSettings) -> None:
        self.tracer = tracer
        self.span = span
        self.run_id = run.id
        self.session_id = run.session_id
        self.settings = settings
        self.agent = run.agent
        self.trace_id, self.span_id = _hex_ids(span)
        self.parent = trace.set_span_in_context(span)
        # The loop's log lines name the run's tenant, whatever task it runs in.
        self.active = with_log_tenant(run.tenant, self.parent)
        self.ended = False
        self._first_step = True

    def _common(self) -> dict[str, AttributeValue]:
        return {
            gen_ai.GEN_AI_PROVIDER_NAME: self.tracer.provider,
            gen_ai.GEN_AI_CONVERSATION_ID: self.session_id,
            agio.RUN_ID: self.run_id,
            agio.SESSION_ID: self.session_id,
        }

    @contextmanager
    def activate(self) -> Iterator[None]:
        token = otel_context.attach(self.active)
        try:
            yield
        finally:
            otel_context.detach(token)

    @contextmanager
    def model_call(self, request: ModelRequest, step_id: str, sequence: int) -> Iterator[_CallSpan]:
        attributes = self._common() | {
            gen_ai.GEN_AI_OPERATION_NAME: _CHAT,
            gen_ai.GEN_AI_REQUEST_MODEL: request.model,
            agio.STEP_ID: step_id,
            agio.STEP_SEQUENCE: sequence,
            **self.tracer.server_attributes,
        }
        if request.temperature is not None:
            attributes[gen_ai.GEN_AI_REQUEST_TEMPERATURE] = request.temperature
        if request.max_tokens is not None:
            attributes[gen_ai.GEN_AI_REQUEST_MAX_TOKENS] = request.max_tokens
        if request.output_type == "json":
            attributes[gen_ai.GEN_AI_OUTPUT_TYPE] = gen_ai.GenAiOutputTypeValues.JSON.value
        if self.tracer.capture_content:
            attributes.update(_input_messages(request))
        span = self.tracer.tracer.start_span(
            f"{_CHAT} {request.model}", self.parent, SpanKind.CLIENT, attributes
        )
        call = _CallSpan(span, self)
        with _ending(span, call, self.tracer.call_failed):
            yield call

    @contextmanager
    def tool_call(self, call: ToolCall, step_id: str, sequence: int) -> Iterator[_CallSpan]:
        attributes = self._common() | {
            gen_ai.GEN_AI_OPERATION_NAME: _EXECUTE_TOOL,
            gen_ai.GEN_AI_TOOL_NAME: call.name,
            gen_ai.GEN_AI_TOOL_CALL_ID: call.id,
            gen_ai.GEN_AI_TOOL_TYPE: "function",
            agio.STEP_ID: step_id,
            agio.STEP_SEQUENCE: sequence,
        }
        if self.tracer.capture_content:
            attributes[gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS] = call.arguments
        span = self.tracer.tracer.start_span(
            f"{_EXECUTE_TOOL} {call.name}", self.parent, SpanKind.INTERNAL, attributes
        )
        traced = _CallSpan(span, self)
        with _ending(span, traced, self.tracer.call_failed):
            yield traced

    def step_stored(self, step_id: str, sequence: int) -> None:
        if self.ended:
            return
        if self._first_step:
            self._first_step = False
            self.span.set_attributes({agio.STEP_ID: step_id, agio.STEP_SEQUENCE: sequence})
        self.span.add_event("step_stored", {agio.STEP_ID: step_id, agio.STEP_SEQUENCE: sequence})

    def history_loaded(self, kept_steps: int, read_steps: int) -> None:
        if not self.ended:
            self.span.set_attributes(
                {agio.HISTORY_KEPT_STEPS: kept_steps, agio.HISTORY_READ_STEPS: read_steps}
            )

    def context_built(self, seconds: float, message_count: int) -> None:
        self.tracer.instruments.context_build_duration.record(
            seconds, {gen_ai.GEN_AI_AGENT_NAME: self.agent}
        )

    def rejected(self, call: ToolCall, decision: ApprovalDecision, waited_s: float) -> None:
        if not self.ended:
            self.tracer.approval_decided(
                self.span, decision, waited_s, agent=self.agent, tool=call.name
            )

    def compacted(self, trigger: str, tokens_before: int, tokens_after: int) -> None:
        self.tracer.compacted(trigger, tokens_before, tokens_after, agent=self.agent)
        if self.span.is_recording():
            self.span.add_event(
                "context_compacted",
                {
                    agio.COMPACTION_TRIGGER: trigger,
                    agio.COMPACTION_TOKENS_BEFORE: tokens_before,
                    agio.COMPACTION_TOKENS_AFTER: tokens_after,
                },
            )

    def output_invalid(self, checked: CheckedAnswer, repairs: int) -> None:
        self.tracer.instruments.output_invalid.add(1, {gen_ai.GEN_AI_AGENT_NAME: self.agent})
        if self.span.is_recording():
            # The errors' messages quote the answer: content, kept out unless captured.
            errors = checked.errors if self.tracer.capture_content else checked.failed_checks
            self.span.add_event(
                "output_invalid", {agio.OUTPUT_ERRORS: list(errors), agio.OUTPUT_REPAIRS: repairs}
            )

    def end(self, run: Run) -> None:
        if self.ended:
            return
        self.ended = True
        self.tracer.run_ended(self, run)


@contextmanager
def _ending(
    span: Span, call: _CallSpan, failed: Callable[[_CallSpan, BaseException], None]
) -> Iterator[None]:
    """Make `span` current inside (libraries and log lines join it) and end it on every
    path; a stop marks it cancelled, an exception marks it failed."""
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    except _STOPS:
        span.set_attribute(agio.CANCELLED, True)
        raise
    except BaseException as error:
        failed(call, error)
        raise
    finally:
        otel_context.detach(token)
        span.end()


class OtelRunTracer:
    """`RunTracer` recording with a `Telemetry`'s providers."""

    def __init__(self, telemetry: Telemetry, *, provider: str, base_url: str = "") -> None:
        """`provider` is the `gen_ai.provider.name` of the model endpoint at `base_url`."""
        self.tracer = telemetry.tracer_provider.get_tracer(INSTRUMENTATION_NAME)
        self.instruments = Instruments.create(telemetry.meter_provider)
        self.capture_content = telemetry.capture_content
        self.provider = provider
        self.server_attributes: dict[str, AttributeValue] = {}
        parsed = urlparse(base_url)
        if parsed.hostname:
            self.server_attributes[server.SERVER_ADDRESS] = parsed.hostname
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
            self.server_attributes[server.SERVER_PORT] = port

    def start_run(self, run: Run, settings: RunSettings, operation: str) -> OtelRunTrace:
        attributes: dict[str, AttributeValue] = {
            gen_ai.GEN_AI_OPERATION_NAME: _INVOKE_AGENT,
            gen_ai.GEN_AI_PROVIDER_NAME: self.provider,
            gen_ai.GEN_AI_AGENT_NAME: run.agent,
            gen_ai.GEN_AI_CONVERSATION_ID: run.session_id,
            gen_ai.GEN_AI_REQUEST_MODEL: settings.model,
            agio.RUN_ID: run.id,
            agio.SESSION_ID: run.session_id,
            agio.RUN_OPERATION: operation,
            agio.TENANT: run.tenant,
        }
        if self.capture_content and settings.instructions:
            attributes[gen_ai.GEN_AI_SYSTEM_INSTRUCTIONS] = json.dumps(
                [{"type": "text", "content": settings.instructions}]
            )
        span = self.tracer.start_span(
            f"{_INVOKE_AGENT} {run.agent}", kind=SpanKind.INTERNAL, attributes=attributes
        )
        self.instruments.runs_active.add(1, {gen_ai.GEN_AI_AGENT_NAME: run.agent})
        if operation == "retry":
            self.instruments.retries.add(1, {gen_ai.GEN_AI_AGENT_NAME: run.agent})
        return OtelRunTrace(self, span, run, settings)

    def outside_run(self, run: Run, settings: RunSettings) -> OtelRunTrace:
        # The caller's span stands in for a run's: marked ended, so nothing here ends it.
        outside = OtelRunTrace(self, trace.get_current_span(), run, settings)
        outside.ended = True
        return outside

    def compacted(self, trigger: str, tokens_before: int, tokens_after: int, *, agent: str) -> None:
        """Record a compaction's metrics (a run's, or CompactSession's)."""
        common = {agio.COMPACTION_TRIGGER: trigger, gen_ai.GEN_AI_AGENT_NAME: agent}
        self.instruments.compactions.add(1, common)
        self.instruments.compaction_tokens.record(
            tokens_before, {**common, agio.COMPACTION_STAGE: "before"}
        )
        self.instruments.compaction_tokens.record(
            tokens_after, {**common, agio.COMPACTION_STAGE: "after"}
        )

    def approval_decided(
        self,
        span: Span,
        decision: ApprovalDecision,
        waited_s: float,
        *,
        agent: str,
        tool: str = "",
    ) -> None:
        """The `agio.approval` event on `span` and the wait in `agio.approval.wait.duration`."""
        if decision.approved:
            outcome = "approved"
        else:
            outcome = "timed_out" if decision.decided_by == SERVER_DECIDER else "rejected"
        self.instruments.approval_wait.record(
            waited_s, {gen_ai.GEN_AI_AGENT_NAME: agent, agio.APPROVAL_OUTCOME: outcome}
        )
        if span.is_recording():
            attributes: dict[str, AttributeValue] = {
                agio.APPROVAL_APPROVED: decision.approved,
                agio.APPROVAL_OUTCOME: outcome,
                agio.APPROVAL_WAIT_S: waited_s,
                agio.APPROVAL_DECIDED_BY: decision.decided_by,
            }
            if tool:
                attributes[gen_ai.GEN_AI_TOOL_NAME] = tool
            span.add_event(agio.APPROVAL_EVENT, attributes)

    def run_ended(self, trace_: OtelRunTrace, run: Run) -> None:
        span = trace_.span
        agent = {gen_ai.GEN_AI_AGENT_NAME: run.agent}
        self.instruments.runs_active.add(-1, agent)
        signal = run.stop_signal
        if signal is None:  # failed before its loop started (e.g. the store refused a write)
            span.set_status(Status(StatusCode.ERROR, "the run did not start"))
            span.set_attribute(error_attributes.ERROR_TYPE, "run_not_started")
            span.end()
            return
        span.set_attributes(
            {
                agio.STOP_REASON: signal.reason.value,
                agio.STOP_SOURCE: signal.source,
                agio.STOP_RETRYABLE: signal.retryable,
                agio.RUN_STATUS: run.status.value,
                agio.RUN_STEP_COUNT: run.step_count,
                gen_ai.GEN_AI_USAGE_INPUT_TOKENS: run.usage.input_tokens,
                gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: run.usage.output_tokens,
            }
        )
        if signal.reason.is_error:
            span.set_attribute(error_attributes.ERROR_TYPE, signal.reason.value)
            # The stop message is the engine's own wording or, for a model error, the provider's
            # account of the failure, redacted of credentials where the adapter read it.
            span.set_status(Status(StatusCode.ERROR, signal.message))
        self.instruments.runs_ended.add(
            1, agent | {agio.STOP_REASON: signal.reason.value, agio.RUN_STATUS: run.status.value}
        )
        span.end()

    def model_replied(self, call: _CallSpan, reply: ModelReply) -> None:
        metrics = reply.metrics
        span = call.span
        attributes: dict[str, AttributeValue] = {
            gen_ai.GEN_AI_RESPONSE_MODEL: metrics.model_name,
            gen_ai.GEN_AI_RESPONSE_FINISH_REASONS: [reply.finish_reason],
            gen_ai.GEN_AI_USAGE_INPUT_TOKENS: metrics.input_tokens,
            gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: metrics.output_tokens,
            gen_ai.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: metrics.first_token_latency_ms / 1000,
            agio.MODEL_RETRIES: metrics.retries,
        }
        if reply.response_id:
            attributes[gen_ai.GEN_AI_RESPONSE_ID] = reply.response_id
        if metrics.cached_input_tokens:
            attributes[gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = metrics.cached_input_tokens
        if metrics.reasoning_tokens:
            attributes[gen_ai.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] = metrics.reasoning_tokens
        if self.capture_content:
            attributes[gen_ai.GEN_AI_OUTPUT_MESSAGES] = _output_messages(reply)
        span.set_attributes(attributes)
        common = self._metric_attributes(call, _CHAT)
        common[gen_ai.GEN_AI_RESPONSE_MODEL] = metrics.model_name
        instruments = self.instruments
        instruments.operation_duration.record(time.perf_counter() - call.started, common)
        if metrics.first_token_latency_ms:
            instruments.time_to_first_chunk.record(metrics.first_token_latency_ms / 1000, common)
        for kind, count in (("input", metrics.input_tokens), ("output", metrics.output_tokens)):
            instruments.token_usage.record(count, common | {gen_ai.GEN_AI_TOKEN_TYPE: kind})
        if metrics.retries:
            instruments.model_retries.add(metrics.retries, common)

    def tool_finished(self, call: _CallSpan, result: ToolResult) -> None:
        span = call.span
        outcome: dict[str, AttributeValue] = {gen_ai.GEN_AI_TOOL_NAME: result.call.name}
        if result.is_error:
            outcome[error_attributes.ERROR_TYPE] = "tool_error"
            # The error text may quote arguments: it goes in the span only with content on.
            span.set_status(Status(StatusCode.ERROR, "the tool call returned an error result"))
        if result.stop is not None:
            span.set_attribute(agio.TOOL_STOP, True)
        if result.origin is not None:
            span.set_attributes(_mcp_attributes(result.origin))
        if self.capture_content:
            span.set_attribute(gen_ai.GEN_AI_TOOL_CALL_RESULT, result.content)
        span.set_attributes(outcome)
        self.instruments.tool_duration.record(time.perf_counter() - call.started, outcome)

    def call_failed(self, call: _CallSpan, error: BaseException) -> None:
        span = call.span
        if isinstance(error, ModelError):
            # The HTTP status ("429"), else the code of an error sent in the stream.
            error_type = (
                str(error.status_code)
                if error.status_code is not None
                else error.error_code or type(error).__name__
            )
            description = "the model call failed" + (" (retryable)" if error.retryable else "")
            if error.error_code is not None:
                span.set_attribute(agio.MODEL_ERROR_CODE, error.error_code)
            self.instruments.operation_duration.record(
                time.perf_counter() - call.started,
                self._metric_attributes(call, _CHAT) | {error_attributes.ERROR_TYPE: error_type},
            )
        else:
            error_type = type(error).__qualname__
            description = f"{error_type} (see the server log)"
        span.set_attribute(error_attributes.ERROR_TYPE, error_type)
        # Exception messages can quote provider or tool output: recorded with content only.
        if self.capture_content:
            span.record_exception(error)
        else:
            span.add_event("exception", {"exception.type": type(error).__qualname__})
        span.set_status(Status(StatusCode.ERROR, description))

    def _metric_attributes(self, call: _CallSpan, operation: str) -> dict[str, AttributeValue]:
        return {
            gen_ai.GEN_AI_OPERATION_NAME: operation,
            gen_ai.GEN_AI_PROVIDER_NAME: self.provider,
            gen_ai.GEN_AI_REQUEST_MODEL: call.run.settings.model,
            **self.server_attributes,
        }


def _input_messages(request: ModelRequest) -> Mapping[str, AttributeValue]:
    system = [m for m in request.messages if m.get("role") == "system"]
    others = [m for m in request.messages if m.get("role") != "system"]
    attributes: dict[str, AttributeValue] = {
        gen_ai.GEN_AI_INPUT_MESSAGES: json.dumps([_message(m) for m in others])
    }
    if system:
        attributes[gen_ai.GEN_AI_SYSTEM_INSTRUCTIONS] = json.dumps(
            [{"type": "text", "content": m.get("content") or ""} for m in system]
        )
    return attributes


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message in the GenAI conventions' message shape."""
    parts: list[dict[str, Any]] = []
    if message.get("role") == Role.TOOL.value:
        parts.append(
            {
                "type": "tool_call_response",
                "id": message.get("tool_call_id", ""),
                "response": message.get("content") or "",
            }
        )
    elif message.get("content"):
        parts.append({"type": "text", "content": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        parts.append(
            {
                "type": "tool_call",
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "arguments": function.get("arguments", ""),
            }
        )
    return {"role": message.get("role", ""), "parts": parts}


def _output_messages(reply: ModelReply) -> str:
    message = _message(
        {
            "role": "assistant",
            "content": reply.content,
            "tool_calls": [call.to_openai() for call in reply.tool_calls],
        }
    )
    message["finish_reason"] = reply.finish_reason
    return json.dumps([message])


_NETWORK_TRANSPORTS = {"stdio": "pipe", "streamable-http": "tcp"}


def _mcp_attributes(origin: ToolOrigin) -> dict[str, AttributeValue]:
    """An MCP tool call's attributes (the MCP semantic conventions, and agio.mcp.*)."""
    attributes: dict[str, AttributeValue] = {
        mcp.MCP_METHOD_NAME: "tools/call",
        network_attributes.NETWORK_TRANSPORT: _NETWORK_TRANSPORTS.get(origin.transport, "tcp"),
        agio.MCP_SERVER: origin.server,
        agio.MCP_TOOL: origin.remote_name,
    }
    if origin.session_id:
        attributes[mcp.MCP_SESSION_ID] = origin.session_id
    if origin.protocol_version:
        attributes[mcp.MCP_PROTOCOL_VERSION] = origin.protocol_version
    return attributes
