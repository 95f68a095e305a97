"""Tools of MCP servers: one long-lived connection per configured server, through the official
`mcp` SDK (`ClientSession` over a watched stdio process, `mcp_stdio.py`, or
`streamable_http_client`).

Each `McpServer` has one owner task that opens the connection (the SDK's context managers
are entered and left in that task), lists the tools, keeps the connection and lists again on
`notifications/tools/list_changed`; when the connection fails (a stdio server's process
exits, noticed at once; a call finds it closed; a health ping fails) the task reconnects
with capped exponential backoff, and the server's tools are unavailable meanwhile. Each
failure is one warning line saying why (for a stdio server: the program, its exit code, the
last line of its stderr). Calls from run tasks go through the open session. A call's
arguments are checked against the tool's input schema (jsonschema); its result becomes the
text of a tool step (`render_call_result`); `isError` becomes a `ToolError`; a call cut off
by its timeout or its run's cancellation is cancelled on the server by the SDK
(`notifications/cancelled` for the request id). A tool that requires MCP task support
(`execution.taskSupport: "required"`) is listed but never available: this client sends no
task-augmented calls, and the server refuses plain ones.

The model sees an MCP tool as `server__tool` (OpenAI function names allow no `.`); the
config names it `server.tool`. Never imports grpc, the store or OpenTelemetry; never logs a
header or environment value.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx2
import jsonschema
import mcp.types as mcp_types
from mcp import ClientSession, MCPError
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client

from agio_grpc.engine.mcp_stdio import StdioProcess, Streams, started_process
from agio_grpc.engine.tls import client_tls_context
from agio_grpc.engine.tools import (
    ArgumentsError,
    ToolContext,
    ToolError,
    ToolOrigin,
    ToolUnavailableError,
    function_definition,
    model_tool_name,
)

log = logging.getLogger(__name__)

_MODEL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MCP_SESSION_HEADER = "mcp-session-id"
"""The Streamable HTTP response header naming the MCP session."""
_CONNECTION_CLOSED = -32000
"""The SDK's error code for a request whose connection closed (`mcp_types.CONNECTION_CLOSED`)."""
TASK_SUPPORT_MISSING = (
    'it requires MCP task support (execution.taskSupport "required"), which this client '
    "does not implement"
)
"""Why a tool that only runs as an MCP task is never offered."""


@dataclass(frozen=True, slots=True)
class McpServerSpec:
    """How to reach one MCP server; secrets already resolved (service/mcp_setup.py)."""

    name: str
    transport: Literal["stdio", "streamable-http"]
    command: str = ""
    """stdio: the absolute path of the program."""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    """stdio: the server's whole environment (service/mcp_setup.py adds PATH, HOME and LANG
    to the configured entries)."""
    cwd: Path | None = None
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    tool_timeout_s: float | None = None
    allowed_tools: frozenset[str] | None = None
    blocked_tools: frozenset[str] = frozenset()
    connect_timeout_s: float = 10.0
    restart_initial_s: float = 0.25
    """The first wait before reconnecting; it doubles with each failure in a row."""
    restart_max_s: float = 30.0
    """The longest wait between reconnection attempts."""
    ping_interval_s: float = 15.0
    """How often an idle connection is checked with an MCP ping (a lost HTTP session, a
    stdio server that no longer answers; one that exits is noticed without it)."""

    def admits(self, tool: str) -> bool:
        """Whether `allowed_tools` and `blocked_tools` let the service use `tool`."""
        allowed = self.allowed_tools is None or tool in self.allowed_tools
        return allowed and tool not in self.blocked_tools


