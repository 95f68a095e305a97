"""The run floor: an agio-grpc run's messages and model calls, and nothing else.

    python -m bench.run_floor MODEL_URL

A bare grpc.aio `Run` that does what a run of bench/runs.py's shapes must do to be seen
by its caller, with agio-grpc's own parts where it has one: the model read with its model
driver (engine/models/openai_chat.py) offering the built-in tools, each `calculate` call
answered by the built-in tool inline, the events built as the engine's dataclasses and
converted by service/convert.py, deltas merged while the writer is behind (as the event
channel merges them). It writes the messages a run of agio-grpc writes, in its order:
`run_started`, the input's `step_completed`, then per step `step_started`, its deltas and
its `step_completed`, and `run_completed`.

What it leaves out is what agio-grpc adds to that: the store (no session, step or run is
written or read; ids and sequences are made up here), the engine's loop, hooks, limits,
cancellation, admission, leases and tracing, the interceptors. So agio-grpc's CPU per run
over this floor's, in the same run of B6, is what those cost; this floor's own is what a
run costs in Python here before any of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from agio_grpc import domain
from agio_grpc.domain import Role, RunStatus, Step, StopReason, StopSignal, new_id, utc_now
from agio_grpc.engine import events
from agio_grpc.engine.builtin_tools import TOOLS, calculate
from agio_grpc.engine.models import ModelDelta, ModelEvent, ModelReply, ModelRequest
from agio_grpc.engine.models.openai_chat import OpenAIModelDriver
from agio_grpc.service.convert import event_to_proto
from agio_grpc.v1 import agent_service_pb2, agent_service_pb2_grpc
from bench.floor import serve

INSTRUCTIONS = "You are a helpful assistant."
Write = Callable[[events.Event], Awaitable[None]]


class RunFloorServicer(agent_service_pb2_grpc.AgentServiceServicer):
    """`Run` as the module docstring says; the other methods keep the generated answers."""

    def __init__(self, model_url: str) -> None:
        self._model = OpenAIModelDriver(base_url=model_url, api_key="bench")
        self._tools = [tool.definition() for tool in TOOLS]

    async def Run(  # type: ignore[override]
        self, request: agent_service_pb2.RunRequest, context: grpc.aio.ServicerContext
    ) -> None:
        run = domain.Run(session_id=new_id("sess"), agent="assistant")
        user = Step(run.session_id, run.id, Role.USER, content=request.input, sequence=1)
        user.create_time = utc_now()
        run.step_count, run.first_sequence, run.last_sequence = 1, 1, 1
        seq = 0

        async def write(event: events.Event) -> None:
            nonlocal seq
            seq += 1
            sequenced = events.SequencedEvent(run.id, run.session_id, seq, utc_now(), event)
            await context.write(event_to_proto(sequenced))

        await write(events.RunStarted(run=run))
        await write(events.StepCompleted(step=user))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": INSTRUCTIONS},
            user.to_message(),
        ]
        while True:
            reply = await self._model_step(run, messages, write)
            if not reply.tool_calls:
                break
            for call in reply.tool_calls:
                await self._tool_step(run, call.id, call.name, call.arguments, messages, write)
        run.status = RunStatus.COMPLETED
        run.stop_signal = StopSignal(StopReason.COMPLETED, source="model")
        run.end_time = utc_now()
        await write(events.RunCompleted(run=run))

    async def _model_step(
        self, run: domain.Run, messages: list[dict[str, Any]], write: Write
    ) -> ModelReply:
        """One model call streamed as an assistant step; its message joins `messages`."""
        step = Step(run.session_id, run.id, Role.ASSISTANT, sequence=run.last_sequence + 1)
        await write(events.StepStarted(step_id=step.id, role=Role.ASSISTANT))
        request = ModelRequest(model="fake-model", messages=messages, tools=self._tools)
        reply = await _relayed(self._model.complete, request, step.id, write)
        step.content, step.tool_calls, step.metrics = reply.content, reply.tool_calls, reply.metrics
        await self._completed(run, step, write)
        run.usage.add(reply.metrics)
        messages.append(step.to_message())
        return reply

    async def _tool_step(
        self,
        run: domain.Run,
        call_id: str,
        name: str,
        arguments: str,
        messages: list[dict[str, Any]],
        write: Write,
    ) -> None:
        """A tool call's result as a tool step: `calculate` run inline, any other tool
        answered with an error (the fake model only ever calls `calculate`)."""
        step = Step(run.session_id, run.id, Role.TOOL, sequence=run.last_sequence + 1)
        step.tool_call_id, step.name = call_id, name
        await write(
            events.StepStarted(step_id=step.id, role=Role.TOOL, tool_call_id=call_id, name=name)
        )
        if name == "calculate":
            step.content = calculate(**json.loads(arguments))
        else:
            step.content, step.is_error = f"Error: no tool {name!r} here", True
        await self._completed(run, step, write)
        run.tool_call_count += 1
        messages.append(step.to_message())

    @staticmethod
    async def _completed(run: domain.Run, step: Step, write: Write) -> None:
        step.create_time = utc_now()
        run.step_count += 1
        run.last_sequence = step.sequence
        await write(events.StepCompleted(step=step))


async def _relayed(
    complete: Callable[[ModelRequest, Callable[[ModelEvent], bool]], Awaitable[ModelReply]],
    request: ModelRequest,
    step_id: str,
    write: Write,
) -> ModelReply:
    """The model's reply, its deltas written as they come, those that queued up while a
    write was under way merged into one."""
    queue: asyncio.Queue[ModelDelta | None] = asyncio.Queue()
    written = False  # the driver may report read deltas without yielding once one is out

    def on_event(event: ModelEvent) -> bool:
        if isinstance(event, ModelDelta):
            queue.put_nowait(event)
        return written

    call = asyncio.ensure_future(complete(request, on_event))
    call.add_done_callback(lambda _: queue.put_nowait(None))
    try:
        ended = False
        while not ended and (delta := await queue.get()) is not None:
            content, calls = delta.content, list(delta.tool_calls)
            while not queue.empty():
                if (more := queue.get_nowait()) is None:
                    ended = True
                    break
                content += more.content
                calls += more.tool_calls
            merged = events.StepDelta(step_id=step_id, content=content, tool_calls=tuple(calls))
            await write(merged)
            written = True
        return await call
    finally:
        call.cancel()  # the caller left mid-stream: the model call goes with it


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run_floor", description=__doc__)
    parser.add_argument("model_url")
    args = parser.parse_args(argv)
    asyncio.run(serve(RunFloorServicer(args.model_url)))  # type: ignore[abstract]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
