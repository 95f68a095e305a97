"""Tenant isolation as a client sees it, on SQLite and on PostgreSQL: for every RPC of both
services, tenant B's call naming tenant A's session or run answers exactly as the same call
naming an id that was never made (same code, ErrorInfo reason, metadata and message, the id
aside); B's lists never show A's rows; and afterwards A's sessions, steps (field by field)
and runs are as they were. A's resources are the ones a run leaves in each state: a session
with a completed run, one whose run waits for its client (REQUIRES_ACTION), one whose run
is running with a run queued behind it.

How a call gets its tenant is tests/service/tenancy.py's (`tenant_client`)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.domain import new_id
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.v1 import agent_service_pb2 as pb
from agio_grpc.v1.resources_pb2 import RunStatus

A = "tenant-a"
B = "tenant-b"
LOOKUP = {"name": "lookup", "description": "Look it up.", "parameters_json": '{"type": "object"}'}
ANSWER = pb.ToolOutput(tool_call_id="call_client", output="found")
WAIT_S = 5.0
"""The deadline of each stream B opens: a leak shows as a difference, not as a hang."""

TenantClient = Callable[[str], AgioClient]


@dataclass(frozen=True)
class Ids:
    """A tenant's resources, one in each state a run leaves them in."""

    done: str
    """A session whose run completed: user, a tool call, its result, the answer."""
    waiting: str
    """A session whose run waits for its client's tool output."""
    busy: str
    """A session whose run is running, with a run queued behind it."""
    done_run: str
    waiting_run: str
    running_run: str
    queued_run: str
    request_id: str = "req-a"
    """The request_id of the completed run."""

    @classmethod
    def made_up(cls) -> Ids:
        """Ids of the same kinds that name nothing."""
        return cls(
            done=new_id("sess"),
            waiting=new_id("sess"),
            busy=new_id("sess"),
            done_run=new_id("run"),
            waiting_run=new_id("run"),
            running_run=new_id("run"),
            queued_run=new_id("run"),
        )

    def named(self, text: str) -> str:
        """`text` with each id in it replaced by the field's name."""
        for item in dataclasses.fields(self):
            if item.name != "request_id":
                text = text.replace(getattr(self, item.name), f"<{item.name}>")
        return text


async def make_resources(client: AgioClient, fake_model: FakeModelServer) -> Ids:
    fake_model.enqueue(
        Turn.tool_calls([ToolCallSpec("calculate", '{"expression": "6 * 7"}')]),
        Turn.text("It is 42."),
    )
    done = await client.run_to_end("What is 6 * 7?", request_id="req-a")
    assert done.run.status == RunStatus.RUN_STATUS_COMPLETED
    fake_model.enqueue(Turn.tool_calls([ToolCallSpec("lookup", "{}", id="call_client")]))
    waiting = await client.run_to_end("Where is it?", client_tools=[LOOKUP])
    assert waiting.run.status == RunStatus.RUN_STATUS_REQUIRES_ACTION
    asked = len(fake_model.requests) + 1
    fake_model.enqueue(Turn.hanging())
    running = await client.start_run("Think it over.")
    await fake_model.wait_for_requests(asked)
    queued = await client.start_run(
        "Then this.", session_id=running.session_id, on_busy=pb.BUSY_POLICY_ENQUEUE
    )
    assert queued.status == RunStatus.RUN_STATUS_QUEUED
    return Ids(
        done=done.session_id,
        waiting=waiting.session_id,
        busy=running.session_id,
        done_run=done.run.id,
        waiting_run=waiting.run.id,
        running_run=running.id,
        queued_run=queued.id,
    )


async def drained(events: AsyncIterator[Any]) -> list[Any]:
    return [event async for event in events]


def run_on(client: AgioClient, session_id: str, **options: Any) -> Awaitable[list[Any]]:
    return drained(client.run("Let me in.", session_id=session_id, timeout=WAIT_S, **options))