class McpTool:
    """One tool of an MCP server, as the executor sees any tool (`ServerTool`)."""

    def __init__(self, server: McpServer, listed: mcp_types.Tool | None, remote_name: str) -> None:
        self.server = server
        self.remote_name = remote_name
        self.name = model_tool_name(server.spec.name, remote_name)
        self.listed = listed is not None
        self.requires_task = listed is not None and _requires_task(listed)
        """Whether the server runs it only as an MCP task, which this client cannot start."""
        self.description = (listed.description or "") if listed else ""
        schema = listed.input_schema if listed else {"type": "object", "properties": {}}
        self.parameters: dict[str, Any] = dict(schema)
        self._validator = jsonschema.Draft202012Validator(self.parameters)
        self.source = server.source
        self.timeout_s = server.spec.tool_timeout_s

    @property
    def available(self) -> bool:
        return not self.unavailable_reason

    @property
    def unavailable_reason(self) -> str:
        server = self.server
        if not server.connected:
            return f"MCP server {server.spec.name!r} is not connected ({server.down_reason})"
        if not self.listed:
            return f"MCP server {server.spec.name!r} does not list it"
        if self.requires_task:
            return TASK_SUPPORT_MISSING
        return ""

    def definition(self) -> dict[str, Any]:
        return function_definition(self)

    def validate(self, arguments: object) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise ArgumentsError("the arguments must be a JSON object")
        try:
            problems = [
                f"{'.'.join(str(part) for part in error.absolute_path) or 'arguments'}: "
                f"{error.message}"
                for error in self._validator.iter_errors(arguments)
            ]
        except jsonschema.SchemaError as error:
            raise ArgumentsError(
                f"the server's input schema is not valid: {error.message}"
            ) from None
        if problems:
            raise ArgumentsError("; ".join(problems))
        return dict(arguments)

    async def invoke(self, arguments: dict[str, Any], context: ToolContext) -> str:
        if not self.listed:
            raise ToolUnavailableError(
                f"tool {self.name!r} is unavailable: MCP server {self.server.spec.name!r} "
                f"does not list a tool {self.remote_name!r}"
            )
        if self.requires_task:
            raise ToolUnavailableError(f"tool {self.name!r} is unavailable: {TASK_SUPPORT_MISSING}")
        result = await self.server.call(self.remote_name, self.name, arguments)
        text = render_call_result(result)
        if result.is_error:
            raise ToolError(text or f"tool {self.name!r} reported an error")
        return text

    def origin(self) -> ToolOrigin:
        return self.server.origin(self.remote_name)


