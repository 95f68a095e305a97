"""The real things one example's symbols name, and the encoding of its requests.

A `World` belongs to one example. It makes each session, run, tool call and page token the
example's requests name the first time one is named (over the real API, with well-formed
requests), encodes requests (the symbols resolved, long texts expanded, non-UTF-8 bytes
patched into the encoded message), remembers every session the example touched, and at the
end waits for the runs it started to end, so their history can be judged at rest.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from agio_grpc.testing import ToolCallSpec, Turn
from agio_grpc.v1 import (
    agent_service_pb2,
    agent_service_pb2_grpc,
    events_pb2,
    resources_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
)
from agio_grpc.v1.resources_pb2 import RunStatus
from tests.fuzz.harness import FuzzService, Outcome
from tests.fuzz.strategies import (
    Case,
    Fields,
    Long,
    PageToken,
    Ref,
    TokenChange,
    TokenSource,
    Undecodable,
    leaf_paths,
    replaced,
)

SETUP_DEADLINE_S = 30.0
SETTLE_DEADLINE_S = 30.0
"""How long a run the example started may take to end once the example is over."""
LOOKUP = resources_pb2.ToolDefinition(
    name="lookup",
    description="Looks a word up.",
    parameters_json='{"type": "object", "properties": {"q": {"type": "string"}}}',
)
TERMINAL_KINDS = ("run_completed", "run_failed")
NEW_SESSIONS_PAGE = 100
"""More than one example makes (five requests, four made sessions, forks)."""


def terminal_run(event: events_pb2.StepEvent) -> resources_pb2.Run | None:
    """The final run a terminal event carries; None for any other event."""
    kind = event.WhichOneof("event")
    if kind == "run_completed":
        return event.run_completed.run
    if kind == "run_failed":
        return event.run_failed.run
    return None


class SetupError(AssertionError):
    """A well-formed request the world needed did not do what it must."""


class World:
    """The sessions, runs, tool calls and page tokens of one example."""

    def __init__(self, service: FuzzService) -> None:
        self._service = service
        self.agents = agent_service_pb2_grpc.AgentServiceStub(service.channel)
        self.sessions = session_service_pb2_grpc.SessionServiceStub(service.channel)
        self._refs: dict[Ref, str] = {}
        self._tokens: dict[TokenSource, str] = {}
        self.touched: set[str] = set()
        """Every session the example made, named or was answered about."""
        self._left_queued: list[str] = []
        self._began = time.time()

    # -- making what symbols name --------------------------------------------------------------

    async def resolve(self, ref: Ref) -> str:
        if ref not in self._refs:
            await _MAKERS[ref](self)
        return self._refs[ref]

    async def _run(
        self, request: agent_service_pb2.RunRequest, *turns: Turn
    ) -> tuple[resources_pb2.Run, list[resources_pb2.Step]]:
        """A well-formed Run, answered by `turns` (else by the default responder)."""
        model = self._service.model
        model.enqueue(*turns)
        events = [e async for e in self.agents.Run(request, timeout=SETUP_DEADLINE_S)]
        if model.pending:
            raise SetupError(f"the setup run left {model.pending} scripted turn(s) unread")
        run = terminal_run(events[-1]) if events else None
        if run is None:
            raise SetupError(f"a setup run did not end: {[e.WhichOneof('event') for e in events]}")
        self.touched.add(run.session_id)
        return run, [e.step_completed.step for e in events if e.HasField("step_completed")]

    async def _make_live(self) -> None:
        """A session where the model called `calculate` and answered with its result."""
        run, steps = await self._run(agent_service_pb2.RunRequest(input="What is 12 * 7?"))
        calls = [call.id for step in steps for call in step.tool_calls]
        if run.status != RunStatus.RUN_STATUS_COMPLETED or len(calls) != 1:
            raise SetupError(f"the live session's run: {run}")
        self._refs[Ref.LIVE_SESSION] = run.session_id
        self._refs[Ref.ENDED_RUN] = run.id
        self._refs[Ref.ANSWERED_CALL] = calls[0]

    async def _make_other(self) -> None:
        run, _ = await self._run(agent_service_pb2.RunRequest(input="hello"))
        self._refs[Ref.OTHER_SESSION] = run.session_id
        self._refs[Ref.OTHER_RUN] = run.id

    async def _make_waiting(self) -> None:
        """A run that called the client tool `lookup` twice and waits for the outputs."""
        turn = Turn.tool_calls(
            [ToolCallSpec("lookup", '{"q": "a"}'), ToolCallSpec("lookup", '{"q": "b"}')]
        )
        request = agent_service_pb2.RunRequest(input="look it up", client_tools=[LOOKUP])
        run, steps = await self._run(request, turn)
        calls = [call.id for step in steps for call in step.tool_calls]
        if run.status != RunStatus.RUN_STATUS_REQUIRES_ACTION or len(calls) != 2:
            raise SetupError(f"the waiting session's run: {run}")
        self._refs[Ref.WAITING_SESSION] = run.session_id
        self._refs[Ref.WAITING_RUN] = run.id
        self._refs[Ref.OPEN_CALL], self._refs[Ref.OTHER_OPEN_CALL] = calls

    async def _make_approval(self) -> None:
        """A run whose `echo` call waits for a decision (`require_approval`) beside a call of
        the client tool `lookup`: one submit must answer both."""
        turn = Turn.tool_calls(
            [ToolCallSpec("echo", '{"text": "held"}'), ToolCallSpec("lookup", '{"q": "c"}')]
        )
        request = agent_service_pb2.RunRequest(
            input="send it", client_tools=[LOOKUP], require_approval=["echo"]
        )
        run, _ = await self._run(request, turn)
        action = run.required_action
        if run.status != RunStatus.RUN_STATUS_REQUIRES_ACTION or len(action.approvals) != 1:
            raise SetupError(f"the approval session's run: {run}")
        self._refs[Ref.APPROVAL_SESSION] = run.session_id
        self._refs[Ref.APPROVAL_RUN] = run.id
        self._refs[Ref.HELD_CALL] = action.approvals[0].id
        self._refs[Ref.HELD_CLIENT_CALL] = action.tool_calls[0].id

    async def _make_deleted(self) -> None:
        run, _ = await self._run(agent_service_pb2.RunRequest(input="goodbye"))
        await self.sessions.DeleteSession(
            session_service_pb2.DeleteSessionRequest(session_id=run.session_id)
        )
        self.touched.discard(run.session_id)
        self._refs[Ref.DELETED_SESSION] = run.session_id
        self._refs[Ref.DELETED_RUN] = run.id

    async def page_token(self, token: PageToken) -> str:
        """A real token of the listing, as issued or tampered with."""
        if token.source not in self._tokens:
            self._tokens[token.source] = await self._issue(token.source)
        issued = self._tokens[token.source]
        return issued if token.change is None else tampered(issued, token.change)

    async def _issue(self, source: TokenSource) -> str:
        live = await self.resolve(Ref.LIVE_SESSION)
        if source == "sessions":
            await self.resolve(Ref.OTHER_SESSION)
            listed = await self.sessions.ListSessions(
                session_service_pb2.ListSessionsRequest(page_size=1)
            )
            token: str = listed.next_page_token
        elif source == "steps":
            steps = await self.sessions.ListSteps(
                session_service_pb2.ListStepsRequest(session_id=live, page_size=1)
            )
            token = steps.next_page_token
        else:
            await self._run(agent_service_pb2.RunRequest(session_id=live, input="again"))
            runs = await self.agents.ListRuns(
                agent_service_pb2.ListRunsRequest(session_id=live, page_size=1)
            )
            token = runs.next_page_token
        if not token:
            raise SetupError(f"a {source} listing of page size 1 gave no next page token")
        return token

    # -- encoding requests ---------------------------------------------------------------------

    async def encode(self, case: Case) -> tuple[Message, bytes]:
        """The request message (symbols resolved) and its bytes, non-UTF-8 texts patched in."""
        message = GetMessageClass(case.rpc.request)()
        patches: list[tuple[bytes, bytes]] = []
        await self._fill(message, case.fields, patches)
        data = message.SerializeToString()
        for marker, raw in patches:
            assert data.count(marker) == 1, "a marker for undecodable bytes is not unique"
            data = data.replace(marker, raw)
        return message, data

    async def _fill(
        self, message: Message, fields: Fields, patches: list[tuple[bytes, bytes]]
    ) -> None:
        for name, value in fields.items():
            field = message.DESCRIPTOR.fields_by_name[name]
            target = getattr(message, name)
            entry = field.message_type
            if entry is not None and entry.GetOptions().map_entry:
                for key, item in value.items():
                    target[await self._scalar(key, patches)] = await self._scalar(item, patches)
            elif field.is_repeated and field.type == FieldDescriptor.TYPE_MESSAGE:
                for item in value:
                    await self._fill(target.add(), item, patches)
            elif field.is_repeated:
                target.extend([await self._scalar(item, patches) for item in value])
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                target.SetInParent()  # set, even with no field of its own set
                await self._fill(target, value, patches)
            else:
                setattr(message, name, await self._scalar(value, patches))

    async def _scalar(self, value: Any, patches: list[tuple[bytes, bytes]]) -> Any:
        if isinstance(value, Ref):
            return await self.resolve(value)
        if isinstance(value, PageToken):
            return await self.page_token(value)
        if isinstance(value, Long):
            return value.text
        if isinstance(value, Undecodable):
            marker = uuid.uuid4().hex.ljust(len(value.raw), "~")[: len(value.raw)]
            patches.append((marker.encode(), value.raw))
            return marker
        return value

    # -- after each call -----------------------------------------------------------------------

    def note(self, case: Case, request: Message, outcome: Outcome) -> None:
        """Remember the sessions a call touched."""
        self.touched.update(event.session_id for event in outcome.events if event.session_id)
        response = outcome.response
        if response is not None:
            fields = response.DESCRIPTOR.fields_by_name
            if "run" in fields:
                self.touched.add(response.run.session_id)  # type: ignore[attr-defined]
            if "session" in fields:
                self.touched.add(response.session.id)  # type: ignore[attr-defined]
        self.touched.discard("")

    # -- reading a session at rest -------------------------------------------------------------

    async def steps_of(self, session_id: str) -> list[resources_pb2.Step] | None:
        """Every step of the session, page by page; None when there is no such session."""
        return await _all_pages(
            lambda token: self.sessions.ListSteps(
                session_service_pb2.ListStepsRequest(
                    session_id=session_id, page_size=1000, page_token=token
                )
            ),
            "steps",
        )

    async def runs_of(self, session_id: str) -> list[resources_pb2.Run] | None:
        """Every run of the session, newest first; None when there is no such session."""
        return await _all_pages(
            lambda token: self.agents.ListRuns(
                agent_service_pb2.ListRunsRequest(
                    session_id=session_id, page_size=1000, page_token=token
                )
            ),
            "runs",
        )

    async def settle(self) -> None:
        """Wait for every run the example left RUNNING or QUEUED to end (a queued run behind
        one waiting for tool outputs cannot start: it is left queued, for `clean_up`)."""
        await self._touch_new_sessions()
        for session_id in sorted(self.touched):
            for _ in range(4):
                runs = await self.runs_of(session_id) or []
                waiting = any(r.status == RunStatus.RUN_STATUS_REQUIRES_ACTION for r in runs)
                queued = [r.id for r in runs if r.status == RunStatus.RUN_STATUS_QUEUED]
                active = [
                    run
                    for run in runs
                    if run.status == RunStatus.RUN_STATUS_RUNNING
                    or (run.status == RunStatus.RUN_STATUS_QUEUED and not waiting)
                ]
                if not active:
                    self._left_queued += queued
                    break
                for run in active:
                    await self._watch_to_end(run)
            else:
                raise AssertionError(f"session {session_id}: its runs never came to rest")

    async def _touch_new_sessions(self) -> None:
        """Count in the sessions made during the example that no answer named (a call whose
        deadline passed may have started a run on a new session, or forked, all the same)."""
        request = session_service_pb2.ListSessionsRequest(page_size=NEW_SESSIONS_PAGE)
        listed = await self.sessions.ListSessions(request)
        for session in listed.sessions:
            made = session.create_time.seconds + session.create_time.nanos / 1e9
            if made >= self._began:
                self.touched.add(session.id)

    async def _watch_to_end(self, run: resources_pb2.Run) -> None:
        request = agent_service_pb2.WatchRunRequest(run_id=run.id)
        try:
            async for _ in self.agents.WatchRun(request, timeout=SETTLE_DEADLINE_S):
                pass
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise AssertionError(
                    f"run {run.id} ({RunStatus.Name(run.status)}) did not end within "
                    f"{SETTLE_DEADLINE_S:g}s of the example's end"
                ) from None
            if error.code() != grpc.StatusCode.NOT_FOUND:  # its session was deleted meanwhile
                raise

    async def clean_up(self) -> None:
        """Cancel the runs `settle` left queued, so no later example meets them."""
        for run_id in self._left_queued:
            await self.agents.CancelRun(agent_service_pb2.CancelRunRequest(run_id=run_id))


_MAKERS: dict[Ref, Callable[[World], Awaitable[None]]] = {
    Ref.LIVE_SESSION: World._make_live,
    Ref.ENDED_RUN: World._make_live,
    Ref.ANSWERED_CALL: World._make_live,
    Ref.OTHER_SESSION: World._make_other,
    Ref.OTHER_RUN: World._make_other,
    Ref.WAITING_SESSION: World._make_waiting,
    Ref.WAITING_RUN: World._make_waiting,
    Ref.OPEN_CALL: World._make_waiting,
    Ref.OTHER_OPEN_CALL: World._make_waiting,
    Ref.DELETED_SESSION: World._make_deleted,
    Ref.DELETED_RUN: World._make_deleted,
    Ref.APPROVAL_SESSION: World._make_approval,
    Ref.APPROVAL_RUN: World._make_approval,
    Ref.HELD_CALL: World._make_approval,
    Ref.HELD_CLIENT_CALL: World._make_approval,
}


async def _all_pages(list_page: Callable[[str], Awaitable[Any]], items: str) -> list[Any] | None:
    found: list[Any] = []
    token = ""
    while True:
        try:
            page = await list_page(token)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        found.extend(getattr(page, items))
        token = page.next_page_token
        if not token:
            return found


def tampered(token: str, change: TokenChange) -> str:
    """A real page token, changed as `change` says."""
    if change.how == "truncate":
        return token[: change.at % len(token)]
    if change.how == "extend":
        return token + json.dumps(change.value)
    if change.how == "payload":
        try:
            payload = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        except (ValueError, binascii.Error):
            payload = None  # not JSON (any more): flip a character instead
        if payload is not None:
            paths = leaf_paths(payload)
            changed = replaced(payload, paths[change.at % len(paths)], change.value)
            return base64.urlsafe_b64encode(json.dumps(changed).encode()).decode().rstrip("=")
    at = change.at % len(token)
    return token[:at] + ("B" if token[at] == "A" else "A") + token[at + 1 :]
