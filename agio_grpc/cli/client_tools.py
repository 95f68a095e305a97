"""Client tools from the terminal: their definitions from files, their outputs from
arguments or stdin.

A definition file holds one JSON object shaped as the proto's `ToolDefinition`: `name`,
`description` and the JSON schema of the arguments, as an object under `parameters` (or as
JSON text under `parameters_json`). Argument parsers here raise
`argparse.ArgumentTypeError`, so a bad file or argument is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from agio_grpc.v1 import agent_service_pb2, resources_pb2

_DEFINITION_KEYS = {"name", "description", "parameters", "parameters_json"}


def tool_definition_file(path: str) -> resources_pb2.ToolDefinition:
    """`--client-tool FILE`: the tool defined in FILE."""
    try:
        loaded: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {error.strerror}") from None
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{path} is not JSON: {error}") from None
    try:
        return _definition(loaded)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{path}: {error}") from None


def output_schema_file(path: str) -> str:
    """`--output-schema FILE`: the JSON Schema in FILE, as JSON text (the server checks it
    is a schema)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        json.loads(text)
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {error.strerror}") from None
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{path} is not JSON: {error}") from None
    return text


def _definition(loaded: Any) -> resources_pb2.ToolDefinition:
    if not isinstance(loaded, dict):
        raise ValueError("a tool definition is a JSON object")
    unknown = sorted(set(loaded) - _DEFINITION_KEYS)
    if unknown:
        raise ValueError(f"unknown fields {unknown}; expected {sorted(_DEFINITION_KEYS)}")
    name, description = loaded.get("name"), loaded.get("description", "")
    if not isinstance(name, str) or not name:
        raise ValueError("`name` must be a non-empty string")
    if not isinstance(description, str):
        raise ValueError("`description` must be a string")
    if "parameters" in loaded and "parameters_json" in loaded:
        raise ValueError("give `parameters` or `parameters_json`, not both")
    schema = loaded.get("parameters", {"type": "object"})
    if "parameters_json" in loaded:
        if not isinstance(loaded["parameters_json"], str):
            raise ValueError("`parameters_json` must be JSON text")
        schema = json.loads(loaded["parameters_json"])
    if not isinstance(schema, dict):
        raise ValueError("the parameters schema must be a JSON object")
    return resources_pb2.ToolDefinition(
        name=name, description=description, parameters_json=json.dumps(schema)
    )


def tool_output_argument(text: str) -> agent_service_pb2.ToolOutput:
    """`CALL_ID=OUTPUT`, or `CALL_ID=@FILE` for the output in FILE (read as is)."""
    call_id, equals, output = text.partition("=")
    if not equals or not call_id:
        raise argparse.ArgumentTypeError(f"expected CALL_ID=OUTPUT or CALL_ID=@FILE, got {text!r}")
    if output.startswith("@"):
        try:
            output = Path(output[1:]).read_text(encoding="utf-8")
        except OSError as error:
            raise argparse.ArgumentTypeError(
                f"cannot read {output[1:]}: {error.strerror}"
            ) from None
    return agent_service_pb2.ToolOutput(tool_call_id=call_id, output=output)


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A client tool call a REQUIRES_ACTION run waits for."""

    id: str
    name: str
    arguments: str


def pending_calls(run: resources_pb2.Run) -> list[PendingCall]:
    """The calls a waiting run lists in its stop signal's context (`tool_calls`)."""
    context = json_format.MessageToDict(run.stop_signal.context)
    calls = context.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [
        PendingCall(str(call.get("id", "")), str(call.get("name", "")), str(call.get("arguments")))
        for call in calls
        if isinstance(call, dict)
    ]


async def read_outputs(calls: list[PendingCall]) -> list[agent_service_pb2.ToolOutput] | None:
    """One line of stdin per call, in order: its output. On a terminal each call is shown
    with a prompt (on stderr). None when stdin ends first."""
    interactive = sys.stdin.isatty()
    outputs: list[agent_service_pb2.ToolOutput] = []
    for call in calls:
        if interactive:
            print(f"  ? {call.name}({call.arguments})  [{call.id}]", file=sys.stderr)
            print("  output> ", end="", file=sys.stderr, flush=True)
        line = await read_line()
        if not line:
            return None
        output = line.removesuffix("\n").removesuffix("\r")
        outputs.append(agent_service_pb2.ToolOutput(tool_call_id=call.id, output=output))
    return outputs


async def read_line() -> str:
    """A line of stdin ("" at its end), read on a thread of its own: a read that blocks the
    event loop would hold Ctrl-C up until the line came (asyncio only cancels the command's
    task, and the read would go on). The thread is a daemon, so a read still waiting does not
    keep the process alive after Ctrl-C."""
    loop = asyncio.get_running_loop()
    line: asyncio.Future[str] = loop.create_future()

    def settle(text: str, error: Exception | None) -> None:
        if line.done():
            return  # the command was cancelled meanwhile
        if error is not None:
            line.set_exception(error)
        else:
            line.set_result(text)

    def read() -> None:
        text, failure = "", None
        try:
            text = sys.stdin.readline()
        except Exception as error:  # e.g. input that is not text: the command says so
            failure = error
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, text, failure)

    threading.Thread(target=read, name="agio-grpc stdin", daemon=True).start()
    return await line
