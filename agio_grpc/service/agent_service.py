"""`agio.v1.AgentService`: start, continue, retry, watch and cancel runs.

Streaming handlers write with `context.write` and only relay: the engine runtime owns each
run in its own task. When a streaming client goes away (or its deadline cancels the call)
the handler sees `CancelledError`, cancels the run so its record ends clean (unless the
`Run` asked for DISCONNECT_POLICY_CONTINUE), and re-raises. `StartRun` starts a run no call
follows: it returns the run at once, and the run goes on by itself.
The generated stubs type streaming methods as iterators; these return None because they
write, hence the `override` ignores. Every call acts in the caller's tenant
(`current_caller().tenant`): a run or session of another tenant's answers as a missing one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from agio_grpc.config import MAX_STEPS_LIMIT, RequestLimitsConfig, ServerConfig
from agio_grpc.domain import BusyPolicy, StopSignal
from agio_grpc.engine.agents import AgentSpec, ClientTool, RunInput, RunOverrides, ToolOutput
from agio_grpc.engine.approvals import ToolApproval
from agio_grpc.engine.events import SequencedEvent
from agio_grpc.engine.lifecycle import cancelled, server_fault
from agio_grpc.engine.output import OutputSchemaError, schema_from_text
from agio_grpc.engine.remote import FollowedEvent, RelayedEvent
from agio_grpc.engine.runtime import Runtime
from agio_grpc.engine.segments import RunHandle
from agio_grpc.service import convert
from agio_grpc.service.errors import FieldViolation, deadline_too_short
from agio_grpc.service.identity import current_caller
from agio_grpc.service.validation import (
    PageTokens,
    ToolSchemaChecks,
    check_duration,
    check_id,
    check_non_negative,
    check_positive,
    check_range,
    check_size,
    duration_seconds,
    fitting,
    map_entry_path,
    page_size,
    raise_if_any,
    time_key,
)
from agio_grpc.v1 import agent_service_pb2 as pb
from agio_grpc.v1 import agent_service_pb2_grpc, events_pb2, resources_pb2

log = logging.getLogger(__name__)

DEFAULT_RUN_PAGE = 50
MAX_CANCEL_REASON_CHARS = 1000
# A run names at most this many tools in `require_approval` (an agent offers fewer).
MAX_REQUIRE_APPROVAL = 256
DEADLINE_MARGIN_S = 0.25
DEADLINE_MARGIN_SHARE = 0.1
MAX_DEADLINE_MARGIN_S = 2.0
MIN_RUN_DEADLINE_S = 0.25
"""The shortest time left on a call that starts a run: less cannot both start it and send
the TIMEOUT that ends it before the caller's deadline."""
UNSENDABLE_EVENT_REASON = "an event of the run could not be encoded for its client"


