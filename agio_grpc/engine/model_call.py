"""`ModelCall`: one traced model call that produces an assistant step.

The loop makes each call inline (`ModelCall.reply`). A run on a new session may instead
`send` its first call ahead, while its start transaction commits: such a run cannot be
refused (there is no session to be busy, no request id to repeat), and its first request
holds nothing but the instructions and the input, so waiting for the commit before sending
it only adds the transaction's time to the time to first token (B1 in docs/benchmarks).
A call sent ahead reads its reply only once the loop takes it (events of retries before
that are kept; the loop publishes the step's `StepStarted` first); a call nobody takes is
cancelled with `discard`.

Never imports grpc, SQLAlchemy or OpenTelemetry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from agio_grpc.domain import Step
from agio_grpc.engine.agents import RunSettings
from agio_grpc.engine.context import build_context
from agio_grpc.engine.model import ModelDriver, ModelEvent, ModelReply, ModelRequest
from agio_grpc.engine.tools import ToolRegistry
from agio_grpc.engine.tracing import RunTrace

ModelListener = Callable[[ModelEvent], None]


def model_request(
    settings: RunSettings, registry: ToolRegistry, history: list[Step], trace: RunTrace
) -> ModelRequest:
    """The request for the next model call on `history` (its context build is traced)."""
    building = time.perf_counter()
    messages = build_context(settings.instructions, history, settings.limits.max_history_messages)
    trace.context_built(time.perf_counter() - building, len(messages))
    client_tools = [tool.to_openai() for tool in settings.client_tools]
    return ModelRequest(
        model=settings.model,
        messages=messages,
        tools=registry.definitions(settings.tools) + client_tools,
        temperature=settings.temperature,
        max_tokens=settings.max_tokens,
        max_reply_bytes=settings.limits.max_step_bytes,
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
        self._task: asyncio.Task[CallReply] | None = None
        self._kept: list[ModelEvent] = []
        self._listener: ModelListener | None = None
        self._ready = asyncio.Event()

    def send(self) -> None:
        """Send the request now, in a task of its own, which reads the reply only once the
        caller takes it with `reply` (parsing a stream costs CPU the start needs meanwhile;
        a SQLite transaction runs in a thread that waits for the GIL)."""
        with self._trace.activate():  # the task's context is a copy of this one
            self._task = asyncio.create_task(self._call(self._relay, self._ready))
        self._task.add_done_callback(_retrieve)

    async def reply(self, listener: ModelListener) -> CallReply:
        """The call's reply, its events passed to `listener` in order (those kept first).

        Raises what the model driver raises (ModelError); a cancel of the caller cancels
        the call and waits for it to end.
        """
        task = self._task
        if task is None:
            return await self._call(listener)
        for event in self._kept:
            listener(event)
        self._kept.clear()
        self._listener = listener
        self._ready.set()
        try:
            return await asyncio.shield(task)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task})

    def discard(self) -> None:
        """Cancel a call sent ahead that nobody will take."""
        if self._task is not None and self._listener is None:
            self._task.cancel()

    def _relay(self, event: ModelEvent) -> None:
        if self._listener is None:
            self._kept.append(event)
        else:
            self._listener(event)

    async def _call(self, listener: ModelListener, ready: asyncio.Event | None = None) -> CallReply:
        with self._trace.model_call(self.request, self.step_id, self._sequence) as span:
            reply = await self._model.complete(self.request, listener, ready=ready)
            span.replied(reply)
        return CallReply(reply, span.trace_id, span.span_id)


def _retrieve(task: asyncio.Task[CallReply]) -> None:
    """Mark a discarded call's outcome as seen (nobody awaits it)."""
    if not task.cancelled():
        task.exception()
