"""A remote A2A agent built with the `a2a-sdk` alone: a note keeper an agio-grpc agent can
call as a tool (`a2a_agents:`; docs/a2a.md).

It keeps each conversation's notes by A2A context, so a second message in the same context
sees the first. What it does with a message:

- `note TEXT`: keeps TEXT and answers with every note of the context so far;
- `fail`: fails the task; `ask`: asks for input (INPUT_REQUIRED);
- `wait`: works until the task is cancelled.

Each task first says what it reads (a WORKING status with a message), which the caller
streams as its tool call's progress.

    .tools/bin/uv run python examples/a2a/sdk_agent.py --port 9999

serves its card at http://127.0.0.1:9999/.well-known/agent-card.json, and JSON-RPC and
HTTP+JSON beside it.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import defaultdict

import uvicorn
from a2a.helpers.proto_helpers import new_task, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import (
    create_agent_card_routes,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import a2a_pb2 as a2a
from starlette.applications import Starlette


class NoteKeeper(AgentExecutor):
    """Keeps notes per context; records what it was asked to cancel."""

    def __init__(self) -> None:
        self.notes: dict[str, list[str]] = defaultdict(list)
        self.cancelled: list[str] = []
        self.headers: list[dict[str, str]] = []

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None
        assert context.context_id is not None
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        if context.call_context is not None:
            self.headers.append(dict(context.call_context.state.get("headers", {})))
        if context.current_task is None:
            history = [context.message] if context.message is not None else []
            await event_queue.enqueue_event(
                new_task(
                    context.task_id, context.context_id, a2a.TASK_STATE_SUBMITTED, history=history
                )
            )
        text = context.get_user_input().strip()
        command, _, rest = text.partition(" ")
        await updater.start_work(new_text_message(f"Reading {command!r}"))
        if command == "fail":
            await updater.failed(new_text_message("the note book is on fire"))
        elif command == "ask":
            await updater.requires_input(new_text_message("Which note do you mean?"))
        elif command == "wait":
            await asyncio.Event().wait()  # until the task is cancelled
        else:
            notes = self.notes[context.context_id]
            notes.append(rest or text)
            await updater.add_artifact([a2a.Part(text=f"notes: {'; '.join(notes)}")], name="notes")
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None
        assert context.context_id is not None
        self.cancelled.append(context.task_id)
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def agent_card(url: str) -> a2a.AgentCard:
    return a2a.AgentCard(
        name="notes",
        description="Keeps notes for a conversation and reads them back.",
        version="1.0.0",
        supported_interfaces=[
            a2a.AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0"),
            a2a.AgentInterface(url=url, protocol_binding="HTTP+JSON", protocol_version="1.0"),
        ],
        capabilities=a2a.AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            a2a.AgentSkill(
                id="note", name="note", description="`note TEXT` keeps TEXT", tags=["notes"]
            )
        ],
    )


def application(url: str, keeper: NoteKeeper) -> Starlette:
    card = agent_card(url)
    handler = DefaultRequestHandler(keeper, InMemoryTaskStore(), card)
    return Starlette(
        routes=[
            *create_agent_card_routes(card),
            *create_jsonrpc_routes(handler, "/"),
            *create_rest_routes(handler),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9999)
    options = parser.parse_args()
    url = f"http://{options.host}:{options.port}/"
    uvicorn.run(application(url, NoteKeeper()), host=options.host, port=options.port)


if __name__ == "__main__":
    main()
