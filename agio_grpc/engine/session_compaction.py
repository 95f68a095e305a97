"""`SessionCompactor`: CompactSession, a compaction between runs (engine/compaction.py).

Reads the session's history, plans the cut with the agent's settings (or the caller's
`keep_recent_steps`), has the summary written by one model call (a part at a time, for a
backlog longer than one summary request may hold), and stores each summary step only while
no run holds the session and its log still ends where it was read: a run that started, or
steps appended, meanwhile refuse the write (SessionBusyError, HistoryChangedError) and the
summary is not stored. Never imports grpc.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agio_grpc.domain import Role, Run, Step
from agio_grpc.engine.agents import AgentSpec, RunOverrides, resolve_settings
from agio_grpc.engine.compaction import (
    MAX_COMPACTIONS_PER_CALL,
    Compacting,
    token_count_for,
)
from agio_grpc.engine.context import context_steps, open_tool_calls
from agio_grpc.engine.errors import CompactionFailedError
from agio_grpc.engine.history import mark_of
from agio_grpc.engine.models import ModelDriver, ModelError
from agio_grpc.engine.tools import ToolRegistry
from agio_grpc.engine.tracing import RunTracer
from agio_grpc.store.errors import RunRequiresActionError, SessionBusyError
from agio_grpc.store.log import SessionLog


@dataclass(frozen=True, slots=True)
class SessionCompaction:
    """What CompactSession did: the summary step the context now starts from (None: nothing
    to summarize; a backlog too long for one summary request leaves a summary per part, each
    taking in the one before), and the estimated prompt tokens before and after."""

    summary: Step | None
    tokens_before: int
    tokens_after: int


class SessionCompactor:
    """Compacts sessions on request."""

    def __init__(
        self,
        store: SessionLog,
        model: ModelDriver,
        registry: ToolRegistry,
        tracer: RunTracer,
        agent: Callable[[str], AgentSpec],
    ) -> None:
        self._store = store
        self._model = model
        self._registry = registry
        self._tracer = tracer
        self._agent = agent

    async def compact(
        self,
        session_id: str,
        *,
        agent: str = "",
        keep_recent_steps: int | None = None,
        tenant: str | None = None,
    ) -> SessionCompaction:
        """Summarize the session's older steps now. Raises AgentNotFoundError, NotFoundError,
        SessionBusyError, RunRequiresActionError (the log ends with tool calls waiting for
        their outputs), HistoryChangedError, CompactionFailedError (the summary call
        failed)."""
        spec = self._agent(agent)
        settings = resolve_settings(spec, RunOverrides(), [])
        session = await self._store.get_session(session_id, tenant=tenant)
        if session.active_run_id:  # refused before the summary call, not only at the write
            raise SessionBusyError(session_id, session.active_run_id)
        history = await self._store.get_history(session_id)
        waiting, calls = open_tool_calls(history)
        if waiting is not None and calls:  # a summary now would refuse its tool outputs
            raise RunRequiresActionError(session_id, waiting.run_id)
        compacting = Compacting.planned(
            settings, self._registry, history, "request", keep_recent_steps
        )
        if compacting is None:
            context = context_steps(
                settings.instructions, history, settings.limits.max_history_messages
            )
            tools = self._registry.definitions(settings.tools)
            tokens = token_count_for(settings.model).prompt(context, tools)
            return SessionCompaction(None, tokens, tokens)
        run = Run(session_id=session_id, agent=spec.name, tenant=session.tenant)
        trace = self._tracer.outside_run(run, settings)
        tokens_before = compacting.tokens_before
        stored: Step | None = None
        # A backlog too long for one summary request is summarized a part at a time.
        for _ in range(MAX_COMPACTIONS_PER_CALL):
            step = Step(session_id, "", Role.SUMMARY)
            sequence = (history[-1].sequence if history else 0) + 1
            try:
                summary = await compacting.summarize(self._model, trace, step, sequence)
            except ModelError as error:
                raise CompactionFailedError(
                    error.message,
                    retryable=error.retryable,
                    status_code=error.status_code,
                    error_code=error.error_code,
                ) from None
            stored = await self._store.append_to_idle_session(
                summary.step, after=mark_of(history), tenant=tenant
            )
            trace.compacted("request", summary.tokens_before, summary.tokens_after)
            history = [*history, stored]
            more = Compacting.planned(
                settings, self._registry, history, "request", keep_recent_steps, after=summary
            )
            if more is None:
                break
            compacting = more
        return SessionCompaction(stored, tokens_before, summary.tokens_after)