def _overrides(request: pb.RunOverrides) -> RunOverrides:
    return RunOverrides(
        model=request.model if request.HasField("model") else None,
        instructions=request.instructions if request.HasField("instructions") else None,
        temperature=request.temperature if request.HasField("temperature") else None,
        max_tokens=request.max_tokens if request.HasField("max_tokens") else None,
        max_steps=request.max_steps if request.HasField("max_steps") else None,
        timeout_s=duration_seconds(request.timeout) if request.HasField("timeout") else None,
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


def _run_request_violations(
    request: pb.RunRequest, config: ServerConfig
) -> list[FieldViolation | None]:
    """What is wrong with a RunRequest, client tool schemas aside (`ToolSchemaChecks`)."""
    limits = config.request_limits
    violations = [
        check_id("session_id", request.session_id, required=False),
        check_id("agent", request.agent, required=False),
        check_id("request_id", request.request_id, required=False),
        *_overrides_violations(request.overrides, config),
        *_metadata_violations(request.metadata, limits),
        *_client_tool_violations(request.client_tools, limits),
    ]
    if len(request.require_approval) > MAX_REQUIRE_APPROVAL:
        violations.append(
            FieldViolation("require_approval", f"must name at most {MAX_REQUIRE_APPROVAL} tools")
        )
    if not request.input.strip():
        violations.append(FieldViolation("input", "is required"))
    else:
        violations.append(check_size("input", request.input, limits.max_input_bytes))
    if request.on_busy not in _BUSY_POLICIES:
        violations.append(FieldViolation("on_busy", f"unknown BusyPolicy {request.on_busy}"))
    if request.on_disconnect not in _DISCONNECT_POLICIES:
        violations.append(
            FieldViolation("on_disconnect", f"unknown DisconnectPolicy {request.on_disconnect}")
        )
    return violations


def _overrides_violations(
    overrides: pb.RunOverrides, config: ServerConfig
) -> list[FieldViolation | None]:
    found: list[FieldViolation | None] = []
    if overrides.HasField("instructions"):
        limit = config.request_limits.max_instructions_bytes
        found.append(check_size("overrides.instructions", overrides.instructions, limit))
    if overrides.HasField("max_tokens"):
        found.append(check_range("overrides.max_tokens", overrides.max_tokens, 1))
    if overrides.HasField("max_steps"):
        found.append(check_range("overrides.max_steps", overrides.max_steps, 1, MAX_STEPS_LIMIT))
    if overrides.HasField("token_budget"):
        found.append(check_range("overrides.token_budget", overrides.token_budget, 1))
    if overrides.HasField("timeout"):
        found.append(
            check_duration("overrides.timeout", overrides.timeout, config.max_run_timeout_s)
        )
    return found


def _metadata_violations(
    metadata: Mapping[str, str], limits: RequestLimitsConfig
) -> list[FieldViolation | None]:
    if len(metadata) > limits.max_metadata_entries:
        return [
            FieldViolation("metadata", f"must have at most {limits.max_metadata_entries} entries")
        ]
    found: list[FieldViolation | None] = []
    long_key = FieldViolation(
        "metadata", f"keys must be at most {limits.max_metadata_key_bytes} bytes (UTF-8)"
    )
    for key, value in metadata.items():
        if check_size("", key, limits.max_metadata_key_bytes) is not None:
            found.append(long_key)
            continue
        where = map_entry_path("metadata", key)
        found.append(check_size(where, value, limits.max_metadata_value_bytes))
    return list(dict.fromkeys(found))  # a long key is reported once


def _client_tool_violations(
    tools: Sequence[resources_pb2.ToolDefinition], limits: RequestLimitsConfig
) -> list[FieldViolation | None]:
    if len(tools) > limits.max_client_tools:
        return [
            FieldViolation("client_tools", f"must have at most {limits.max_client_tools} tools")
        ]
    found: list[FieldViolation | None] = []
    for index, tool in enumerate(tools):
        where = f"client_tools[{index}]"
        found.append(check_id(f"{where}.name", tool.name))
        found.append(
            check_size(f"{where}.description", tool.description, limits.max_tool_description_bytes)
        )
    return found


def _to_run_input(request: pb.RunRequest, tenant: str) -> RunInput:
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
        on_busy=_BUSY_POLICIES[request.on_busy],
        tenant=tenant,
        require_approval=list(dict.fromkeys(request.require_approval)),
    )


def _deadline_at(context: grpc.aio.ServicerContext) -> float | None:
    """When the run must end (the event loop's time): the caller's deadline less a margin,
    so the run stops with TIMEOUT and its terminal event still reaches the caller before
    gRPC cuts the call, however long the run took to start. A deadline too close to start
    a run and send its end is refused (DEADLINE_EXCEEDED `DEADLINE_TOO_SHORT`)."""
    remaining: float | None = context.time_remaining()
    if remaining is None:
        return None
    if remaining < MIN_RUN_DEADLINE_S:
        raise deadline_too_short(remaining, MIN_RUN_DEADLINE_S)
    # A tenth of the time, within bounds: under load, ending a run and sending its end take
    # longer, and a run that is given longer has more to end.
    margin = min(max(DEADLINE_MARGIN_S, remaining * DEADLINE_MARGIN_SHARE), MAX_DEADLINE_MARGIN_S)
    left = max(remaining - min(margin, remaining * 0.5), 0.0)
    return asyncio.get_running_loop().time() + left


def _encoded(event: SequencedEvent) -> tuple[events_pb2.StepEvent, bool]:
    """The event as streamed, and whether it was itself (else its stand-in)."""
    try:
        return convert.event_to_proto(event), True
    except Exception:
        # A server fault, not the caller's: logged with its traceback, without content.
        log.exception(
            "run %s: event %d (%s) could not be encoded; a stand-in was sent",
            event.run_id,
            event.seq,
            event.event.type,
        )
        return convert.unsendable_event(event), False


