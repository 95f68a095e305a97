"""Server tools: plain Python functions turned into model-callable tools, and their registry.

`ServerTool` is what the executor runs: a `Tool` here, or a tool of an MCP server
(`engine/mcp.py`), which a `ToolSource` attached to the registry provides. `ToolResult` is
what a call comes to, as the executor returns it, the loop stores it and a tracer hears it.

A function's type hints become the tool's JSON schema and its argument validation
(pydantic); its docstring's first paragraph becomes the description and an `Args:` section
the parameter descriptions. A parameter annotated `ToolContext` is filled by the engine
(run, session and tool call ids: an idempotency key for side effects) and hidden from the
model. A tool ends
the run by raising `ToolStop`. Executing tools (timeouts, parallelism, errors as tool steps)
is `executor.py`'s job; this module never runs a tool on its own and never imports grpc.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, get_type_hints

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, create_model

from agio_grpc.domain import DEFAULT_TENANT, Step, StopSignal, ToolCall, Usage
from agio_grpc.engine.events import ToolProgress
from agio_grpc.engine.loading import import_object

_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_-]")


def function_name(text: str) -> str:
    """`text` with each character an OpenAI function name cannot hold (a `.`, say) replaced
    by `_`."""
    return _NOT_IN_NAME.sub("_", text)


def model_tool_name(server: str, tool: str) -> str:
    """The name the model calls tool `tool` of MCP server `server` by: `server__tool`
    (`function_name` of the tool's)."""
    return f"{server}__{function_name(tool)}"


def mcp_server_of(model_name: str) -> str:
    """The MCP server whose tool the model calls `model_name` (`model_tool_name`'s `server`);
    "" for a name of no server's tool."""
    server, separator, _ = model_name.partition("__")
    return server if separator else ""


def config_tool_name(name: str) -> str:
    """A config's `server.tool` as the model sees it (`server__tool`); other names as they are."""
    server, dot, tool = name.partition(".")
    return model_tool_name(server, tool) if dot else name


class ToolStop(Exception):  # noqa: N818 - it is a signal, not an error
    """Raise from a tool to end the run (STOP_REASON_TOOL_STOP, source `tool:<name>`).

    `message` becomes the tool's result (the model would see it) and the stop signal's message.
    """

    def __init__(self, message: str, *, context: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.context = context or {}


class ToolError(Exception):
    """A tool's failure whose message is the whole result the model sees (no type name, no
    traceback): a tool that reported an error, or one that cannot be reached."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ToolUnavailableError(ToolError):
    """The tool exists but cannot be called now (its MCP server is restarting or no longer
    lists it); a later call may work."""


class ArgumentsError(ValueError):
    """Arguments that do not fit a tool's JSON schema; the message lists the problems."""


@dataclass(frozen=True, slots=True)
class ToolOrigin:
    """Where a tool call ran when not in this process, for its `execute_tool` span."""

    server: str
    """The MCP server's configured name."""
    transport: str
    """`stdio` or `streamable-http`."""
    remote_name: str
    """The tool's name on the server."""
    session_id: str = ""
    """The MCP session id (Streamable HTTP), "" when there is none."""
    protocol_version: str = ""
    """The MCP protocol version the connection negotiated."""


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of one tool call, ready to become a tool step."""

    call: ToolCall
    content: str
    is_error: bool = False
    stop: StopSignal | None = None
    """Set when the result ends the run: the tool raised ToolStop (TOOL_STOP), or it failed
    and stops on error, or its result was over the step limit (TOOL_ERROR)."""
    exec_time_ms: int = 0
    """Time inside the tool's function (0 when it was never called)."""
    duration_ms: int = 0
    """Wall time of the call from when it got a slot to its result: checking the arguments,
    the function and rendering its result (0 for a call that never returned)."""
    origin: ToolOrigin | None = None
    """Where the call ran when not in this process (an MCP server)."""
    usage: Usage | None = None
    """Tokens the call spent on models (a local agent's), None for none."""


class ServerTool(Protocol):
    """A tool the server runs, as the executor and the registry see it."""

    @property
    def name(self) -> str:
        """The name the model calls it by (^[A-Za-z0-9_-]{1,64}$)."""
        ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of its arguments object."""
        ...

    @property
    def source(self) -> str:
        """`python` for a function of this process, `mcp:<server>` for an MCP server's."""
        ...

    @property
    def available(self) -> bool:
        """Whether a call can reach it now; an unavailable tool is not offered to models."""
        ...

    @property
    def unavailable_reason(self) -> str:
        """Why it is unavailable, one sentence for ListAgents; "" when it is available."""
        ...

    @property
    def timeout_s(self) -> float | None:
        """Its own hard timeout, when shorter than the run's tool timeout; None: the run's."""
        ...

    def definition(self) -> dict[str, Any]:
        """The OpenAI `tools` entry offering this tool."""
        ...

    def validate(self, arguments: object) -> dict[str, Any]:
        """The checked arguments; raises pydantic.ValidationError or ArgumentsError."""
        ...

    async def invoke(self, arguments: dict[str, Any], context: ToolContext) -> str:
        """Run the call and render its result as text; raises ToolError for a failure the
        model should read as it is."""
        ...

    def origin(self) -> ToolOrigin | None:
        """Where its calls run, None for this process."""
        ...


class ToolSource(Protocol):
    """Tools that come and go at run time (an MCP server's), attached to a registry."""

    @property
    def source(self) -> str:
        """What each of its tools gives as `source`."""
        ...

    def tools(self) -> Mapping[str, ServerTool]:
        """Its tools now, by name (available or not)."""
        ...


MAX_PROGRESS_MESSAGE_CHARS = 4096
"""The longest message a `tool_progress` event carries (a remote agent's status may be
anything)."""
MAX_PROGRESS_ID_CHARS = 256
"""The longest state or id a `tool_progress` event carries: a longer one (a remote agent's
task id may be anything) is left out rather than cut into an id of something else."""


def _bounded(value: str) -> str:
    return value if len(value) <= MAX_PROGRESS_ID_CHARS else ""


def _no_progress(event: ToolProgress) -> None:
    """A context made outside a run (a test, a direct call) reports to nobody."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Where a tool call comes from; declare a parameter of this type to receive it."""

    run_id: str
    session_id: str
    tool_call_id: str
    tool_name: str
    tenant: str = DEFAULT_TENANT
    """The run's tenant: what the call may see and start."""
    usage: Usage = field(default_factory=Usage)
    """Tokens the call spent on models (a local agent's child run): the tool step's, so
    they count toward the run's usage and token budget."""
    step_id: str = ""
    """The tool step the call will be stored as."""
    history: Sequence[Step] = ()
    """The session's steps before the call, as the run builds its context from them (the
    conversation: their metrics are not kept)."""
    progress: Callable[[ToolProgress], None] = _no_progress
    """Where `report_progress` sends its events: the run's stream while the call runs."""

    def report_progress(
        self,
        message: str = "",
        *,
        state: str = "",
        child_run_id: str = "",
        child_session_id: str = "",
        remote_task_id: str = "",
        remote_context_id: str = "",
    ) -> None:
        """Tell the run's clients how the call goes: a `tool_progress` event, live only (a
        replay has none), dropped once the call is over. `message` is cut to
        `MAX_PROGRESS_MESSAGE_CHARS`; a state or id over `MAX_PROGRESS_ID_CHARS` is left
        out."""
        self.progress(
            ToolProgress(
                self.step_id,
                self.tool_call_id,
                self.tool_name,
                message[:MAX_PROGRESS_MESSAGE_CHARS],
                _bounded(state),
                _bounded(child_run_id),
                _bounded(child_session_id),
                _bounded(remote_task_id),
                _bounded(remote_context_id),
            )
        )

    @property
    def idempotency_key(self) -> str:
        """Stable for this call across restarts: key side effects with it."""
        return f"{self.run_id}:{self.tool_call_id}"


class Tool:
    """A callable tool: name, description, JSON schema, and the function behind it."""

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        inline: bool = False,
    ) -> None:
        """`inline`: a sync function that returns at once (bounded work, no I/O, no lock) is
        called on the event loop instead of a worker thread, saving the hand-off both ways;
        while it runs every other run of the process waits, and a timeout cannot stop it."""
        self.function = function
        self.name = name or function.__name__
        summary, argument_docs = _parse_docstring(inspect.getdoc(function) or "")
        self.description = description if description is not None else summary
        self._context_parameter, self._arguments_model = _arguments_model(
            function, self.name, argument_docs
        )
        self.parameters: dict[str, Any] = self._arguments_model.model_json_schema()
        self.parameters.pop("title", None)
        self.is_async = inspect.iscoroutinefunction(function)
        if inline and self.is_async:
            raise ValueError(f"tool {self.name!r}: an async function runs on the event loop")
        self.inline = inline

    source = "python"
    available = True
    unavailable_reason = ""
    timeout_s: float | None = None

    def origin(self) -> ToolOrigin | None:
        return None

    def definition(self) -> dict[str, Any]:
        """The OpenAI `tools` entry offering this tool."""
        return function_definition(self)

    def validate(self, arguments: object) -> dict[str, Any]:
        """The validated keyword arguments; raises pydantic.ValidationError."""
        model = self._arguments_model.model_validate(arguments)
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def invoke(self, arguments: dict[str, Any], context: ToolContext) -> str:
        """Call the function with validated `arguments` and render its result as text.

        A sync function runs in a worker thread (it cannot be interrupted: on timeout the
        thread finishes in the background and its result is dropped), an `inline` one on
        the event loop.
        """
        if self._context_parameter:
            arguments = {**arguments, self._context_parameter: context}
        if self.is_async:
            result = await self.function(**arguments)
        elif self.inline:
            result = self.function(**arguments)
        else:
            result = await asyncio.to_thread(self.function, **arguments)
        return render_result(result)


def function_definition(tool: ServerTool) -> dict[str, Any]:
    """The OpenAI `tools` entry offering `tool`."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def render_result(result: object) -> str:
    """A tool's return value as the text the model reads: strings as they are, else JSON."""
    if isinstance(result, str):
        return result
    return pydantic_core.to_json(result, fallback=str).decode()


class ToolRegistry:
    """The server tools by name: the registered functions, then the attached sources' tools
    (a source's tool never shadows a registered one)."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._sources: list[ToolSource] = []
        for tool in tools:
            self.register(tool)

    def attach(self, source: ToolSource) -> None:
        """Add the tools of `source`, as it lists them at each look-up."""
        self._sources.append(source)

    def register(self, tool: Tool | Callable[..., Any], *, name: str | None = None) -> Tool:
        """Add a tool (or a function, made into one). Raises ValueError on a duplicate name."""
        if not isinstance(tool, Tool):
            tool = Tool(tool, name=name)
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        return tool

    def load(self, spec: str) -> list[Tool]:
        """Register the tools `spec` names (see `load_tools`)."""
        return [self.register(tool) for tool in load_tools(spec)]

    def get(self, name: str) -> ServerTool | None:
        tool = self._tools.get(name)
        if tool is not None:
            return tool
        for source in self._sources:
            found = source.tools().get(name)
            if found is not None:
                return found
        return None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def names(self) -> list[str]:
        """The registered functions' names (the attached sources' are `tools_of` them)."""
        return sorted(self._tools)

    def agent_tools(self, tools: Iterable[str], mcp_servers: Iterable[str]) -> list[str]:
        """The tools an agent offers now: its `tools`, then the tools each of its MCP
        servers lists (each once)."""
        names = list(tools)
        for server in mcp_servers:
            names.extend(self.tools_of(f"mcp:{server}"))
        return list(dict.fromkeys(names))

    def tools_of(self, source: str) -> list[str]:
        """The names of the tools `source` (e.g. `mcp:weather`) provides now, sorted."""
        return sorted(
            name
            for attached in self._sources
            if attached.source == source
            for name in attached.tools()
            if name not in self._tools
        )

    def definitions(self, names: Iterable[str]) -> list[dict[str, Any]]:
        """The OpenAI `tools` entries of the named tools that exist and are available now, in
        the given order."""
        found = (self.get(name) for name in names)
        return [tool.definition() for tool in found if tool is not None and tool.available]


def load_tools(spec: str) -> list[Tool]:
    """Tools from config: `package.module:function` (one tool) or `package.module`, whose
    `TOOLS` list holds functions or `Tool`s. Raises ValueError with the spec on any problem.
    """
    target = import_object(spec)
    if ":" not in spec:
        target = getattr(target, "TOOLS", None)
        if not isinstance(target, list | tuple):
            raise ValueError(f"module {spec!r} has no TOOLS list")
        items: list[object] = list(target)
    else:
        items = [target]
    tools: list[Tool] = []
    for item in items:
        if isinstance(item, Tool):
            tools.append(item)
        elif callable(item):
            tools.append(Tool(item))
        else:
            raise ValueError(f"{spec!r}: {item!r} is neither a function nor a Tool")
    return tools


def _arguments_model(
    function: Callable[..., Any], tool_name: str, argument_docs: dict[str, str]
) -> tuple[str | None, type[BaseModel]]:
    """The pydantic model of the function's parameters, and its ToolContext parameter."""
    hints = get_type_hints(function, include_extras=True)
    fields: dict[str, Any] = {}
    context_parameter: str | None = None
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"tool {tool_name!r}: *args and **kwargs cannot become a schema")
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise TypeError(f"tool {tool_name!r}: positional-only parameters are not supported")
        annotation = hints.get(parameter.name, Any)
        if annotation is ToolContext:
            context_parameter = parameter.name
            continue
        default = ... if parameter.default is parameter.empty else parameter.default
        description = argument_docs.get(parameter.name)
        fields[parameter.name] = (
            annotation,
            Field(default, description=description) if description else default,
        )
    model = create_model(
        f"{tool_name}_arguments",
        __config__=ConfigDict(extra="forbid"),
        **fields,
    )
    return context_parameter, model


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The first paragraph, and `name: description` lines of a Google-style `Args:` section."""
    paragraphs = doc.strip().split("\n\n")
    summary = " ".join(paragraphs[0].split()) if paragraphs and paragraphs[0] else ""
    arguments: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            if not stripped or (stripped.endswith(":") and not line.startswith(" ")):
                if arguments:
                    break
                continue
            match = _ARG_LINE.match(line)
            if match:
                arguments[match.group(1)] = match.group(2).strip()
            elif arguments:
                last = next(reversed(arguments))
                arguments[last] += " " + stripped
    return summary, arguments
