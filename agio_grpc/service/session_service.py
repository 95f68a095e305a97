"""`agio.v1.SessionService`: read and edit sessions and their step logs.

Validates every request before it touches the store, so a bad request writes nothing; store
and engine errors are mapped to statuses by the error interceptor. Every call sees the
caller's tenant's sessions only (`current_caller`), and its page tokens are the tenant's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import grpc

from agio_grpc import domain
from agio_grpc.engine.context import open_tool_calls
from agio_grpc.engine.session_compaction import SessionCompaction
from agio_grpc.service import convert
from agio_grpc.service.errors import FieldViolation, invalid_argument
from agio_grpc.service.identity import current_caller
from agio_grpc.service.validation import (
    PageTokens,
    check_id,
    check_non_negative,
    check_positive,
    fitting,
    page_size,
    raise_if_any,
    sequence_key,
    time_key,
)
from agio_grpc.store.errors import NotFoundError
from agio_grpc.store.log import SessionLog
from agio_grpc.v1 import resources_pb2, session_service_pb2_grpc
from agio_grpc.v1 import session_service_pb2 as pb

TAIL_READ = 64
"""Steps read at a time, back from an edit's cut, looking for the calls it would split."""
DEFAULT_SESSION_PAGE = 50
DEFAULT_STEP_PAGE = 100
DEFAULT_PAGE_BYTES = 12 * 1024 * 1024
"""How much a page of steps or messages may hold: room to spare in a 16 MiB message."""
FIRST_USER_MESSAGE_CHARS = 200
"""How much of its first user message a `Session` carries: enough to tell sessions apart in
a list, little enough that a page of a thousand sessions stays small."""


def _tenant() -> str:
    """The caller's tenant: every lookup filters by it (another tenant's session answers as
    a missing one)."""
    return current_caller().tenant


class ContextSource(Protocol):
    """Builds what the model would receive next for a session (the engine provides it)."""

    async def next_context(
        self, session_id: str, agent: str = "", *, tenant: str | None = None
    ) -> list[domain.Step]:
        """The system prompt (sequence 0) then the session's messages, valid to re-send.
        Raises NotFoundError (also for a session that is not `tenant`'s)."""
        ...


class Compactor(Protocol):
    """Compacts a session between runs (the engine's `SessionCompactor`)."""

    async def compact(
        self,
        session_id: str,
        *,
        agent: str = "",
        keep_recent_steps: int | None = None,
        tenant: str | None = None,
    ) -> SessionCompaction: ...


