"""A2A's operations served from the runtime: the `RequestHandler` all three bindings call.

The SDK's bindings (JSON-RPC and HTTP+JSON in service/a2a/http.py, gRPC through its
`GrpcHandler`) parse a request into `lf.a2a.v1` messages and hand it here; this module does
what the matching `agio.v1` call does, through the same code (`AgentServicer.run_input`
checks a run's request, `AgentServicer.submit` a submission), as the caller the edge
authenticated (`identity.current_caller`). What it answers is translated by
service/a2a/mapping.py; every failure becomes an A2A error in service/a2a/errors.py.

A task lives past the call that started it: a dropped stream (or a blocking `SendMessage`
whose client left) leaves the run going, to be followed with `SubscribeToTask` or read with
`GetTask`, on any member.

One handler serves one agent (the HTTP listener's `/a2a/AGENT/`), or, on the gRPC port,
the agent the request's A2A `tenant` names ("" for the default agent): a card gives each
agent's gRPC interface its name as its tenant. A task of another agent is not found, as is
one of another tenant (ours, the caller's credential's).
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import a2a_pb2 as a2a
from a2a.utils import errors as a2a_errors
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE, MAX_LIST_TASKS_PAGE_SIZE
from google.protobuf import json_format

from agio_grpc.domain import RunStatus
from agio_grpc.engine.remote import FollowedEvent
from agio_grpc.engine.runtime import Runtime
from agio_grpc.service import convert
from agio_grpc.service.a2a import mapping
from agio_grpc.service.a2a.errors import A2AError, invalid_params, to_a2a_error
from agio_grpc.service.a2a.push import PushNotifier, run_steps
from agio_grpc.service.agent_service import AgentServicer
from agio_grpc.service.errors import FieldViolation
from agio_grpc.service.identity import current_caller
from agio_grpc.service.validation import (
    PageTokens,
    check_id,
    check_size,
    raise_if_any,
    time_key,
)
from agio_grpc.store.push import PushConfig, TooManyConfigsError
from agio_grpc.v1 import agent_service_pb2 as pb
from agio_grpc.v1 import resources_pb2

CANCEL_REASON = "cancelled over A2A"
MAX_PUSH_TOKEN_BYTES = 4096
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9._~+-]{0,63}")


@contextlib.contextmanager
def _answering() -> Iterator[None]:
    """Raise whatever fails in the block as its A2A error."""
    try:
        yield
    except A2AError:
        raise
    except Exception as error:
        raise to_a2a_error(error) from None


def task_filters(
    params: a2a.ListTasksRequest,
) -> tuple[frozenset[RunStatus] | None, datetime | None]:
    """The run statuses a ListTasks selects (empty: any; None: a state no run is ever in,
    such as REJECTED) and the time their status last changed at or after (None: any)."""
    if params.status not in a2a.TaskState.values():
        raise invalid_params("status", "is not a task state")
    statuses: frozenset[RunStatus] | None = frozenset()
    if params.status != a2a.TASK_STATE_UNSPECIFIED:
        statuses = mapping.run_statuses(params.status) or None
    if not params.HasField("status_timestamp_after"):
        return statuses, None
    try:
        return statuses, params.status_timestamp_after.ToDatetime(tzinfo=UTC)
    except ValueError:
        raise invalid_params("status_timestamp_after", "is not a valid timestamp") from None


@contextlib.asynccontextmanager
async def _closing(
    events: AsyncIterator[FollowedEvent],
) -> AsyncGenerator[AsyncIterator[FollowedEvent]]:
    """`events`, closed when the block ends (a follow holds a run's live feed)."""
    try:
        yield events
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()


@dataclass(slots=True)
class _Started:
    """A run a message started or resumed, and its events."""

    run: resources_pb2.Run
    events: AsyncIterator[FollowedEvent]


def _push_config(config: PushConfig) -> a2a.TaskPushNotificationConfig:
    found = a2a.TaskPushNotificationConfig(
        id=config.id, task_id=config.run_id, url=config.url, token=config.token
    )
    if config.auth_scheme:
        found.authentication.scheme = config.auth_scheme
        found.authentication.credentials = config.auth_credentials
    return found


def _no_push_config(config_id: str) -> A2AError:
    return a2a_errors.TaskNotFoundError(f"push notification config {config_id!r} not found")


def _file_parts(message: a2a.Message) -> list[int]:
    return [
        index
        for index, part in enumerate(message.parts)
        if part.WhichOneof("content") in ("raw", "url")
    ]


class AgentTasks(RequestHandler):
    """A2A tasks of one agent (`agent`), or of the agent each request's tenant names."""

    def __init__(
        self,
        runtime: Runtime,
        servicer: AgentServicer,
        pages: PageTokens,
        push: PushNotifier,
        agent: str | None = None,
    ) -> None:
        self._runtime = runtime
        self._servicer = servicer
        self._pages = pages
        self._push = push
        self._agent = agent

    # -- reading -----------------------------------------------------------------------------

    def _agent_of(self, tenant: str) -> str:
        """The agent's name; InvalidParams for a tenant naming no agent of this endpoint.
        The tenant is the request's, or its path's (HTTP+JSON's `/a2a/AGENT/TENANT/...`)."""
        if self._agent is None:
            if tenant:
                raise_if_any(check_id("tenant", tenant))
            return self._runtime.agent(tenant).name
        if tenant and tenant != self._agent:
            raise invalid_params("tenant", f"this endpoint serves agent {self._agent!r} only")
        return self._agent

    async def _run(self, task_id: str, agent: str) -> resources_pb2.Run:
        """The task's run, as the caller may see it: TaskNotFound for another tenant's or
        another agent's."""
        raise_if_any(check_id("id", task_id))
        run = await self._runtime.runs.get_run(task_id, tenant=current_caller().tenant)
        if run.agent != agent:
            raise a2a_errors.TaskNotFoundError(f"task {task_id!r} not found")
        return convert.run_to_proto(run)

    async def _steps(self, run: resources_pb2.Run) -> list[resources_pb2.Step]:
        return await run_steps(self._runtime.log, run, current_caller().tenant)

    async def on_get_task(self, params: a2a.GetTaskRequest, context: ServerCallContext) -> a2a.Task:
        with _answering():
            if params.history_length < 0:
                raise invalid_params("history_length", "must not be negative")
            run = await self._run(params.id, self._agent_of(params.tenant or context.tenant))
            return mapping.task(
                run,
                await self._steps(run),
                history_length=params.history_length if params.HasField("history_length") else None,
            )

    async def on_list_tasks(
        self, params: a2a.ListTasksRequest, context: ServerCallContext
    ) -> a2a.ListTasksResponse:
        with _answering():
            return await self._list(params, context)

    async def _list(
        self, params: a2a.ListTasksRequest, context: ServerCallContext
    ) -> a2a.ListTasksResponse:
        agent = self._agent_of(params.tenant or context.tenant)
        if params.context_id:
            raise_if_any(check_id("context_id", params.context_id))
        if params.history_length < 0:
            raise invalid_params("history_length", "must not be negative")
        size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE
        if not 1 <= size <= MAX_LIST_TASKS_PAGE_SIZE:
            raise invalid_params("page_size", f"must be 1..{MAX_LIST_TASKS_PAGE_SIZE}")
        statuses, since = task_filters(params)
        if statuses is None:  # a state no run is ever in
            return a2a.ListTasksResponse(page_size=size)
        tenant = current_caller().tenant
        pages = self._pages.for_tenant(tenant)
        query: dict[str, object] = {
            "rpc": "ListTasks",
            "agent": agent,
            "context": params.context_id,
            "status": params.status,
            "since": since.isoformat() if since else "",
        }
        after = time_key(pages.decode(params.page_token, query))
        if params.context_id:
            await self._runtime.log.get_session(params.context_id, tenant=tenant)
        runs = await self._runtime.runs.list_agent_runs(
            agent,
            size + 1,
            after,
            tenant=tenant,
            session_id=params.context_id or None,
            statuses=statuses,
            changed_since=since,
        )
        runs, token = pages.trim_time_keyed(runs, size, query)
        wants_steps = params.include_artifacts or params.history_length
        tasks = []
        for found in runs:
            run = convert.run_to_proto(found)
            steps = await self._steps(run) if wants_steps else []
            tasks.append(
                mapping.task(
                    run,
                    steps,
                    history_length=params.history_length,
                    artifacts=params.include_artifacts,
                )
            )
        return a2a.ListTasksResponse(tasks=tasks, next_page_token=token, page_size=size)

    # -- messages ----------------------------------------------------------------------------

    async def _send(self, params: a2a.SendMessageRequest, context: ServerCallContext) -> _Started:
        agent = self._agent_of(params.tenant or context.tenant)
        push = None
        if params.configuration.HasField("task_push_notification_config"):
            push = params.configuration.task_push_notification_config
            await self._check_push(push)
        message = params.message
        if message.role == a2a.ROLE_AGENT:
            raise invalid_params("message.role", "must be ROLE_USER")
        files = _file_parts(message)
        if files:
            raise a2a_errors.ContentTypeNotSupportedError(
                f"message.parts[{files[0]}]: file parts are not accepted; send text or data"
            )
        if message.task_id:
            started = await self._reply(message, agent)
        else:
            started = await self._start(message, agent)
        if push is not None:
            await self._store_push(push, started.run, new=not message.task_id)
        return started

    async def _start(self, message: a2a.Message, agent: str) -> _Started:
        request = pb.RunRequest(
            input=mapping.message_text(message),
            session_id=message.context_id,
            agent=agent,
        )
        if check_id("request_id", message.message_id) is None:
            # The same message sent twice to a context starts one run.
            request.request_id = message.message_id
        handle = await self._runtime.start_run(await self._servicer.run_input(request))
        return _Started(convert.run_to_proto(handle.run), handle.events())

    async def _reply(self, message: a2a.Message, agent: str) -> _Started:
        """A message to an INPUT_REQUIRED task: its tool outputs and approval decisions."""
        run = await self._run(message.task_id, agent)
        if message.context_id and message.context_id != run.session_id:
            raise invalid_params("message.context_id", "is not the task's context")
        if run.status != resources_pb2.RUN_STATUS_REQUIRES_ACTION:
            state = a2a.TaskState.Name(mapping.task_state(run.status))
            raise a2a_errors.UnsupportedOperationError(
                f"task {run.id!r} is {state}: only an INPUT_REQUIRED task takes a reply; "
                "send a message without taskId in its contextId to go on with the conversation"
            )
        request = pb.SubmitToolOutputsRequest(run_id=run.id)
        data = mapping.reply_data(message)
        unknown = sorted(set(data) - {"approvals", "tool_outputs"})
        if unknown:
            raise invalid_params(
                "message.parts", f"unknown key {unknown[0]!r}: give approvals or tool_outputs"
            )
        try:
            json_format.ParseDict(
                {k: data[k] for k in ("approvals", "tool_outputs") if k in data}, request
            )
        except json_format.ParseError as error:
            raise invalid_params("message.parts", str(error)) from None
        handle = await self._servicer.submit(request, None)
        if await self._push.configs.for_run(run.id):
            self._push.watch(run.id, handle.run.last_event_seq)  # its next stretch
        return _Started(convert.run_to_proto(handle.run), handle.events())

    async def on_message_send(
        self, params: a2a.SendMessageRequest, context: ServerCallContext
    ) -> a2a.Task:
        with _answering():
            started = await self._send(params, context)
            if not params.configuration.return_immediately:
                async with _closing(started.events) as events:
                    async for event in events:
                        if event.is_terminal:
                            break
            run = await self._run(started.run.id, started.run.agent)
            history = (
                params.configuration.history_length
                if params.configuration.HasField("history_length")
                else None
            )
            return mapping.task(run, await self._steps(run), history_length=history)

    async def on_message_send_stream(
        self, params: a2a.SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[mapping.Event]:
        with _answering():
            started = await self._send(params, context)
            run = started.run
            first = mapping.task(run, artifacts=False)
            sent = a2a.Message()
            sent.CopyFrom(params.message)
            sent.task_id, sent.context_id = run.id, run.session_id
            first.history.append(sent)
            yield first
            async for event in self._translated(run, started.events):
                yield event

    async def on_subscribe_to_task(
        self, params: a2a.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[mapping.Event]:
        with _answering():
            run = await self._run(params.id, self._agent_of(params.tenant or context.tenant))
            if mapping.task_state(run.status) in mapping.TERMINAL_STATES:
                state = a2a.TaskState.Name(mapping.task_state(run.status))
                raise a2a_errors.UnsupportedOperationError(
                    f"task {run.id!r} is {state}: read it with GetTask"
                )
            # The task as it stands, then its whole stream again: every artifact is rebuilt
            # from its first chunk, none twice.
            yield mapping.task(run, await self._steps(run), artifacts=False)
            async for event in self._translated(run, self._runtime.follow(run.id, 0)):
                yield event

    async def _translated(
        self, run: resources_pb2.Run, events: AsyncIterator[FollowedEvent]
    ) -> AsyncIterator[mapping.Event]:
        translator = mapping.EventTranslator(run.id, run.session_id)
        async with _closing(events) as followed:
            async for event in followed:
                for translated in translator.translate(mapping.step_event(event)):
                    yield translated
                if event.is_terminal:
                    return

    async def on_cancel_task(
        self, params: a2a.CancelTaskRequest, context: ServerCallContext
    ) -> a2a.Task:
        with _answering():
            run = await self._run(params.id, self._agent_of(params.tenant or context.tenant))
            if mapping.task_state(run.status) in mapping.TERMINAL_STATES:
                state = a2a.TaskState.Name(mapping.task_state(run.status))
                raise a2a_errors.TaskNotCancelableError(f"task {run.id!r} is {state}")
            ended = await self._runtime.cancel(
                run.id, CANCEL_REASON, "client", tenant=current_caller().tenant
            )
            cancelled = convert.run_to_proto(ended)
            return mapping.task(cancelled, await self._steps(cancelled))

    # -- push notifications (service/a2a/push.py) --------------------------------------------

    async def _check_push(self, config: a2a.TaskPushNotificationConfig) -> None:
        """InvalidParams naming what is wrong with the config: its fields, then (a name
        lookup, so only for an otherwise good config) its URL."""
        violations = [
            check_id("id", config.id, required=False),
            check_size("token", config.token, MAX_PUSH_TOKEN_BYTES),
            check_size("authentication.scheme", config.authentication.scheme, 64),
            check_size(
                "authentication.credentials",
                config.authentication.credentials,
                MAX_PUSH_TOKEN_BYTES,
            ),
        ]
        if config.authentication.scheme and not _SCHEME.fullmatch(config.authentication.scheme):
            violations.append(
                FieldViolation("authentication.scheme", "must be a word such as Bearer")
            )
        raise_if_any(*violations)
        why = await self._push.allowed(config.url)
        if why:
            raise invalid_params("url", why)

    async def _store_push(
        self, config: a2a.TaskPushNotificationConfig, run: resources_pb2.Run, *, new: bool
    ) -> a2a.TaskPushNotificationConfig:
        """Store the config of `run` and watch the run (`new`: one just started, whose start
        is notified too)."""
        try:
            stored = await self._push.configs.put(
                PushConfig(
                    run_id=run.id,
                    id=config.id or uuid.uuid4().hex,
                    tenant=current_caller().tenant,
                    url=config.url,
                    token=config.token,
                    auth_scheme=config.authentication.scheme,
                    auth_credentials=config.authentication.credentials,
                )
            )
        except TooManyConfigsError as error:
            raise a2a_errors.InvalidRequestError(str(error)) from None
        if mapping.task_state(run.status) not in mapping.TERMINAL_STATES:
            self._push.watch(run.id, started=new)
        return _push_config(stored)

    async def on_create_task_push_notification_config(
        self, params: a2a.TaskPushNotificationConfig, context: ServerCallContext
    ) -> a2a.TaskPushNotificationConfig:
        with _answering():
            run = await self._run(params.task_id, self._agent_of(params.tenant or context.tenant))
            await self._check_push(params)
            return await self._store_push(params, run, new=False)

    async def on_get_task_push_notification_config(
        self, params: a2a.GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> a2a.TaskPushNotificationConfig:
        with _answering():
            run = await self._run(params.task_id, self._agent_of(params.tenant or context.tenant))
            raise_if_any(check_id("id", params.id))
            found = await self._push.configs.get(run.id, params.id, tenant=current_caller().tenant)
            if found is None:
                raise _no_push_config(params.id)
            return _push_config(found)

    async def on_list_task_push_notification_configs(
        self, params: a2a.ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> a2a.ListTaskPushNotificationConfigsResponse:
        with _answering():
            run = await self._run(params.task_id, self._agent_of(params.tenant or context.tenant))
            found = await self._push.configs.list_configs(run.id, tenant=current_caller().tenant)
            return a2a.ListTaskPushNotificationConfigsResponse(
                configs=[_push_config(config) for config in found]
            )

    async def on_delete_task_push_notification_config(
        self, params: a2a.DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        with _answering():
            run = await self._run(params.task_id, self._agent_of(params.tenant or context.tenant))
            raise_if_any(check_id("id", params.id))
            if not await self._push.configs.delete(
                run.id, params.id, tenant=current_caller().tenant
            ):
                raise _no_push_config(params.id)

    # -- not offered -------------------------------------------------------------------------

    async def on_get_extended_agent_card(
        self, params: a2a.GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> a2a.AgentCard:
        raise a2a_errors.ExtendedAgentCardNotConfiguredError()
