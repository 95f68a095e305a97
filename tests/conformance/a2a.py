"""The A2A conformance scenario: the official `a2a-sdk` client against live servers, over
each of A2A's three bindings (JSON-RPC, HTTP+JSON, gRPC).

scripts/conformance.py starts the servers (the plaintext pair: a fast one on the built-in
fake model, a slow one on a paced fake model, both with their HTTP listener) and runs this
with their addresses. Per binding, checks named `BINDING_NAME`:

- `card`: the card of the default agent, read from `/.well-known/agent-card.json` of the
  HTTP listener, names the three bindings; the client is made from it;
- `run_with_tool`: "What is 12 * 7?" streamed as a task: its `calculate` call announced in
  a WORKING status, the answer artifact "The result is 84.", the final state COMPLETED;
- `continue_context`: a second message in the task's context is a task of the same context,
  and `GetTask` gives its history and answer;
- `cancel`: a task of the slow server cancelled after its first answer chunk ends CANCELED;
- `resubscribe`: a slow task whose stream is dropped after its first event is followed
  again with `SubscribeToTask` to COMPLETED, its whole answer streamed;
- `not_found`: `GetTask` of an unknown task is `TaskNotFoundError`.

Prints one `ok NAME` or `FAIL NAME: why` line per check; exits 1 when any check failed.
`python -m tests.conformance.a2a --address HOST:PORT --http-address HOST:PORT
--slow-http-address HOST:PORT`
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import cast

import grpc
import httpx
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.types import a2a_pb2 as a2a
from a2a.utils import errors as a2a_errors

BINDINGS = ("JSONRPC", "HTTP+JSON", "GRPC")
TIMEOUT = 60.0


class CheckFailedError(AssertionError):
    """A check whose outcome was not the expected one."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailedError(message)


def message(text: str, context_id: str = "") -> a2a.SendMessageRequest:
    return a2a.SendMessageRequest(
        message=a2a.Message(
            message_id=uuid.uuid4().hex,
            role=a2a.ROLE_USER,
            parts=[a2a.Part(text=text)],
            context_id=context_id,
        )
    )


def answer(events: list[a2a.StreamResponse]) -> str:
    return "".join(
        part.text
        for event in events
        if event.HasField("artifact_update")
        for part in event.artifact_update.artifact.parts
    )


def states(events: list[a2a.StreamResponse]) -> list[str]:
    return [
        a2a.TaskState.Name(e.status_update.status.state)
        for e in events
        if e.HasField("status_update")
    ]


