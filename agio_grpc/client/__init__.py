"""A typed async Python client for agio-grpc.

Wraps the generated stubs: run streams as async iterators of `StepEvent`, a convenience
that runs to the end and returns the final text and StopSignal, auto-paging step listing,
and errors decoded into `AgioError` with the `google.rpc.ErrorInfo` reason. Every call
carries the caller's current OpenTelemetry trace context (`traceparent`), so a run joins
the caller's trace, and the client's credential (`token`) if it has one.

    async with AgioClient("127.0.0.1:50051") as client:
        result = await client.run_to_end("What is 12 * 7?")
        print(result.text, result.stop_signal.reason)

A run whose answer must be JSON of a schema (a pydantic model, or a JSON Schema mapping):

        result = await client.run_to_end("Paris?", output_schema=City)
        city = result.output  # a City, or None when the run ended without a valid answer

Over TLS, with a token (mutual TLS: the client's certificate and key as well):

    tls = TlsConfig(ca_file="ca.pem", cert_file="client.pem", key_file="client.key")
    async with AgioClient("agio.internal:50051", tls=tls, token=token) as client: ...
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agio_grpc.client.channels import (
    ROUND_ROBIN,
    AddressError,
    TlsConfig,
    TlsFileError,
    channel_target,
    open_channel,
)
from agio_grpc.client.errors import TLS_HINTS, AgioError, TlsFailure, decode_error, tls_failure
from agio_grpc.client.runs import (
    OutputSchema,
    RunResult,
    collect,
    output_schema_json,
    output_value,
    run_request,
)
from agio_grpc.telemetry.propagation import trace_metadata
from agio_grpc.v1 import (
    agent_service_pb2,
    agent_service_pb2_grpc,
    events_pb2,
    resources_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
)

__all__ = [
    "ROUND_ROBIN",
    "TLS_HINTS",
    "AddressError",
    "AgioClient",
    "AgioError",
    "OutputSchema",
    "RunResult",
    "StepEvent",
    "TlsConfig",
    "TlsFailure",
    "TlsFileError",
    "channel_target",
    "collect",
    "decode_error",
    "open_channel",
    "output_schema_json",
    "output_value",
    "tls_failure",
]


StepEvent = events_pb2.StepEvent


class AgioClient:
    """One channel to an agio-grpc service and typed calls on it.

    `target`: one server's `host:port`, a gRPC target (`dns:///agio.internal:50051`), or
    several servers' addresses (a list, or one comma-separated string); the channel
    spreads calls over them round robin (`open_channel`). Each client has connections of
    its own, so several clients of one `serve --workers N` address spread over its workers.

    `tls`: False for plaintext, True for TLS with gRPC's default roots, or a TlsConfig.
    `token`: sent as `authorization: Bearer TOKEN` with every call the client makes (the
    raw stubs, `agents` and `sessions`, need it in their own `metadata`). `channel`: one
    the caller made instead (then `tls` is not used).
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        channel: grpc.aio.Channel | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        token: str | None = None,
        tls: TlsConfig | bool = False,
    ) -> None:
        self._channel = channel or open_channel(target, tls)
        self._tls = None if channel else tls is not False
        credential = (("authorization", f"Bearer {token}"),) if token else ()
        self._metadata = credential + tuple(metadata)
        self.agents = agent_service_pb2_grpc.AgentServiceStub(self._channel)
        self.sessions = session_service_pb2_grpc.SessionServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def __aenter__(self) -> AgioClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    def _call_metadata(self) -> tuple[tuple[str, str], ...]:
        """The client's metadata plus the current trace context (`traceparent`), if any."""
        return self._metadata + trace_metadata()

    async def _unary(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        try:
            return await method(request, metadata=self._call_metadata(), timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise decode_error(error, tls=self._tls) from None

    async def _stream(
        self, method: Any, request: Any, timeout: float | None = None
    ) -> AsyncIterator[events_pb2.StepEvent]:
        call = method(request, metadata=self._call_metadata(), timeout=timeout)
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as error:
            raise decode_error(error, tls=self._tls) from None
        finally:
            call.cancel()

    # -- runs ---------------------------------------------------------------------------

    def run(
        self,
        input: str,
        *,
        session_id: str = "",
        agent: str = "",
        overrides: agent_service_pb2.RunOverrides | None = None,
        client_tools: Iterable[resources_pb2.ToolDefinition | Mapping[str, str]] = (),
        require_approval: Iterable[str] = (),
        request_id: str = "",
        metadata: Mapping[str, str] | None = None,
        on_busy: agent_service_pb2.BusyPolicy = agent_service_pb2.BUSY_POLICY_REJECT,
        on_disconnect: agent_service_pb2.DisconnectPolicy = (
            agent_service_pb2.DISCONNECT_POLICY_CANCEL
        ),
        output_schema: OutputSchema | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """Start a run and stream its events; the last one is run_completed or run_failed.

        Leaving the iteration early cancels the call, which cancels the run on the server
        (unless `on_disconnect` is DISCONNECT_POLICY_CONTINUE). `on_busy` says what to do
        when the session has a running, queued or waiting run (REJECT, ENQUEUE, INTERRUPT,
        ROLLBACK). `output_schema` (a JSON Schema, or a pydantic model class) is what the
        final answer must be: the terminal event's run carries it as `output`.
        """
        request = run_request(
            input,
            session_id=session_id,
            agent=agent,
            overrides=overrides,
            client_tools=client_tools,
            require_approval=require_approval,
            request_id=request_id,
            metadata=metadata,
            on_busy=on_busy,
            on_disconnect=on_disconnect,
            output_schema=output_schema,
        )
        return self._stream(self.agents.Run, request, timeout)

    async def start_run(
        self,
        input: str,
        *,
        session_id: str = "",
        agent: str = "",
        overrides: agent_service_pb2.RunOverrides | None = None,
        client_tools: Iterable[resources_pb2.ToolDefinition | Mapping[str, str]] = (),
        require_approval: Iterable[str] = (),
        request_id: str = "",
        metadata: Mapping[str, str] | None = None,
        on_busy: agent_service_pb2.BusyPolicy = agent_service_pb2.BUSY_POLICY_REJECT,
        output_schema: OutputSchema | None = None,
        timeout: float | None = None,
    ) -> resources_pb2.Run:
        """Start a run in the background and return it at once (RUNNING, or QUEUED behind a
        busy session); follow it with `follow_run`, stop it with `cancel_run`."""
        request = run_request(
            input,
            session_id=session_id,
            agent=agent,
            overrides=overrides,
            client_tools=client_tools,
            require_approval=require_approval,
            request_id=request_id,
            metadata=metadata,
            on_busy=on_busy,
            output_schema=output_schema,
        )
        response = await self._unary(self.agents.StartRun, request, timeout)
        run: resources_pb2.Run = response.run
        return run

    def submit_tool_outputs(
        self,
        run_id: str,
        outputs: Iterable[agent_service_pb2.ToolOutput],
        *,
        approvals: Iterable[agent_service_pb2.ToolApproval] = (),
        timeout: float | None = None,
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """Continue a REQUIRES_ACTION run with the client tools' outputs and the decisions on
        its calls waiting for approval: all of `Run.required_action` at once."""
        request = agent_service_pb2.SubmitToolOutputsRequest(
            run_id=run_id, tool_outputs=list(outputs), approvals=list(approvals)
        )
        return self._stream(self.agents.SubmitToolOutputs, request, timeout)

    def approve(
        self, run_id: str, *tool_call_ids: str, reason: str = "", timeout: float | None = None
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """Approve calls of a run waiting for approval (every one it waits for when no id is
        given) and follow the run as it goes on. A run that also waits for client outputs
        needs `submit_tool_outputs` with both."""
        return self._decide(run_id, tool_call_ids, True, reason, timeout)

    def reject(
        self, run_id: str, *tool_call_ids: str, reason: str = "", timeout: float | None = None
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """Reject calls of a run waiting for approval (every one when no id is given): the
        model sees each was rejected, and `reason`; follow the run as it goes on."""
        return self._decide(run_id, tool_call_ids, False, reason, timeout)

    async def _decide(
        self,
        run_id: str,
        tool_call_ids: tuple[str, ...],
        approved: bool,
        reason: str,
        timeout: float | None,
    ) -> AsyncIterator[events_pb2.StepEvent]:
        ids = list(tool_call_ids)
        if not ids:
            run = await self.get_run(run_id)
            ids = [call.id for call in run.required_action.approvals]
        decisions = [
            agent_service_pb2.ToolApproval(tool_call_id=i, approved=approved, reason=reason)
            for i in ids
        ]
        async for event in self.submit_tool_outputs(
            run_id, (), approvals=decisions, timeout=timeout
        ):
            yield event

    def retry(
        self, session_id: str, sequence: int, *, timeout: float | None = None
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """Delete steps from `sequence` on and regenerate."""
        request = agent_service_pb2.RetryRequest(session_id=session_id, sequence=sequence)
        return self._stream(self.agents.Retry, request, timeout)

    def watch_run(
        self, run_id: str, after_seq: int = 0, *, timeout: float | None = None
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """Replay a run's events after `after_seq`, then follow it live."""
        request = agent_service_pb2.WatchRunRequest(run_id=run_id, after_seq=after_seq)
        return self._stream(self.agents.WatchRun, request, timeout)

    async def follow_run(
        self, run_id: str, after_seq: int = 0, *, reconnects: int = 10, backoff_s: float = 0.2
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """`watch_run` that survives a server restart: when the stream breaks with
        UNAVAILABLE it watches again from the last seq it yielded, up to `reconnects` times in
        a row (waiting `backoff_s`, doubled each time, at most 5 s). Ends after the run's
        terminal event; with `after_seq` at that event's seq the server's stream is empty
        (status OK), and this ends at once, yielding nothing."""
        cursor, failures = after_seq, 0
        while True:
            try:
                async for event in self.watch_run(run_id, cursor):
                    yield event
                    cursor, failures = event.seq, 0
                    if event.WhichOneof("event") in ("run_completed", "run_failed"):
                        return
                return
            except AgioError as error:
                if error.code is not grpc.StatusCode.UNAVAILABLE or failures >= reconnects:
                    raise
            await asyncio.sleep(min(backoff_s * 2**failures, 5.0))
            failures += 1

    async def run_to_end(
        self, input: str, *, output_schema: OutputSchema | None = None, **kwargs: Any
    ) -> RunResult:
        """Run and collect: the final run, the last assistant text and the stored steps.

        With `output_schema`, the result's `output` is the run's answer: Python values, or
        an instance of the pydantic model given (checked by it once more). A run that ended
        without one (OUTPUT_INVALID, a limit) has None: its stop signal says why."""
        result = await collect(self.run(input, output_schema=output_schema, **kwargs))
        if isinstance(output_schema, type) and result.output is not None:
            result.output = output_schema.model_validate(result.output)
        return result

    async def cancel_run(self, run_id: str, reason: str = "") -> resources_pb2.Run:
        response = await self._unary(
            self.agents.CancelRun, agent_service_pb2.CancelRunRequest(run_id=run_id, reason=reason)
        )
        run: resources_pb2.Run = response.run
        return run

    async def get_run(self, run_id: str) -> resources_pb2.Run:
        response = await self._unary(
            self.agents.GetRun, agent_service_pb2.GetRunRequest(run_id=run_id)
        )
        run: resources_pb2.Run = response.run
        return run

    async def list_runs(self, session_id: str, page_size: int = 0) -> list[resources_pb2.Run]:
        """Every run of a session, newest first (follows page tokens)."""
        runs: list[resources_pb2.Run] = []
        token = ""
        while True:
            response = await self.list_runs_page(session_id, page_size, token)
            runs.extend(response.runs)
            token = response.next_page_token
            if not token:
                return runs

    async def list_runs_page(
        self, session_id: str, page_size: int = 0, page_token: str = ""
    ) -> agent_service_pb2.ListRunsResponse:
        """One page of a session's runs, newest first, with the token of the next page."""
        response: agent_service_pb2.ListRunsResponse = await self._unary(
            self.agents.ListRuns,
            agent_service_pb2.ListRunsRequest(
                session_id=session_id, page_size=page_size, page_token=page_token
            ),
        )
        return response

    async def list_agents(self) -> list[resources_pb2.Agent]:
        response = await self._unary(self.agents.ListAgents, agent_service_pb2.ListAgentsRequest())
        return list(response.agents)

    # -- sessions -----------------------------------------------------------------------

    async def get_session(self, session_id: str) -> resources_pb2.Session:
        response = await self._unary(
            self.sessions.GetSession, session_service_pb2.GetSessionRequest(session_id=session_id)
        )
        session: resources_pb2.Session = response.session
        return session

    async def list_sessions(self, page_size: int = 0) -> list[resources_pb2.Session]:
        """Every session, newest first (follows page tokens)."""
        sessions: list[resources_pb2.Session] = []
        token = ""
        while True:
            response = await self.list_sessions_page(page_size, token)
            sessions.extend(response.sessions)
            token = response.next_page_token
            if not token:
                return sessions

    async def list_sessions_page(
        self, page_size: int = 0, page_token: str = ""
    ) -> session_service_pb2.ListSessionsResponse:
        """One page of sessions, newest first, with the token of the next page."""
        response: session_service_pb2.ListSessionsResponse = await self._unary(
            self.sessions.ListSessions,
            session_service_pb2.ListSessionsRequest(page_size=page_size, page_token=page_token),
        )
        return response

    async def list_steps(
        self, session_id: str, start_sequence: int = 0, end_sequence: int = 0, page_size: int = 0
    ) -> list[resources_pb2.Step]:
        """The session's steps in sequence order (follows page tokens)."""
        steps: list[resources_pb2.Step] = []
        token = ""
        while True:
            response = await self._unary(
                self.sessions.ListSteps,
                session_service_pb2.ListStepsRequest(
                    session_id=session_id,
                    start_sequence=start_sequence,
                    end_sequence=end_sequence,
                    page_size=page_size,
                    page_token=token,
                ),
            )
            steps.extend(response.steps)
            token = response.next_page_token
            if not token:
                return steps

    async def get_step(self, session_id: str, sequence: int) -> resources_pb2.Step:
        response = await self._unary(
            self.sessions.GetStep,
            session_service_pb2.GetStepRequest(session_id=session_id, sequence=sequence),
        )
        step: resources_pb2.Step = response.step
        return step

    async def delete_steps(self, session_id: str, start_sequence: int) -> int:
        response = await self._unary(
            self.sessions.DeleteSteps,
            session_service_pb2.DeleteStepsRequest(
                session_id=session_id, start_sequence=start_sequence
            ),
        )
        return int(response.deleted_count)

    async def fork_session(self, session_id: str, sequence: int = 0) -> resources_pb2.Session:
        response = await self._unary(
            self.sessions.ForkSession,
            session_service_pb2.ForkSessionRequest(session_id=session_id, sequence=sequence),
        )
        session: resources_pb2.Session = response.session
        return session

    async def get_context(
        self, session_id: str, agent: str = ""
    ) -> session_service_pb2.GetContextResponse:
        """The whole context, its pages joined (a page token is refused once the session
        changed: then this raises AgioError INVALID_ARGUMENT)."""
        whole = session_service_pb2.GetContextResponse()
        token = ""
        while True:
            page: session_service_pb2.GetContextResponse = await self._unary(
                self.sessions.GetContext,
                session_service_pb2.GetContextRequest(
                    session_id=session_id, agent=agent, page_token=token
                ),
            )
            whole.messages.extend(page.messages)
            whole.summary.CopyFrom(page.summary)
            token = page.next_page_token
            if not token:
                return whole

    async def compact_session(
        self, session_id: str, keep_recent_steps: int = 0, agent: str = ""
    ) -> session_service_pb2.CompactSessionResponse:
        """Summarize the session's older steps now (refused while a run holds it)."""
        response: session_service_pb2.CompactSessionResponse = await self._unary(
            self.sessions.CompactSession,
            session_service_pb2.CompactSessionRequest(
                session_id=session_id, keep_recent_steps=keep_recent_steps, agent=agent
            ),
        )
        return response

    async def delete_session(self, session_id: str) -> int:
        response = await self._unary(
            self.sessions.DeleteSession,
            session_service_pb2.DeleteSessionRequest(session_id=session_id),
        )
        return int(response.deleted_steps)

    async def health(self, service: str = "") -> str:
        """The serving status name, e.g. `SERVING`."""
        response = await self._unary(
            self._health.Check, health_pb2.HealthCheckRequest(service=service)
        )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))