class AgentServicer(agent_service_pb2_grpc.AgentServiceServicer):
    """Serves AgentService from the engine runtime and the store."""

    def __init__(
        self,
        runtime: Runtime,
        config: ServerConfig | None = None,
        pages: PageTokens | None = None,
    ) -> None:
        """`pages` signs page tokens (the store's shared key: `PageTokens`)."""
        self._runtime = runtime
        self._config = config or ServerConfig()
        self._pages = pages or PageTokens()
        self._page_bytes = self._config.max_message_bytes * 3 // 4
        self._schemas = ToolSchemaChecks(self._config.request_limits)

    async def run_input(self, request: pb.RunRequest) -> RunInput:
        """The run the request asks for, in the caller's tenant (no deadline yet);
        INVALID_ARGUMENT naming all that is wrong with it."""
        violations = _run_request_violations(request, self._config)
        if len(request.client_tools) <= self._config.request_limits.max_client_tools:
            violations += await self._schemas.violations(
                [
                    (f"client_tools[{index}].parameters_json", tool.parameters_json)
                    for index, tool in enumerate(request.client_tools)
                ]
            )
        schema: dict[str, Any] | None = None
        if request.output_schema_json:
            try:
                # Off the event loop: the metaschema check of a large schema takes a while.
                schema = await asyncio.to_thread(schema_from_text, request.output_schema_json)
            except OutputSchemaError as error:
                violations.append(FieldViolation("output_schema_json", str(error)))
        raise_if_any(*violations)
        run_input = _to_run_input(request, current_caller().tenant)
        run_input.output_schema = schema
        return run_input

    async def _relay(
        self,
        run_id: str,
        events: AsyncIterator[FollowedEvent],
        context: grpc.aio.ServicerContext,
        *,
        owns_run: bool,
    ) -> None:
        """Write every event to the caller; a caller that leaves an owned run cancels it.

        An event that cannot be encoded never cuts the stream while the run goes on: its
        place is taken by `convert.unsendable_event` (same seq), the run is ended, and the
        stream still closes with exactly one terminal event.
        """
        ending = False  # the run is being ended for an event that could not be sent
        try:
            async for event in events:
                if isinstance(event, RelayedEvent):  # a StepEvent from the member running it
                    await context.write(event.message)
                    continue
                message, sendable = _encoded(event)
                await context.write(message)
                if not sendable and not event.is_terminal and not ending:
                    ending = True
                    await self._stop(run_id, server_fault(UNSENDABLE_EVENT_REASON))
        except asyncio.CancelledError:
            if owns_run:
                # The run must not outlive its only watcher unseen; its row ends CANCELLED.
                with contextlib.suppress(asyncio.CancelledError):
                    await self._stop(run_id, cancelled("client disconnected", "client"))
            raise

    async def _stop(self, run_id: str, signal: StopSignal) -> None:
        """Stop the run and wait for its end to be recorded; the stop goes on to the end
        even if this call is cancelled meanwhile."""
        stop = asyncio.ensure_future(self._runtime.stop(run_id, signal))
        try:
            await asyncio.shield(stop)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("stopping run %s (%s) failed", run_id, signal.reason.value)

    async def Run(  # type: ignore[override]
        self, request: pb.RunRequest, context: grpc.aio.ServicerContext
    ) -> None:
        run_input = await self.run_input(request)
        # A run that outlives its caller is not cut off by the caller's deadline either. Read
        # after the checks, which take time.
        stays = request.on_disconnect == pb.DISCONNECT_POLICY_CONTINUE
        if not stays:
            run_input.deadline_at = _deadline_at(context)
            run_input.followed = True  # this call's end cancels the run, queued or not
        handle = await self._runtime.start_run(run_input)
        await self._relay(handle.run_id, handle.events(), context, owns_run=not stays)

    async def StartRun(
        self, request: pb.RunRequest, context: grpc.aio.ServicerContext
    ) -> pb.StartRunResponse:
        # No caller follows the run: neither the call's deadline nor its end stop it.
        handle = await self._runtime.start_run(await self.run_input(request))
        return pb.StartRunResponse(run=convert.run_to_proto(handle.run))

    async def SubmitToolOutputs(  # type: ignore[override]
        self, request: pb.SubmitToolOutputsRequest, context: grpc.aio.ServicerContext
    ) -> None:
        handle = await self.submit(request, _deadline_at(context))
        await self._relay(handle.run_id, handle.events(), context, owns_run=True)

    async def submit(
        self, request: pb.SubmitToolOutputsRequest, deadline_at: float | None
    ) -> RunHandle:
        """Resume the waiting run with the request's tool outputs and approval decisions, as
        the caller; INVALID_ARGUMENT naming all that is wrong with the request."""
        limit = self._config.request_limits.max_tool_output_bytes
        violations = [check_id("run_id", request.run_id)]
        if not request.tool_outputs and not request.approvals:
            violations.append(FieldViolation("tool_outputs", "is required (or approvals)"))
        for index, output in enumerate(request.tool_outputs):
            violations.append(check_size(f"tool_outputs[{index}].output", output.output, limit))
        for index, approval in enumerate(request.approvals):
            violations.append(check_size(f"approvals[{index}].reason", approval.reason, limit))
        raise_if_any(*violations)
        outputs = [ToolOutput(o.tool_call_id, o.output, o.is_error) for o in request.tool_outputs]
        approvals = [ToolApproval(a.tool_call_id, a.approved, a.reason) for a in request.approvals]
        caller = current_caller()
        return await self._runtime.submit_tool_outputs(
            request.run_id,
            outputs,
            deadline_at=deadline_at,
            tenant=caller.tenant,
            approvals=approvals,
            decided_by=caller.subject or caller.mode,
        )

    async def Retry(  # type: ignore[override]
        self, request: pb.RetryRequest, context: grpc.aio.ServicerContext
    ) -> None:
        raise_if_any(
            check_id("session_id", request.session_id),
            check_positive("sequence", request.sequence),
        )
        handle = await self._runtime.retry(
            request.session_id,
            request.sequence,
            deadline_at=_deadline_at(context),
            tenant=current_caller().tenant,
        )
        await self._relay(handle.run_id, handle.events(), context, owns_run=True)

    async def WatchRun(  # type: ignore[override]
        self, request: pb.WatchRunRequest, context: grpc.aio.ServicerContext
    ) -> None:
        raise_if_any(
            check_id("run_id", request.run_id),
            check_non_negative("after_seq", request.after_seq),
        )
        # NOT_FOUND (a run of another tenant's too) before the stream starts.
        await self._runtime.runs.get_run(request.run_id, tenant=current_caller().tenant)
        events = self._runtime.follow(request.run_id, request.after_seq)
        await self._relay(request.run_id, events, context, owns_run=False)

    async def CancelRun(
        self, request: pb.CancelRunRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelRunResponse:
        violations = [check_id("run_id", request.run_id)]
        if len(request.reason) > MAX_CANCEL_REASON_CHARS:
            violations.append(
                FieldViolation("reason", f"must be at most {MAX_CANCEL_REASON_CHARS} characters")
            )
        raise_if_any(*violations)
        run = await self._runtime.cancel(
            request.run_id,
            request.reason or "cancelled by the client",
            source="client",
            tenant=current_caller().tenant,
        )
        return pb.CancelRunResponse(run=convert.run_to_proto(run))

    async def GetRun(
        self, request: pb.GetRunRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRunResponse:
        raise_if_any(check_id("run_id", request.run_id))
        run = await self._runtime.runs.get_run(request.run_id, tenant=current_caller().tenant)
        return pb.GetRunResponse(run=convert.run_to_proto(run))

    async def ListRuns(
        self, request: pb.ListRunsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRunsResponse:
        raise_if_any(check_id("session_id", request.session_id))
        tenant = current_caller().tenant
        pages = self._pages.for_tenant(tenant)
        limit = page_size(request.page_size, DEFAULT_RUN_PAGE)
        query: dict[str, object] = {"rpc": "ListRuns", "session": request.session_id}
        after = time_key(pages.decode(request.page_token, query))
        await self._runtime.log.get_session(request.session_id, tenant=tenant)
        reads = self._runtime.runs
        runs = await reads.list_runs(request.session_id, limit + 1, after, tenant=tenant)
        page = [convert.run_to_proto(r) for r in runs[:limit]]
        del page[fitting(page, self._page_bytes) :]
        runs, token = pages.trim_time_keyed(runs, len(page), query)
        return pb.ListRunsResponse(runs=page, next_page_token=token)

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
                            unavailable=bool(tool.unavailable_reason),
                            source=tool.source,
                            unavailable_reason=tool.unavailable_reason,
                        )
                        for tool in _tool_definitions(self._runtime, agent)
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
    unavailable_reason: str
    source: str


def _tool_definitions(runtime: Runtime, agent: AgentSpec) -> list[_ToolInfo]:
    """The agent's server tools (name, description, JSON schema, where they run), those the
    model cannot be offered now included, with the reason why. An MCP tool's schema is the
    one its server listed last (an empty object schema if it never listed the tool)."""
    infos = []
    for name in runtime.registry.agent_tools(agent.tools, agent.mcp_servers):
        tool = runtime.registry.get(name)
        if tool is None:
            continue
        infos.append(
            _ToolInfo(
                name=tool.name,
                description=tool.description,
                parameters_json=json.dumps(tool.parameters),
                unavailable_reason=tool.unavailable_reason,
                source=tool.source,
            )
        )
    return infos