class McpServer:
    """One configured MCP server: its connection, its owner task and its tools (a
    `ToolSource`)."""

    def __init__(self, spec: McpServerSpec, reserved_names: frozenset[str] = frozenset()) -> None:
        """`reserved_names` are in-process tools' names: a listed tool mapping to one of them
        is left out (logged)."""
        self.spec = spec
        self.source = f"mcp:{spec.name}"
        self._reserved = reserved_names
        self._pinned: set[str] = set()
        self._tools: dict[str, McpTool] = {}
        self._session: ClientSession | None = None
        self._process: StdioProcess | None = None
        self._task_only_logged: set[str] = set()
        self.down_reason = "starting"
        """Why the server is not connected now, for a tool's `unavailable_reason` (no stderr
        text: that goes to the log only)."""
        self._session_id = ""
        self._protocol_version = ""
        self._attention = asyncio.Event()
        self._lost = False
        self._stopping = False
        self._relist = False
        self._first_attempt = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connections = 0
        """How many times the connection opened (1 after start-up, 2 after a restart...)."""

    # The ToolSource side.

    def tools(self) -> Mapping[str, McpTool]:
        return self._tools

    @property
    def connected(self) -> bool:
        return self._session is not None

    def pin(self, remote_name: str) -> None:
        """Keep tool `remote_name` in `tools()` even while the server does not list it (an
        agent names it), unavailable until it is listed."""
        self._pinned.add(remote_name)
        if model_tool_name(self.spec.name, remote_name) not in self._tools:
            tool = McpTool(self, None, remote_name)
            self._tools[tool.name] = tool

    def origin(self, remote_name: str) -> ToolOrigin:
        return ToolOrigin(
            self.spec.name,
            self.spec.transport,
            remote_name,
            self._session_id,
            self._protocol_version,
        )

    # The lifecycle.

    def start(self) -> None:
        """Start the owner task, which connects and stays connected until `stop`."""
        self._task = asyncio.create_task(self._own(), name=f"mcp server {self.spec.name}")

    async def first_attempt(self) -> None:
        """Return once the first connection attempt succeeded or failed."""
        await self._first_attempt.wait()

    async def stop(self) -> None:
        """Close the connection (a stdio server's process is stopped and reaped); an
        attempt to connect still under way is cancelled."""
        self._stopping = True
        self._attention.set()
        if self._task is None:
            return
        if self._session is None:
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(self._task)

    async def _own(self) -> None:
        """Connect, serve, and after each failure wait (doubling from `restart_initial_s`
        to `restart_max_s`, from the start again after a connection that came up)."""
        delay = self.spec.restart_initial_s
        while not self._stopping:
            connections = self.connections
            self._process = None
            failure: Exception | None = None
            try:
                await self._connect_and_serve()
            except Exception as error:  # any failure of the connection means: reconnect
                failure = error
            finally:
                self._session = None
                cause, self.down_reason = self._why_down(failure)
                self._first_attempt.set()
            if self._stopping:
                break
            came_up = self.connections > connections
            if came_up:
                delay = self.spec.restart_initial_s
            log.warning(
                "mcp server %s %s: %s; its tools are unavailable, %s in %gs",
                self.spec.name,
                "stopped" if came_up else "failed to start",
                cause,
                "reconnecting" if came_up else "retrying",
                delay,
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wait_for_attention()
            delay = min(delay * 2, self.spec.restart_max_s)

    def _why_down(self, failure: Exception | None) -> tuple[str, str]:
        """Why the last connection or attempt ended: in the words of a log line, and in the
        shorter ones of `down_reason` (without the server's stderr, which only the log shows)."""
        end = self._process.end if self._process is not None else None
        last_words = ""
        if end is not None and end.last_stderr_line:
            last_words = f"; last stderr line: {end.last_stderr_line!r}"
        if end is not None and end.ended_by_itself:
            return f"{self.spec.command} {end.describe()}{last_words}", (
                f"its process {end.describe()}"
            )
        if isinstance(failure, TimeoutError):
            short = f"it did not answer within {self.spec.connect_timeout_s:g}s"
            return short + last_words, short
        if failure is not None:
            return _describe(failure) + last_words, (
                f"it failed: {type(_innermost(failure)).__name__}"
            )
        return "its connection closed" + last_words, "its connection closed"

    def _process_ended(self, how: str) -> None:
        """The stdio server's process exited (or closed its stdout), as `how` says: its tools
        are unavailable from this moment on, and the owner task restarts it."""
        self._session = None
        self._lost = True
        self.down_reason = f"its process {how}"
        self._attention.set()

    async def _connect_and_serve(self) -> None:
        """Connect, list the tools, then keep the connection until it is lost (returns or
        raises) or the server stops (returns)."""
        self._lost = False
        self._attention.clear()  # what was pending concerned the last connection
        async with contextlib.AsyncExitStack() as stack:
            async with asyncio.timeout(self.spec.connect_timeout_s):
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=self._on_message)
                )
                initialized = await session.initialize()
                self._protocol_version = str(initialized.protocol_version)
                await self._list_tools(session)
            if self._lost:  # its process ended while connecting
                return
            self._session = session
            self.connections += 1
            log.info(
                "mcp server %s connected (%s): %d tool(s) listed",
                self.spec.name,
                self.spec.transport,
                sum(1 for tool in self._tools.values() if tool.listed),
            )
            self._first_attempt.set()
            await self._serve(session)

    async def _serve(self, session: ClientSession) -> None:
        while True:
            try:
                async with asyncio.timeout(self.spec.ping_interval_s):
                    await self._wait_for_attention()
            except TimeoutError:
                async with asyncio.timeout(self.spec.connect_timeout_s):
                    await session.send_ping()
                continue
            if self._stopping or self._lost:
                return
            if self._relist:
                self._relist = False
                async with asyncio.timeout(self.spec.connect_timeout_s):
                    await self._list_tools(session)
                log.info("mcp server %s: tool list refreshed", self.spec.name)

    async def _wait_for_attention(self) -> None:
        await self._attention.wait()
        self._attention.clear()

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        if self.spec.transport == "stdio":
            return self._stdio_transport()
        return self._http_transport()

    @contextlib.asynccontextmanager
    async def _stdio_transport(self) -> AsyncIterator[Streams]:
        spec = self.spec
        async with started_process(
            spec.command, spec.args, spec.env, spec.cwd, self._process_ended
        ) as process:
            self._process = process
            yield process.streams

    @contextlib.asynccontextmanager
    async def _http_transport(self) -> Any:
        async def note_session(response: httpx2.Response) -> None:
            self._session_id = response.headers.get(MCP_SESSION_HEADER, self._session_id)

        self._session_id = ""
        client = httpx2.AsyncClient(
            headers=dict(self.spec.headers),
            # A call's own timeout bounds its wait for the answer, not the HTTP client's.
            timeout=httpx2.Timeout(self.spec.connect_timeout_s, read=None),
            verify=client_tls_context(),
            event_hooks={"response": [note_session]},
        )
        async with client, streamable_http_client(self.spec.url, http_client=client) as streams:
            yield streams

    async def _list_tools(self, session: ClientSession) -> None:
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        while True:
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        tools: dict[str, McpTool] = {}
        for item in listed:
            if not self.spec.admits(item.name):
                continue
            tool = McpTool(self, item, item.name)
            if not _MODEL_NAME.match(tool.name) or tool.name in self._reserved:
                log.warning(
                    "mcp server %s: tool %r left out: %r is not a usable tool name here",
                    self.spec.name,
                    item.name,
                    tool.name,
                )
                continue
            if tool.requires_task and item.name not in self._task_only_logged:
                self._task_only_logged.add(item.name)  # said once, not at each listing
                log.warning(
                    "mcp server %s: tool %r is never offered to models: %s",
                    self.spec.name,
                    item.name,
                    TASK_SUPPORT_MISSING,
                )
            tools[tool.name] = tool
        for remote_name in self._pinned:
            name = model_tool_name(self.spec.name, remote_name)
            if name not in tools:
                tools[name] = McpTool(self, None, remote_name)
        self._tools = tools

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._relist = True
            self._attention.set()
        elif isinstance(message, Exception):
            # Its text may quote what the server sent (a tool's result): the type here, the
            # text in the traceback, which log lines show only with content capture on.
            log.debug(
                "mcp server %s: transport error: %s",
                self.spec.name,
                type(_innermost(message)).__name__,
                exc_info=message,
            )

    # Calls.

    async def call(
        self, remote_name: str, model_name: str, arguments: dict[str, Any]
    ) -> mcp_types.CallToolResult:
        """Call tool `remote_name`; raises ToolUnavailableError while the server is not
        connected, ToolError when the connection fails under the call."""
        session = self._session
        if session is None:
            raise ToolUnavailableError(
                f"tool {model_name!r} is unavailable: MCP server {self.spec.name!r} is "
                "restarting; try again later or do without it"
            )
        try:
            return await session.call_tool(remote_name, arguments)
        except MCPError as error:
            if error.code != _CONNECTION_CLOSED:
                raise ToolError(
                    f"tool {model_name!r} failed: MCP server {self.spec.name!r} answered "
                    f"error {error.code}: {error.message}"
                ) from None
            self._connection_lost(session)
            raise ToolUnavailableError(
                f"tool {model_name!r} failed: MCP server {self.spec.name!r} closed the "
                "connection during the call; it is being restarted"
            ) from None

    def _connection_lost(self, session: ClientSession) -> None:
        if self._session is session:  # not a newer connection a late failure knows nothing of
            self._session = None
            self._lost = True
            self._attention.set()


