"""`agio.v1.AgentService`: start, continue, retry, watch and cancel runs.

Streaming handlers write with `context.write` and only relay: the engine runtime owns each
run in its own task. When a streaming client goes away (or its deadline cancels the call)
the handler sees `CancelledError`, cancels the run so its record ends clean (unless the
`Run` asked for DISCONNECT_POLICY_CONTINUE), and re-raises. `StartRun` starts a run no call
follows: it returns the run at once, and the run goes on by itself.
The generated stubs type streaming methods as iterators; these return None because they
write, hence the `override` ignores.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from agio_grpc.domain import BusyPolicy
from agio_grpc.engine.agents import AgentSpec, ClientTool, RunInput, RunOverrides, ToolOutput
from agio_grpc.engine.events import SequencedEvent
from agio_grpc.engine.runtime import Runtime
from agio_grpc.service import convert
from agio_grpc.service.errors import FieldViolation, invalid_argument
from agio_grpc.service.validation import (
    check_id,
    check_non_negative,
    check_positive,
    decode_page_token,
    page_size,
    raise_if_any,
    time_key,
    trim_time_keyed_page,
)
from agio_grpc.store.protocol import StepStore
from agio_grpc.v1 import agent_service_pb2 as pb
from agio_grpc.v1 import agent_service_pb2_grpc, resources_pb2

log = logging.getLogger(__name__)

DEFAULT_RUN_PAGE = 50
MAX_INPUT_CHARS = 1_000_000
MAX_METADATA_ENTRIES = 64
DEADLINE_MARGIN_S = 0.25


def _overrides(request: pb.RunOverrides) -> RunOverrides:
    return RunOverrides(
        model=request.model if request.HasField("model") else None,
        instructions=request.instructions if request.HasField("instructions") else None,
        temperature=request.temperature if request.HasField("temperature") else None,
        max_tokens=request.max_tokens if request.HasField("max_tokens") else None,
        max_steps=request.max_steps if request.HasField("max_steps") else None,
        timeout_s=request.timeout.ToTimedelta().total_seconds()
        if request.HasField("timeout")
        else None,
        tools=list(request.tools.names) if request.HasField("tools") else None,
        token_budget=request.token_budget if request.HasField("token_budget") else None,
    )


_BUSY_POLICIES = {
    pb.BUSY_POLICY_UNSPECIFIED: BusyPolicy.REJECT,
    pb.BUSY_POLICY_REJECT: BusyPolicy.REJECT,
    pb.BUSY_POLICY_ENQUEUE: BusyPolicy.ENQUEUE,
    pb.BUSY_POLICY_INTERRUPT: BusyPolicy.INTERRUPT,
    pb.BUSY_POLICY_ROLLBACK: BusyPolicy.ROLLBACK,
}
_DISCONNECT_POLICIES = (
    pb.DISCONNECT_POLICY_UNSPECIFIED,
    pb.DISCONNECT_POLICY_CANCEL,
    pb.DISCONNECT_POLICY_CONTINUE,
)


def _check_run_request(request: pb.RunRequest) -> None:
    violations = [
        check_id("session_id", request.session_id, required=False),
        check_id("agent", request.agent, required=False),
        check_id("request_id", request.request_id, required=False),
    ]
    if not request.input.strip():
        violations.append(FieldViolation("input", "is required"))
    elif len(request.input) > MAX_INPUT_CHARS:
        violations.append(FieldViolation("input", f"must be at most {MAX_INPUT_CHARS} characters"))
    if len(request.metadata) > MAX_METADATA_ENTRIES:
        violations.append(
            FieldViolation("metadata", f"must have at most {MAX_METADATA_ENTRIES} entries")
        )
    for index, tool in enumerate(request.client_tools):
        violations.append(check_id(f"client_tools[{index}].name", tool.name))
    if request.on_busy not in _BUSY_POLICIES:
        violations.append(FieldViolation("on_busy", f"unknown BusyPolicy {request.on_busy}"))
    if request.on_disconnect not in _DISCONNECT_POLICIES:
        violations.append(
            FieldViolation("on_disconnect", f"unknown DisconnectPolicy {request.on_disconnect}")
        )
    raise_if_any(*violations)


def _run_input(request: pb.RunRequest, deadline_s: float | None) -> RunInput:
    _check_run_request(request)
    return RunInput(
        input=request.input,
        session_id=request.session_id,
        agent=request.agent,
        overrides=_overrides(request.overrides),
        client_tools=[
            ClientTool(t.name, t.description, t.parameters_json) for t in request.client_tools
        ],
        request_id=request.request_id,
        metadata=dict(request.metadata),
        deadline_s=deadline_s,
        on_busy=_BUSY_POLICIES[request.on_busy],
    )


def _deadline_s(context: grpc.aio.ServicerContext) -> float | None:
    """The time the run may take: the caller's deadline less a margin, so the run stops with
    TIMEOUT and its terminal event still reaches the caller before gRPC cuts the call."""
    remaining: float | None = context.time_remaining()
    if remaining is None:
        return None
    margin = min(DEADLINE_MARGIN_S, remaining * 0.1)
    return max(remaining - margin, 0.0)


class AgentServicer(agent_service_pb2_grpc.AgentServiceServicer):
    """Serves AgentService from the engine runtime and the store."""

    def __init__(self, runtime: Runtime, store: StepStore) -> None:
        self._runtime = runtime
        self._store = store

    async def _relay(
        self,
        run_id: str,
        events: AsyncIterator[SequencedEvent],
        context: grpc.aio.ServicerContext,
        *,
        owns_run: bool,
    ) -> None:
        """Write every event to the caller; a caller that leaves an owned run cancels it."""
        try:
            async for event in events:
                await context.write(convert.event_to_proto(event))
        except asyncio.CancelledError:
            if owns_run:
                # The run must not outlive its only watcher unseen; its row ends CANCELLED.
                cancel = asyncio.ensure_future(
                    self._runtime.cancel(run_id, "client disconnected", source="client")
                )
                try:
                    await asyncio.shield(cancel)
                except asyncio.CancelledError:
                    pass
                except Exception:
                    log.exception("cancelling run %s after a disconnect failed", run_id)
            raise

    async def Run(  # type: ignore[override]
        self, request: pb.RunRequest, context: grpc.aio.ServicerContext
    ) -> None:
        # A run that outlives its caller is not cut off by the caller's deadline either.
        stays = request.on_disconnect == pb.DISCONNECT_POLICY_CONTINUE
        run_input = _run_input(request, None if stays else _deadline_s(context))
        handle = await self._runtime.start_run(run_input)
        await self._relay(handle.run_id, handle.events(), context, owns_run=not stays)

    async def StartRun(
        self, request: pb.RunRequest, context: grpc.aio.ServicerContext
    ) -> pb.StartRunResponse:
        # No caller follows the run: neither the call's deadline nor its end stop it.
        handle = await self._runtime.start_run(_run_input(request, None))
        return pb.StartRunResponse(run=convert.run_to_proto(handle.run))

    async def SubmitToolOutputs(  # type: ignore[override]
        self, request: pb.SubmitToolOutputsRequest, context: grpc.aio.ServicerContext
    ) -> None:
        raise_if_any(check_id("run_id", request.run_id))
        if not request.tool_outputs:
            raise invalid_argument([FieldViolation("tool_outputs", "is required")])
        outputs = [ToolOutput(o.tool_call_id, o.output, o.is_error) for o in request.tool_outputs]
        handle = await self._runtime.submit_tool_outputs(
            request.run_id, outputs, deadline_s=_deadline_s(context)
        )
        await self._relay(handle.run_id, handle.events(), context, owns_run=True)

    async def Retry(  # type: ignore[override]
        self, request: pb.RetryRequest, context: grpc.aio.ServicerContext
    ) -> None:
        raise_if_any(
            check_id("session_id", request.session_id),
            check_positive("sequence", request.sequence),
        )
        handle = await self._runtime.retry(
            request.session_id, request.sequence, deadline_s=_deadline_s(context)
        )
        await self._relay(handle.run_id, handle.events(), context, owns_run=True)

    async def WatchRun(  # type: ignore[override]
        self, request: pb.WatchRunRequest, context: grpc.aio.ServicerContext
    ) -> None:
        raise_if_any(
            check_id("run_id", request.run_id),
            check_non_negative("after_seq", request.after_seq),
        )
        await self._store.get_run(request.run_id)  # NOT_FOUND before the stream starts
        events = self._runtime.watch(request.run_id, request.after_seq)
        await self._relay(request.run_id, events, context, owns_run=False)

    async def CancelRun(
        self, request: pb.CancelRunRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelRunResponse:
        raise_if_any(check_id("run_id", request.run_id))
        if len(request.reason) > 1000:
            raise invalid_argument([FieldViolation("reason", "must be at most 1000 characters")])
        run = await self._runtime.cancel(
            request.run_id, request.reason or "cancelled by the client", source="client"
        )
        return pb.CancelRunResponse(run=convert.run_to_proto(run))

    async def GetRun(
        self, request: pb.GetRunRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRunResponse:
        raise_if_any(check_id("run_id", request.run_id))
        run = await self._store.get_run(request.run_id)
        return pb.GetRunResponse(run=convert.run_to_proto(run))

    async def ListRuns(
        self, request: pb.ListRunsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRunsResponse:
        raise_if_any(check_id("session_id", request.session_id))
        limit = page_size(request.page_size, DEFAULT_RUN_PAGE)
        query: dict[str, object] = {"rpc": "ListRuns", "session": request.session_id}
        after = time_key(decode_page_token(request.page_token, query))
        await self._store.get_session(request.session_id)
        runs, token = trim_time_keyed_page(
            await self._store.list_runs(request.session_id, limit + 1, after), limit, query
        )
        return pb.ListRunsResponse(
            runs=[convert.run_to_proto(r) for r in runs], next_page_token=token
        )

    async def ListAgents(
        self, request: pb.ListAgentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListAgentsResponse:
        return pb.ListAgentsResponse(
            agents=[
                resources_pb2.Agent(
                    name=agent.name,
                    model=agent.model,
                    instructions=agent.instructions,
                    tools=[
                        resources_pb2.ToolDefinition(
                            name=tool.name,
                            description=tool.description,
                            parameters_json=tool.parameters_json,
                        )
                        for tool in _tool_definitions(self._runtime, agent.tools)
                    ],
                )
                for agent in self._agents_default_first()
            ]
        )

    def _agents_default_first(self) -> list[AgentSpec]:
        default = self._runtime.agent()
        return [default, *(a for a in self._runtime.agents.values() if a is not default)]


@dataclass(frozen=True, slots=True)
class _ToolInfo:
    name: str
    description: str
    parameters_json: str


def _tool_definitions(runtime: Runtime, names: list[str]) -> list[_ToolInfo]:
    """The agent's server tools as offered to the model (name, description, JSON schema)."""
    return [
        _ToolInfo(
            name=entry["function"]["name"],
            description=entry["function"].get("description", ""),
            parameters_json=json.dumps(entry["function"].get("parameters", {})),
        )
        for entry in runtime.registry.definitions(names)
    ]