# Each RPC of both services, as B calls it on A's ids (or on made-up ones), every state a
# resource can be in included: a busy session must not answer SESSION_BUSY, a waiting one
# RUN_REQUIRES_ACTION, a reused request_id DUPLICATE_REQUEST, a retry past the end of a
# history this server holds must not say how long it is.
CALLS: dict[str, Callable[[AgioClient, Ids], Awaitable[Any]]] = {
    "Run": lambda c, ids: run_on(c, ids.done),
    "Run, busy session": lambda c, ids: run_on(c, ids.busy),
    "Run, waiting session": lambda c, ids: run_on(c, ids.waiting),
    "Run, ENQUEUE": lambda c, ids: run_on(c, ids.busy, on_busy=pb.BUSY_POLICY_ENQUEUE),
    "Run, INTERRUPT": lambda c, ids: run_on(c, ids.busy, on_busy=pb.BUSY_POLICY_INTERRUPT),
    "Run, ROLLBACK": lambda c, ids: run_on(c, ids.busy, on_busy=pb.BUSY_POLICY_ROLLBACK),
    "Run, INTERRUPT a waiting run": lambda c, ids: run_on(
        c, ids.waiting, on_busy=pb.BUSY_POLICY_INTERRUPT
    ),
    "Run, reused request_id": lambda c, ids: run_on(c, ids.done, request_id=ids.request_id),
    "StartRun": lambda c, ids: c.start_run("Let me in.", session_id=ids.done),
    "StartRun, ENQUEUE": lambda c, ids: c.start_run(
        "Let me in.", session_id=ids.busy, on_busy=pb.BUSY_POLICY_ENQUEUE
    ),
    "SubmitToolOutputs": lambda c, ids: drained(
        c.submit_tool_outputs(ids.waiting_run, [ANSWER], timeout=WAIT_S)
    ),
    "SubmitToolOutputs, running run": lambda c, ids: drained(
        c.submit_tool_outputs(ids.running_run, [ANSWER], timeout=WAIT_S)
    ),
    "Retry": lambda c, ids: drained(c.retry(ids.done, 2, timeout=WAIT_S)),
    "Retry, past the end": lambda c, ids: drained(c.retry(ids.done, 99, timeout=WAIT_S)),
    "Retry, busy session": lambda c, ids: drained(c.retry(ids.busy, 2, timeout=WAIT_S)),
    "Retry, waiting session": lambda c, ids: drained(c.retry(ids.waiting, 2, timeout=WAIT_S)),
    "WatchRun": lambda c, ids: drained(c.watch_run(ids.done_run, timeout=WAIT_S)),
    "WatchRun, running run": lambda c, ids: drained(c.watch_run(ids.running_run, timeout=WAIT_S)),
    "WatchRun, queued run": lambda c, ids: drained(c.watch_run(ids.queued_run, timeout=WAIT_S)),
    "CancelRun, completed run": lambda c, ids: c.cancel_run(ids.done_run),
    "CancelRun, waiting run": lambda c, ids: c.cancel_run(ids.waiting_run),
    "CancelRun, running run": lambda c, ids: c.cancel_run(ids.running_run),
    "CancelRun, queued run": lambda c, ids: c.cancel_run(ids.queued_run),
    "GetRun": lambda c, ids: c.get_run(ids.done_run),
    "GetRun, running run": lambda c, ids: c.get_run(ids.running_run),
    "GetRun, queued run": lambda c, ids: c.get_run(ids.queued_run),
    "ListRuns": lambda c, ids: c.list_runs(ids.done),
    "ListRuns, busy session": lambda c, ids: c.list_runs(ids.busy),
    "GetSession": lambda c, ids: c.get_session(ids.done),
    "GetSession, busy session": lambda c, ids: c.get_session(ids.busy),
    "DeleteSession": lambda c, ids: c.delete_session(ids.done),
    "DeleteSession, busy session": lambda c, ids: c.delete_session(ids.busy),
    "ListSteps": lambda c, ids: c.list_steps(ids.done),
    "ListSteps, a range": lambda c, ids: c.list_steps(ids.done, 2, 3, page_size=1),
    "GetStep": lambda c, ids: c.get_step(ids.done, 1),
    "GetStep, past the end": lambda c, ids: c.get_step(ids.done, 99),
    "DeleteSteps": lambda c, ids: c.delete_steps(ids.done, 2),
    "DeleteSteps, busy session": lambda c, ids: c.delete_steps(ids.busy, 1),
    "ForkSession": lambda c, ids: c.fork_session(ids.done, 2),
    "ForkSession, whole": lambda c, ids: c.fork_session(ids.done),
    "ForkSession, past the end": lambda c, ids: c.fork_session(ids.done, 99),
    "GetContext": lambda c, ids: c.get_context(ids.done),
    "CompactSession": lambda c, ids: c.compact_session(ids.done, 1),
    "CompactSession, busy session": lambda c, ids: c.compact_session(ids.busy, 1),
    "CompactSession, waiting session": lambda c, ids: c.compact_session(ids.waiting, 1),
}