class Scenario:
    def __init__(self, binding: str, http_address: str, slow_http_address: str) -> None:
        self.binding = binding
        self.http_address = http_address
        self.slow_http_address = slow_http_address
        self.http = httpx.AsyncClient(timeout=TIMEOUT)
        self.channels: list[grpc.aio.Channel] = []
        self.task: a2a.Task | None = None

    async def client(self, http_address: str) -> tuple[Client, a2a.AgentCard]:
        resolver = A2ACardResolver(self.http, f"http://{http_address}")
        card = await resolver.get_agent_card()

        def channel(url: str) -> grpc.aio.Channel:
            self.channels.append(grpc.aio.insecure_channel(url))
            return self.channels[-1]

        config = ClientConfig(
            supported_protocol_bindings=[self.binding],
            use_client_preference=True,
            httpx_client=self.http,
            grpc_channel_factory=channel,
        )
        return ClientFactory(config).create(card), card

    async def close(self) -> None:
        await self.http.aclose()
        for channel in self.channels:
            await channel.close()

    async def card(self) -> None:
        _, card = await self.client(self.http_address)
        bindings = sorted(i.protocol_binding for i in card.supported_interfaces)
        expect(bindings == sorted(BINDINGS), f"the card names {bindings}")
        expect(card.capabilities.streaming, "the card says no streaming")

    async def run_with_tool(self) -> None:
        client, _ = await self.client(self.http_address)
        events = [e async for e in client.send_message(message("What is 12 * 7?"))]
        expect(events[0].HasField("task"), "the stream did not start with the task")
        self.task = events[0].task
        calls = [
            part.text
            for e in events
            if e.HasField("status_update") and e.status_update.status.HasField("message")
            for part in e.status_update.status.message.parts
            if part.text
        ]
        expect(any("calculate" in text for text in calls), f"no calculate call in {calls}")
        expect("84" in answer(events), f"the answer is {answer(events)!r}")
        expect(states(events)[-1] == "TASK_STATE_COMPLETED", f"states {states(events)}")

    async def continue_context(self) -> None:
        expect(self.task is not None, "no task to go on from (run_with_tool failed)")
        assert self.task is not None
        client, _ = await self.client(self.http_address)
        events = [
            e
            async for e in client.send_message(
                message("What is 12 * 7?", context_id=self.task.context_id)
            )
        ]
        second = events[0].task
        expect(second.context_id == self.task.context_id, "a new context was made")
        expect(second.id != self.task.id, "the same task was answered")
        found = await client.get_task(a2a.GetTaskRequest(id=second.id))
        expect(
            found.status.state == a2a.TASK_STATE_COMPLETED,
            f"GetTask says {a2a.TaskState.Name(found.status.state)}",
        )
        expect(found.history[0].role == a2a.ROLE_USER, "the history starts without the user")
        expect("84" in found.artifacts[-1].parts[0].text, "GetTask has no answer artifact")

    async def cancel(self) -> None:
        client, _ = await self.client(self.slow_http_address)
        stream = client.send_message(message("What is 12 * 7?"))
        first = await anext(stream)
        async for event in stream:
            if event.HasField("artifact_update"):
                break
        cancelled = await client.cancel_task(a2a.CancelTaskRequest(id=first.task.id))
        await cast(AsyncGenerator[a2a.StreamResponse], stream).aclose()
        state = a2a.TaskState.Name(cancelled.status.state)
        expect(state == "TASK_STATE_CANCELED", f"CancelTask says {state}")

    async def resubscribe(self) -> None:
        client, _ = await self.client(self.slow_http_address)
        stream = client.send_message(message("What is 12 * 7?"))
        first = await anext(stream)
        await cast(AsyncGenerator[a2a.StreamResponse], stream).aclose()
        events = [e async for e in client.subscribe(a2a.SubscribeToTaskRequest(id=first.task.id))]
        expect(events[0].task.id == first.task.id, "the subscription is of another task")
        expect(states(events)[-1] == "TASK_STATE_COMPLETED", f"states {states(events)}")
        expect(len(answer(events).split()) >= 200, "the answer did not stream whole")

    async def not_found(self) -> None:
        client, _ = await self.client(self.http_address)
        try:
            await client.get_task(a2a.GetTaskRequest(id="run_missing"))
        except a2a_errors.TaskNotFoundError:
            return
        raise CheckFailedError("GetTask of an unknown task succeeded")


async def check(name: str, work: Callable[[], Awaitable[None]]) -> bool:
    try:
        await asyncio.wait_for(work(), TIMEOUT)
    except Exception as error:
        print(f"FAIL {name}: {type(error).__name__}: {error}", flush=True)
        return False
    print(f"ok {name}", flush=True)
    return True


async def main(http_address: str, slow_http_address: str) -> int:
    passed = True
    for binding in BINDINGS:
        scenario = Scenario(binding, http_address, slow_http_address)
        label = binding.replace("+", "_").lower()
        try:
            for name, work in (
                ("card", scenario.card),
                ("run_with_tool", scenario.run_with_tool),
                ("continue_context", scenario.continue_context),
                ("cancel", scenario.cancel),
                ("resubscribe", scenario.resubscribe),
                ("not_found", scenario.not_found),
            ):
                passed &= await check(f"{label}_{name}", work)
        finally:
            await scenario.close()
    return 0 if passed else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-address", required=True)
    parser.add_argument("--slow-http-address", required=True)
    options = parser.parse_args()
    sys.exit(asyncio.run(main(options.http_address, options.slow_http_address)))