class SessionServicer(session_service_pb2_grpc.SessionServiceServicer):
    """Serves SessionService from the store's `SessionLog`."""

    def __init__(
        self,
        log: SessionLog,
        context: ContextSource,
        compactor: Compactor,
        pages: PageTokens | None = None,
        page_bytes: int = DEFAULT_PAGE_BYTES,
    ) -> None:
        """`pages` signs page tokens (the store's shared key, `PageTokens` docstring);
        `page_bytes` bounds each page of steps or messages, whatever its page size."""
        self._log = log
        self._context = context
        self._compactor = compactor
        self._pages = pages or PageTokens()
        self._page_bytes = page_bytes

    async def GetSession(
        self, request: pb.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSessionResponse:
        raise_if_any(check_id("session_id", request.session_id))
        session = await self._log.get_session(request.session_id, tenant=_tenant())
        return pb.GetSessionResponse(session=(await self._sessions_to_proto([session]))[0])

    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSessionsResponse:
        tenant = _tenant()
        pages = self._pages.for_tenant(tenant)
        limit = page_size(request.page_size, DEFAULT_SESSION_PAGE)
        query: dict[str, object] = {"rpc": "ListSessions"}
        after = time_key(pages.decode(request.page_token, query))
        sessions, token = pages.trim_time_keyed(
            await self._log.list_sessions(limit + 1, after, tenant=tenant), limit, query
        )
        return pb.ListSessionsResponse(
            sessions=await self._sessions_to_proto(sessions), next_page_token=token
        )

    async def DeleteSession(
        self, request: pb.DeleteSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteSessionResponse:
        raise_if_any(check_id("session_id", request.session_id))
        # The store refuses an edit of a session a run holds (SESSION_BUSY).
        deleted = await self._log.delete_session(request.session_id, tenant=_tenant())
        return pb.DeleteSessionResponse(deleted_steps=deleted)

    async def ListSteps(
        self, request: pb.ListStepsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListStepsResponse:
        raise_if_any(
            check_id("session_id", request.session_id),
            check_non_negative("start_sequence", request.start_sequence),
            check_non_negative("end_sequence", request.end_sequence),
        )
        if request.end_sequence and request.end_sequence < request.start_sequence:
            raise invalid_argument(
                [FieldViolation("end_sequence", "must not be below start_sequence")]
            )
        tenant = _tenant()
        pages = self._pages.for_tenant(tenant)
        limit = page_size(request.page_size, DEFAULT_STEP_PAGE)
        query: dict[str, object] = {
            "rpc": "ListSteps",
            "session": request.session_id,
            "start": request.start_sequence,
            "end": request.end_sequence,
        }
        resume = sequence_key(pages.decode(request.page_token, query))
        start = resume if resume is not None else max(request.start_sequence, 1)
        end = request.end_sequence or None
        # NOT_FOUND for an unknown session, or another tenant's.
        steps = await self._log.get_steps(request.session_id, start, end, limit + 1, tenant=tenant)
        page = [convert.step_to_proto(s) for s in steps[:limit]]
        del page[fitting(page, self._page_bytes) :]
        token = ""
        if len(steps) > len(page):
            token = pages.encode(query, [steps[len(page)].sequence])
        return pb.ListStepsResponse(steps=page, next_page_token=token)

    async def GetStep(
        self, request: pb.GetStepRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStepResponse:
        raise_if_any(
            check_id("session_id", request.session_id),
            check_positive("sequence", request.sequence),
        )
        step = await self._log.get_step(request.session_id, request.sequence, tenant=_tenant())
        return pb.GetStepResponse(step=convert.step_to_proto(step))

    async def DeleteSteps(
        self, request: pb.DeleteStepsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteStepsResponse:
        raise_if_any(
            check_id("session_id", request.session_id),
            check_positive("start_sequence", request.start_sequence),
        )
        start = request.start_sequence
        await self._refuse_open_calls(
            request.session_id, start - 1, "start_sequence", f"deleting from {start}"
        )
        deleted = await self._log.delete_steps_from(
            request.session_id, request.start_sequence, tenant=_tenant()
        )
        return pb.DeleteStepsResponse(deleted_count=deleted)

    async def ForkSession(
        self, request: pb.ForkSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.ForkSessionResponse:
        raise_if_any(
            check_id("session_id", request.session_id),
            check_non_negative("sequence", request.sequence),
        )
        tenant = _tenant()
        sequence = request.sequence
        if sequence == 0:
            sequence = (await self._log.get_session(request.session_id, tenant=tenant)).step_count
        await self._refuse_open_calls(
            request.session_id, sequence, "sequence", f"forking at {sequence}"
        )
        # The fork is the parent's tenant's: the caller's.
        fork = await self._log.fork_session(request.session_id, sequence, tenant=tenant)
        return pb.ForkSessionResponse(session=(await self._sessions_to_proto([fork]))[0])

    async def _sessions_to_proto(
        self, sessions: Sequence[domain.Session]
    ) -> list[resources_pb2.Session]:
        """The sessions with the start of their first user message: one read for them all,
        so that a client can list sessions by what they were asked at no extra call."""
        firsts = await self._log.first_user_messages(
            [s.id for s in sessions if s.step_count], FIRST_USER_MESSAGE_CHARS
        )
        return [convert.session_to_proto(s, firsts.get(s.id, "")) for s in sessions]

    async def _refuse_open_calls(
        self, session_id: str, last_kept: int, field: str, edit: str
    ) -> None:
        """INVALID_ARGUMENT when steps 1..last_kept would end with tool calls that no step
        answers: the log must stay valid history (a model refuses a call with no result).
        Reads back from `last_kept` to the assistant step that made the calls. Steps never
        change once stored, so what this reads still holds when the edit runs (or the edit
        finds the steps gone, and says so)."""
        end = last_kept
        tail: list[domain.Step] = []
        while end >= 1:
            start = max(1, end - TAIL_READ + 1)
            try:
                read = await self._log.get_steps(session_id, start, end, tenant=_tenant())
                tail = [*read, *tail]
            except NotFoundError:
                return  # the store's own edit names the missing session
            if not tail or tail[0].role is not domain.Role.TOOL or start == 1:
                break
            end = start - 1
        assistant, open_calls = open_tool_calls(tail)
        if assistant is None or not open_calls:
            return
        names = ", ".join(call.id for call in open_calls)
        raise invalid_argument(
            [
                FieldViolation(
                    field,
                    f"{edit} would leave the tool calls of step {assistant.sequence} without "
                    f"results ({names}): keep up to step {assistant.sequence - 1}, or up to "
                    "the last result of those calls (Retry from a result runs the calls again)",
                )
            ]
        )

    async def GetContext(
        self, request: pb.GetContextRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetContextResponse:
        raise_if_any(
            check_id("session_id", request.session_id),
            check_id("agent", request.agent, required=False),
        )
        tenant = _tenant()
        pages = self._pages.for_tenant(tenant)
        limit = page_size(request.page_size, MAX_CONTEXT_PAGE)
        steps = await self._context.next_context(request.session_id, request.agent, tenant=tenant)
        summary = await self._log.context_summary(request.session_id, tenant=tenant)
        # Bound to the session as it is: a page of a context that changed since is refused.
        query: dict[str, object] = {
            "rpc": "GetContext",
            "session": request.session_id,
            "agent": request.agent,
            "last": summary.max_sequence,
            "steps": summary.total_steps,
        }
        position = sequence_key(pages.decode(request.page_token, query), 2**31)
        start = position or 0
        page = [convert.step_to_proto(s) for s in steps[start : start + limit]]
        del page[fitting(page, self._page_bytes) :]
        end = start + len(page)
        token = pages.encode(query, [end]) if end < len(steps) else ""
        return pb.GetContextResponse(
            messages=page, summary=convert.summary_to_proto(summary), next_page_token=token
        )

    async def CompactSession(
        self, request: pb.CompactSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.CompactSessionResponse:
        raise_if_any(
            check_id("session_id", request.session_id),
            check_id("agent", request.agent, required=False),
            check_non_negative("keep_recent_steps", request.keep_recent_steps),
        )
        done = await self._compactor.compact(
            request.session_id,
            agent=request.agent,
            keep_recent_steps=request.keep_recent_steps or None,
            tenant=_tenant(),
        )
        return pb.CompactSessionResponse(
            summary=convert.step_to_proto(done.summary) if done.summary is not None else None,
            tokens_before=done.tokens_before,
            tokens_after=done.tokens_after,
        )


MAX_CONTEXT_PAGE = 1_000_000
"""GetContext's page size when none is asked for: every message that fits."""
