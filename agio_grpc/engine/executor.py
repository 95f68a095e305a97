"""Execute one step's server tool calls: in parallel, bounded, each under a hard timeout.

Every call yields a `ToolResult`, never an exception: an unknown tool, arguments that are not
JSON or fail validation, an exception, a timeout all become error results (`is_error`) with
a short, stable message the model can act on (no traceback). A tool raising `ToolStop`
yields a normal result carrying a TOOL_STOP signal; an error result of a tool configured
`on_error: stop` carries a TOOL_ERROR signal (the result is still the call's answer, so the
log stays valid). Results come back in tool-call order, each with its wall time.
This module never touches the store or the event channel: the loop does that.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace

import pydantic

from agio_grpc import json_codec
from agio_grpc.domain import (
    StopReason,
    StopSignal,
    ToolCall,
    clean_text,
    unanswered_call_result,
)
from agio_grpc.engine.tools import (
    ArgumentsError,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolResult,
    ToolStop,
)
from agio_grpc.engine.tracing import NO_CALL_TRACE, ToolCallTrace

logger = logging.getLogger(__name__)


def unfinished_result(call: ToolCall, why: str) -> ToolResult:
    """The error result of a call that never returned (cancelled, interrupted, not run)."""
    return ToolResult(call, unanswered_call_result("", "", call, why).content, True)


async def execute_tool_calls(
    calls: Sequence[ToolCall],
    registry: ToolRegistry,
    *,
    offered: Collection[str],
    make_context: Callable[[ToolCall], ToolContext],
    timeout_s: float,
    max_parallel: int,
    completed: dict[str, ToolResult] | None = None,
    trace_call: Callable[[ToolCall], AbstractContextManager[ToolCallTrace]] | None = None,
    max_result_bytes: int | None = None,
    stop_on_error: Collection[str] = (),
) -> list[ToolResult]:
    """Run `calls` (at most `max_parallel` at once) and return their results in call order.

    `offered` are the tool names this run may call. A result over `max_result_bytes` is cut
    to it and asks the run to stop with TOOL_ERROR (`oversized`); so does an error result of
    a tool named in `stop_on_error` (`stopping_on_error`). The other calls run to their end
    either way: each gets its own result. Each result is also put in `completed` (by call
    id) as soon as it is ready, so a caller cancelled midway keeps the finished ones.
    `trace_call` traces each call from the moment it may run (its wait for a slot excluded).
    """
    limit = asyncio.Semaphore(max(1, max_parallel))
    done = completed if completed is not None else {}

    def untraced(call: ToolCall) -> AbstractContextManager[ToolCallTrace]:
        return nullcontext(NO_CALL_TRACE)

    trace = trace_call or untraced

    async def run_one(call: ToolCall) -> ToolResult:
        async with limit:
            started = time.perf_counter()
            with trace(call) as span:
                result = await execute_tool_call(
                    call, registry, offered=offered, context=make_context(call), timeout_s=timeout_s
                )
                if max_result_bytes is not None:
                    result = oversized(result, max_result_bytes)
                if result.is_error and result.stop is None and call.name in stop_on_error:
                    result = stopping_on_error(result)
                result = replace(result, duration_ms=_ms_since(started))
                span.finished(result)
        done[call.id] = result
        return result

    return list(await asyncio.gather(*(run_one(call) for call in calls)))


def oversized(result: ToolResult, max_bytes: int) -> ToolResult:
    """`result`, or when its content is over `max_bytes` (UTF-8), an error result cut to
    them that stops the run with TOOL_ERROR: the step stays readable and fits a message."""
    content = result.content
    size = len(content) if content.isascii() else len(content.encode())
    if size <= max_bytes:
        return result
    name = result.call.name
    message = f"tool {name!r} returned {size} bytes, over the step limit of {max_bytes}"
    note = f"\n[cut off: {message}]"
    kept = content.encode()[: max(0, max_bytes - len(note.encode()))].decode(errors="ignore")
    stop = StopSignal(
        StopReason.TOOL_ERROR,
        message,
        f"tool:{name}",
        context={"result_bytes": size, "max_step_bytes": max_bytes},
    )
    return replace(result, content=kept + note, is_error=True, stop=stop)


def stopping_on_error(result: ToolResult) -> ToolResult:
    """The error `result` of a tool configured `on_error: stop`, asking the run to stop with
    TOOL_ERROR. The signal names the tool and the call but never quotes the error text,
    which may quote the arguments (the result step and the TOOL_FAILED notice carry it)."""
    call = result.call
    stop = StopSignal(
        StopReason.TOOL_ERROR,
        f"tool {call.name!r} failed (call {call.id}) and its on_error is stop",
        f"tool:{call.name}",
        context={"tool_name": call.name, "tool_call_id": call.id},
    )
    return replace(result, stop=stop)


async def execute_tool_call(
    call: ToolCall,
    registry: ToolRegistry,
    *,
    offered: Collection[str],
    context: ToolContext,
    timeout_s: float,
) -> ToolResult:
    """Run one call; every failure becomes an error result."""
    tool = registry.get(call.name) if call.name in offered else None
    if tool is None:
        available = ", ".join(sorted(name for name in offered if name in registry)) or "(none)"
        return ToolResult(
            call, f"Error: unknown tool {call.name!r}. Available tools: {available}.", True
        )
    try:
        raw = json_codec.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError as error:
        return ToolResult(
            call,
            f"Error: the arguments of {call.name!r} are not valid JSON ({error}). "
            "Send the arguments as one JSON object.",
            True,
        )
    except ValueError:  # an integer of more digits than Python reads (4,300)
        return _unreadable(call, "hold a number too long to read", "with shorter numbers")
    except RecursionError:  # nested deeper than the parser goes: the model's to fix too
        return _unreadable(call, "nest too deeply to read", "of fewer levels")
    if not isinstance(raw, dict):
        return ToolResult(
            call, f"Error: the arguments of {call.name!r} must be a JSON object.", True
        )
    try:
        arguments = tool.validate(raw)
    except pydantic.ValidationError as error:
        return ToolResult(
            call, f"Error: invalid arguments for {call.name!r}: {_describe(error)}.", True
        )
    except ArgumentsError as error:
        return ToolResult(call, f"Error: invalid arguments for {call.name!r}: {error}.", True)
    except RecursionError:  # a schema checked level by level (an MCP server's, say)
        return _unreadable(call, "nest too deeply to read", "of fewer levels")
    if tool.timeout_s is not None:
        timeout_s = min(timeout_s, tool.timeout_s)
    started = time.perf_counter()
    stop: StopSignal | None = None
    try:
        async with asyncio.timeout(timeout_s):
            content = await tool.invoke(arguments, context)
        is_error = False
    except ToolStop as signal:
        content, is_error = signal.message, False
        stop = StopSignal(
            StopReason.TOOL_STOP, signal.message, f"tool:{call.name}", context=signal.context
        )
    except TimeoutError:
        content, is_error = f"Error: tool {call.name!r} timed out after {timeout_s:g}s.", True
    except ToolError as error:
        content, is_error = error.message, True
    except Exception as error:  # a tool's failure is a result the model sees
        # The message may quote the arguments: only its type at INFO, the traceback at DEBUG.
        logger.info("tool %s raised %s", call.name, type(error).__name__)
        logger.debug("tool %s raised", call.name, exc_info=True)
        content = f"Error: tool {call.name!r} failed: {type(error).__name__}: {error}"
        is_error = True
    elapsed = _ms_since(started)
    spent = context.usage if context.usage.total_tokens else None
    return ToolResult(
        call, clean_text(content), is_error, stop, elapsed, origin=tool.origin(), usage=spent
    )


def _ms_since(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def _unreadable(call: ToolCall, why: str, fix: str) -> ToolResult:
    """The error result of JSON arguments that parse as JSON but cannot be read here."""
    return ToolResult(
        call,
        f"Error: the arguments of {call.name!r} {why}. "
        f"Send the arguments as one JSON object {fix}.",
        True,
    )


def _describe(error: pydantic.ValidationError) -> str:
    parts = []
    for detail in error.errors(include_url=False):
        where = ".".join(str(part) for part in detail["loc"]) or "arguments"
        parts.append(f"{where}: {detail['msg']}")
    return "; ".join(parts)
