"""`ModelCall`: one traced model call that produces an assistant step, and `model_request`,
the request for the next call on a history.

(Sending a new session's first call ahead of its start transaction was measured and
dropped: it made B1 slower, +0.4 ms, since the start's SQLite transaction runs in a thread
that waits for the GIL while the call is being sent.)

Never imports grpc, SQLAlchemy or OpenTelemetry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from agio_grpc.domain import Step, StopReason, StopSignal
from agio_grpc.engine.agents import RunSettings
from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.context import build_context
from agio_grpc.engine.events import ErrorNotice, StepDelta
from agio_grpc.engine.models import (
    ModelDelta,
    ModelDriver,
    ModelError,
    ModelEvent,
    ModelListener,
    ModelReply,
    ModelRequest,
    ModelRetry,
)
from agio_grpc.engine.output import RequestShape, request_shape
from agio_grpc.engine.tools import ToolRegistry
from agio_grpc.engine.tracing import RunTrace


def model_request(
    settings: RunSettings, registry: ToolRegistry, history: list[Step], trace: RunTrace
) -> ModelRequest:
    """The request for the next model call on `history` (its context build is traced)."""
    building = time.perf_counter()
    messages = build_context(settings.instructions, history, settings.limits.max_history_messages)
    trace.context_built(time.perf_counter() - building, len(messages))
    client_tools = [tool.to_openai() for tool in settings.client_tools]
    shape = request_shape(settings.output) if settings.output else RequestShape()
    if shape.system_note:
        at = 1 if messages and messages[0].get("role") == "system" else 0
        messages.insert(at, {"role": "system", "content": shape.system_note})
    return ModelRequest(
        model=settings.model,
        messages=messages,
        tools=registry.definitions(settings.tools) + client_tools + list(shape.tools),
        temperature=settings.temperature,
        max_tokens=settings.max_tokens,
        max_reply_bytes=settings.limits.max_step_bytes,
        response_format=shape.response_format,
        tool_choice=shape.tool_choice,
        output_type="text" if settings.output is None else "json",
    )


@dataclass(frozen=True, slots=True)
class CallReply:
    """What a model call produced: the reply and the ids of its `chat` span."""

    reply: ModelReply
    trace_id: str
    span_id: str


class ModelCall:
    """A model call for step `step_id` at `sequence`, traced as a child of `trace`."""

    def __init__(
        self,
        model: ModelDriver,
        trace: RunTrace,
        request: ModelRequest,
        step_id: str,
        sequence: int,
    ) -> None:
        self.request = request
        self.step_id = step_id
        self._model = model
        self._trace = trace
        self._sequence = sequence

    async def reply(self, listener: ModelListener) -> CallReply:
        """The call's reply, its events passed to `listener`; raises what the model driver
        raises (ModelError)."""
        with self._trace.model_call(self.request, self.step_id, self._sequence) as span:
            reply = await self._model.complete(self.request, listener)
            span.replied(reply)
        return CallReply(reply, span.trace_id, span.span_id)


def streamed_to(channel: RunChannel, step_id: str) -> ModelListener:
    """What a model call tells the run's channel as it goes: each delta of step `step_id`,
    and notices of a retry or of a broken stream starting over (whose deltas are void).
    It answers a delta with whether a subscriber has taken an event past the call's first
    delta: that one is out, and the driver need not yield after each delta any more."""
    first_delta_seq = 0  # the seq of the call's first delta, once published

    def on_event(event: ModelEvent) -> bool:
        nonlocal first_delta_seq
        if isinstance(event, ModelDelta):
            published = channel.publish(
                StepDelta(
                    step_id=step_id,
                    content=event.content,
                    reasoning_content=event.reasoning_content,
                    tool_calls=event.tool_calls,
                )
            )
            first_delta_seq = first_delta_seq or published.seq
            return channel.taken_seq > first_delta_seq
        elif isinstance(event, ModelRetry):
            channel.publish(
                ErrorNotice(
                    "MODEL_RETRY",
                    f"retry {event.attempt} in {event.delay_s:.1f}s: {event.message}",
                    "model",
                    retryable=True,
                )
            )
        else:
            channel.publish(
                ErrorNotice(
                    "MODEL_STREAM_RESTART",
                    f"the model stream broke; discard step {step_id}'s deltas, "
                    f"it restarts: {event.message}",
                    "model",
                    retryable=True,
                )
            )
        return False

    return on_event


def model_error_signal(error: ModelError, next_sequence: int) -> StopSignal:
    """MODEL_ERROR for a model call that failed; a retryable one resumes at `next_sequence`
    (where its reply would have been stored)."""
    # What failed and how hard it was tried: the last HTTP error status, the code of an error
    # the model sent in its stream, the retries (each only when there is one).
    context: dict[str, object] = {}
    if error.status_code is not None:
        context["status_code"] = error.status_code
    if error.error_code is not None:
        context["error_code"] = error.error_code
    if error.retries:
        context["retries"] = error.retries
    return StopSignal(
        StopReason.MODEL_ERROR,
        error.message,
        "model",
        context=context,
        retryable=error.retryable,
        resume_from_sequence=next_sequence if error.retryable else 0,
    )