class McpServers:
    """Every configured MCP server: started and stopped together."""

    def __init__(self, servers: list[McpServer]) -> None:
        self.servers = {server.spec.name: server for server in servers}

    async def start(self) -> None:
        """Start every server and wait for each one's first attempt (at most its
        `connect_timeout_s`); those not up keep trying in the background."""
        for server in self.servers.values():
            server.start()
        waits = [
            _within(server.first_attempt(), server.spec.connect_timeout_s)
            for server in self.servers.values()
        ]
        await asyncio.gather(*waits)

    async def stop(self) -> None:
        await asyncio.gather(*(server.stop() for server in self.servers.values()))


async def _within(waiting: Any, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await waiting


def render_call_result(result: mcp_types.CallToolResult) -> str:
    """A tool result as the text of a tool step, one line per block: text blocks as they
    are; images, audio and resources described by their type and size (their bytes are not
    sent to the model); the structured content as JSON when no text block comes with it
    (MCP asks a server to repeat it as text, and the SDK's servers do)."""
    parts = [_render_block(block) for block in result.content]
    structured = result.structured_content
    has_text = any(isinstance(block, mcp_types.TextContent) for block in result.content)
    if structured is not None and not has_text:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts)


def _render_block(block: mcp_types.ContentBlock) -> str:
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        return f"[{block.type}: {block.mime_type}, {_decoded_size(block.data)} bytes]"
    if isinstance(block, mcp_types.ResourceLink):
        kind = f", {block.mime_type}" if block.mime_type else ""
        return f"[resource link: {block.uri}{kind}]"
    resource = block.resource
    kind = f", {resource.mime_type}" if resource.mime_type else ""
    if isinstance(resource, mcp_types.TextResourceContents):
        return f"[resource: {resource.uri}{kind}]\n{resource.text}"
    return f"[resource: {resource.uri}{kind}, {_decoded_size(resource.blob)} bytes]"


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except ValueError:
        return len(data) * 3 // 4


def _requires_task(tool: mcp_types.Tool) -> bool:
    """Whether `tool` runs only as a task (a `tools/call` with `task` params)."""
    return tool.execution is not None and tool.execution.task_support == "required"


def _innermost(error: BaseException) -> BaseException:
    """The first error inside exception groups (anyio's task groups make them)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _describe(error: BaseException) -> str:
    """An error in one line, through exception groups."""
    error = _innermost(error)
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