async def answer(call: Awaitable[Any], ids: Ids) -> tuple[Any, ...]:
    """What the caller learns: its status, ErrorInfo and BadRequest, with `ids` named."""
    try:
        await call
    except AgioError as error:
        return (
            error.code,
            error.reason,
            error.domain,
            ids.named(error.message),
            {key: ids.named(value) for key, value in error.metadata.items()},
            [(path, ids.named(why)) for path, why in error.field_violations],
        )
    return (grpc.StatusCode.OK,)


def fields(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


async def snapshot(client: AgioClient, ids: Ids) -> dict[str, Any]:
    """Everything a tenant can read of its resources, field by field."""
    sessions = (ids.done, ids.waiting, ids.busy)
    runs = (ids.done_run, ids.waiting_run, ids.running_run, ids.queued_run)
    return {
        "sessions": [fields(s) for s in await client.list_sessions()],
        "each session": {s: fields(await client.get_session(s)) for s in sessions},
        "steps": {s: [fields(step) for step in await client.list_steps(s)] for s in sessions},
        "runs of each": {s: [fields(run) for run in await client.list_runs(s)] for s in sessions},
        "runs": {r: fields(await client.get_run(r)) for r in runs},
        "context": fields(await client.get_context(ids.done)),
    }


async def test_every_rpc_answers_another_tenants_resource_as_a_missing_one(
    tenant_client: TenantClient, fake_model: FakeModelServer
) -> None:
    theirs, mine = tenant_client(A), tenant_client(B)
    ids = await make_resources(theirs, fake_model)
    fake_model.enqueue(Turn.text("B's own."))
    own = await mine.run_to_end("Mine.")
    before = await snapshot(theirs, ids)
    requests_before = len(fake_model.requests)

    differing: dict[str, tuple[Any, Any]] = {}
    for name, call in CALLS.items():
        made_up = Ids.made_up()
        on_theirs = await answer(call(mine, ids), ids)
        on_nothing = await answer(call(mine, made_up), made_up)
        if on_theirs != on_nothing or on_theirs[0] != grpc.StatusCode.NOT_FOUND:
            differing[name] = (on_theirs, on_nothing)

    assert differing == {}
    assert len(fake_model.requests) == requests_before  # no model call was made for B
    assert await snapshot(theirs, ids) == before
    listed = await mine.list_sessions()
    assert [session.id for session in listed] == [own.session_id]
    assert await tenant_client("tenant-c").list_sessions() == []
    assert [agent.name for agent in await mine.list_agents()] == ["assistant"]

    await theirs.cancel_run(ids.queued_run)
    await theirs.cancel_run(ids.running_run)


async def test_a_page_token_works_for_the_tenant_it_was_issued_to_only(
    tenant_client: TenantClient, fake_model: FakeModelServer
) -> None:
    theirs, mine = tenant_client(A), tenant_client(B)
    for text in ("one", "two", "three"):
        fake_model.enqueue(Turn.text(f"Reply to {text}."))
        await theirs.run_to_end(text)
        fake_model.enqueue(Turn.text(f"Reply to {text}."))
        await mine.run_to_end(text)
    first = await theirs.list_sessions_page(page_size=1)
    token = first.next_page_token
    forged = token[:-2] + ("AA" if token[-2:] != "AA" else "BB")

    issued_to_a = await answer(
        mine.list_sessions_page(page_size=1, page_token=token), Ids.made_up()
    )
    not_issued = await answer(
        mine.list_sessions_page(page_size=1, page_token=forged), Ids.made_up()
    )
    second = await theirs.list_sessions_page(page_size=1, page_token=token)

    assert issued_to_a == not_issued
    assert issued_to_a[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    assert second.sessions[0].id != first.sessions[0].id  # A's own next page


async def test_a_fork_is_its_forkers_and_its_parents_tenants(
    tenant_client: TenantClient, fake_model: FakeModelServer
) -> None:
    theirs, mine = tenant_client(A), tenant_client(B)
    fake_model.enqueue(Turn.text("Hello."))
    parent = await theirs.run_to_end("Hi.")
    fork = await theirs.fork_session(parent.session_id, 1)

    with pytest.raises(AgioError) as refused:
        await mine.get_session(fork.id)

    assert refused.value.reason == "SESSION_NOT_FOUND"
    assert {session.id for session in await theirs.list_sessions()} == {
        parent.session_id,
        fork.id,
    }
    assert await mine.list_sessions() == []
